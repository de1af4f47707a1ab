"""The Diagnostics servicer (proto/actstore/v1/diagnostics.proto): thin, as every servicer is.
Options are resolved through `options.UNCERTAINTY` (the server's limits cap replicates and
permutations); the work is the diagnostics planner's."""

from __future__ import annotations

from actstore._proto.actstore.v1 import actstore_pb2 as pb
from actstore._proto.actstore.v1 import diagnostics_pb2_grpc as rpc
from actstore.options import SIMILARITY, UNCERTAINTY, from_message, from_wire
from actstore.server.planners.diagnostics import StatsOptions
from actstore.server.replies import result_proto
from actstore.server.servicer import enum_name


class DiagnosticsServicer(rpc.DiagnosticsServicer):
    def __init__(self, service) -> None:
        self.service = service

    def SimilarityStats(self, request, context):
        query, features = request.query, request.features
        limits = self.service.settings
        metric = enum_name(pb.SimilarityRequest.Metric, query.metric, "similarity metric")
        center = from_wire(SIMILARITY, "center", query.center) if metric == "cos" else query.center
        options = StatsOptions(
            bootstrap=from_wire(UNCERTAINTY, "bootstrap", request.bootstrap, limits),
            ci=from_message(UNCERTAINTY, "ci", request),
            seed=from_wire(UNCERTAINTY, "seed", request.seed),
            null=from_wire(UNCERTAINTY, "null", request.null_permutations, limits),
            standardize=features.standardize,
            exclude_dims=from_wire(UNCERTAINTY, "exclude_dims", list(features.exclude_dims)) or [],
            exclude_outliers=features.exclude_outliers,
            outlier_sigmas=from_message(UNCERTAINTY, "outlier_sigmas", features),
            bootstrap_method=from_wire(UNCERTAINTY, "bootstrap_method", request.bootstrap_method),
            bootstrap_groups=from_message(UNCERTAINTY, "bootstrap_groups", request))
        return result_proto(self.service.diagnostics.similarity_stats(
            metric, query.run_a, query.run_b, list(query.layers_a), list(query.layers_b), center, query.refresh,
            options), self.service.names)

    def Outliers(self, request, context):
        return result_proto(self.service.diagnostics.outliers(
            request.run, list(request.layers), from_message(UNCERTAINTY, "top_k", request),
            from_message(UNCERTAINTY, "outlier_sigmas", request), request.refresh), self.service.names)
