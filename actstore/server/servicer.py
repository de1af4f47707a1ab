"""Thin gRPC servicers: proto in, a call of the service part that owns the operation
(`service.PART.METHOD`, or the service's own method for what spans parts; `server/service.py`),
proto out. No logic lives here."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable

from actstore import measures
from actstore._proto.actstore.v1 import actstore_pb2 as pb
from actstore._proto.actstore.v1 import actstore_pb2_grpc as rpc
from actstore._proto.actstore.v1 import tokens_pb2, tokens_pb2_grpc
from actstore.errors import InvalidArgument
from actstore.metrics.rounding import FIGURES, completed
from actstore.options import (
    CAPTURE,
    DATASETS,
    ENTROPY,
    GC,
    LABELS,
    SIMILARITY,
    TRAIN,
    from_message,
    from_wire,
    given_in_message,
)
from actstore.server.interceptors import current_principal, current_role
from actstore.server.jobs import JobSnapshot
from actstore.server.replies import KeptReplies
from actstore.server.requests import MetricCall, options_from_json
from actstore.server.service import ActStoreService, CaptureRequest, DatasetSource, LabelsSource, TrainRequest
from actstore.store.catalog import DatasetRecord, LabelSetRecord, ModelRecord, RunRecord
from actstore.store.keys import site_of
from actstore.wire import to_ndarray

_EVENT_KIND = {"done": pb.JobEvent.DONE, "failed": pb.JobEvent.FAILED, "cancelled": pb.JobEvent.CANCELLED,
               "interrupted": pb.JobEvent.FAILED}


def enum_name(enum_type, value: int, what: str) -> str:
    """The lower-case name of a proto enum value; an unknown number is the caller's mistake."""
    try:
        return enum_type.Name(value).lower()
    except ValueError:
        raise InvalidArgument(f"unknown {what} {value}: use one of {', '.join(enum_type.keys()[1:])}") from None


def model_proto(m: ModelRecord) -> pb.Model:
    return pb.Model(digest=m.digest, aliases=m.aliases, kind=m.kind, arch=m.arch, num_layers=m.num_layers,
                    hidden_size=m.hidden_size, has_head=m.has_head, lineage_json=json.dumps(m.lineage))


def dataset_proto(d: DatasetRecord) -> pb.Dataset:
    return pb.Dataset(digest=d.digest, aliases=d.aliases, kind=d.kind, n=d.n, num_labels=d.num_labels,
                      has_groups=d.has_groups, source_json=json.dumps(d.source))


def label_set_proto(r: LabelSetRecord) -> pb.LabelSet:
    return pb.LabelSet(digest=r.digest, dataset_digest=r.dataset_digest, name=r.name, kind=r.kind, classes=r.classes,
                       labelled=r.labelled, samples=r.samples, source_json=json.dumps(r.source))


def labels_source(request: pb.RegisterLabelsRequest) -> LabelsSource:
    """A RegisterLabels request's source: a server path, or ids with their values (strings or numbers)."""
    which = request.WhichOneof("source")
    columns = {"id_column": from_wire(LABELS, "id_column", request.id_column),
               "label_column": from_wire(LABELS, "label_column", request.label_column),
               "kind": from_wire(LABELS, "kind", request.kind)}
    if which != "inline":
        return LabelsSource(path=request.path or None, **columns)
    inline = request.inline
    if inline.values and inline.numbers:
        raise InvalidArgument("inline labels come as strings (values) or as numbers, not both")
    return LabelsSource(sample_ids=list(inline.sample_ids), values=list(inline.values or inline.numbers), **columns)


def rounding_proto(figures: dict | None, dtype: str) -> list[pb.LayerRounding]:
    """A lossy run's error figures (`metrics.rounding.FIGURES`, one value per layer each), one message a layer
    (a run captured before the statistical bound: its angles in the bound fields, as its answers use them)."""
    if not figures:
        return []
    figures = completed(figures)
    exact = figures.get("exact") or [0.0] * len(figures["rows"])  # layers a max_cka_error kept exact
    return [pb.LayerRounding(layer=layer, stored="float32" if exact[layer] else dtype, rows=int(figures["rows"][layer]),
                             **{name: float(figures[name][layer]) for name in FIGURES if name != "rows"})
            for layer in range(len(figures["rows"]))]


def run_proto(r: RunRecord, recorded_shards: int) -> pb.Run:
    return pb.Run(run_key=r.run_key, model_digest=r.model_digest, dataset_digest=r.dataset_digest,
                  pooling=r.pooling, dtype=r.dtype, max_len=r.max_len, n=r.n, rows=r.rows,
                  num_layers=r.num_layers, width=r.width, status=r.status, num_shards=r.num_shards,
                  max_cka_error=(r.spec or {}).get("max_cka_error") or 0.0,
                  recorded_shards=recorded_shards, site=site_of(r.spec), site_modules=r.spec.get("modules", ""))


def job_proto(s: JobSnapshot) -> pb.Job:
    return pb.Job(job_id=s.job_id, kind=s.kind, status=s.status, target=s.target, done=s.done, total=s.total,
                  error=s.error, error_code=s.error_code, cache_hit=s.cache_hit, joined=s.joined, unit=s.unit,
                  run_keys=s.run_keys, sites=s.sites)


def capture_request(request: pb.CaptureRequest) -> CaptureRequest:
    """The one reading of a capture's (or its dry run's) options: the CAPTURE table checks each and
    parses the sites (an empty list: the default); `CaptureJobs.target` decides the rest."""
    return CaptureRequest(model=request.model, dataset=request.dataset,
                          pooling=from_wire(CAPTURE, "pooling", request.pooling),
                          dtype=from_wire(CAPTURE, "dtype", request.dtype),
                          max_len=from_message(CAPTURE, "max_len", request),
                          max_cka_error=from_message(CAPTURE, "max_cka_error", request),
                          sites=tuple(from_wire(CAPTURE, "site", list(request.sites)) or CAPTURE.site.default))


class CatalogServicer(rpc.CatalogServicer):
    def __init__(self, service: ActStoreService) -> None:
        self.service = service

    def ListModels(self, request, context):
        return pb.ListModelsResponse(models=[model_proto(m) for m in self.service.models()])

    def ListDatasets(self, request, context):
        return pb.ListDatasetsResponse(datasets=[dataset_proto(d) for d in self.service.datasets()])

    def ListRuns(self, request, context):
        runs = self.service.runs(request.model, request.dataset, request.status, request.site)
        return pb.ListRunsResponse(runs=[run_proto(r, self.service.recorded_shards(r)) for r in runs])

    def DescribeRun(self, request, context):
        described = self.service.describe_run(request.run)
        record, health = described.record, described.health
        run = run_proto(record, health.recorded_shards)
        run.stored_bytes = described.stored_bytes
        run.model_aliases.extend(described.model_aliases)
        run.dataset_aliases.extend(described.dataset_aliases)
        stats = described.stats or {}
        for layer in range(record.num_layers + 1):
            run.health.append(pb.LayerHealth(layer=layer, nan_count=int(health.nan_count[layer]),
                                             inf_count=int(health.inf_count[layer]),
                                             min=float(health.min[layer]), max=float(health.max[layer]),
                                             has_stats=bool(stats),
                                             **{k: float(v[layer]) for k, v in stats.items()}))
        run.rounding.extend(rounding_proto(described.rounding, record.dtype))
        return run

    def RegisterModel(self, request, context):
        source = request.WhichOneof("source")
        return model_proto(self.service.registrar.register_model(
            path=request.path if source == "path" else None,
            builtin=request.builtin if source == "builtin" else None, name=request.name or None))

    def RegisterDataset(self, request, context):
        which = request.WhichOneof("source")
        texts = request.texts if which == "texts" else None
        source = DatasetSource(
            path=request.path if which == "path" else None,
            builtin=request.builtin if which == "builtin" else None,
            texts=list(texts.texts) if texts is not None else None,
            labels=list(texts.labels) if texts is not None else None,
            sample_ids=list(texts.sample_ids) if texts is not None else None,
            label_names=list(texts.label_names) if texts is not None else None,
            limit=from_message(DATASETS, "limit", request), seed=from_wire(DATASETS, "seed", request.seed),
            split=request.split or None, text_column=from_wire(DATASETS, "text_column", request.text_column),
            label_column=request.label_column or None, id_column=request.id_column or None,
            group_column=request.group_column or None,
            augment_views=from_wire(DATASETS, "augment_views", request.augment_views, self.service.settings),
            augment_method=from_wire(DATASETS, "augment_method", request.augment_method),
        )
        return dataset_proto(self.service.registrar.register_dataset(source, request.name or None))

    def DeleteRun(self, request, context):
        return pb.DeleteRunResponse(run_key=self.service.delete_run(request.run))

    def RegisterLabels(self, request, context):
        return label_set_proto(self.service.registrar.register_labels(request.dataset, labels_source(request),
                                                                      request.name or None))

    def ListLabelSets(self, request, context):
        found = self.service.label_sets(request.dataset)
        return pb.ListLabelSetsResponse(label_sets=[label_set_proto(r) for r in found])


class CaptureServicer(rpc.CaptureServicer):
    def __init__(self, service: ActStoreService) -> None:
        self.service = service

    def SubmitCapture(self, request, context):
        return job_proto(self.service.captures.submit(capture_request(request), principal=current_principal.get()))

    def WatchJob(self, request, context):
        for snapshot in self.service.jobs.follow(request.job_id):
            if not context.is_active():
                return
            kind = _EVENT_KIND.get(snapshot.status, pb.JobEvent.PROGRESS)
            yield pb.JobEvent(kind=kind, job=job_proto(snapshot), message=snapshot.message)

    def CancelJob(self, request, context):
        return job_proto(self.service.jobs.cancel(request.job_id, current_principal.get(), current_role.get()))

    def GetJob(self, request, context):
        return job_proto(self.service.jobs.snapshot(request.job_id))

    def SubmitTrain(self, request, context):
        return job_proto(self.service.training.submit(
            TrainRequest(recipe=request.recipe, method=from_wire(TRAIN, "method", request.method) or "",
                         seed=from_wire(TRAIN, "seed", request.seed),
                         steps=from_message(TRAIN, "steps", request) or 0, smoke=request.smoke,
                         alternating=request.alternating, weights=from_wire(TRAIN, "weights", request.weights),
                         beta=from_message(TRAIN, "beta", request)),
            principal=current_principal.get()))

    def ListJobs(self, request, context):
        return pb.ListJobsResponse(jobs=[job_proto(s) for s in self.service.jobs.list(request.status or None)])


class QueryServicer(rpc.QueryServicer):
    def __init__(self, service: ActStoreService) -> None:
        self.service = service

    @functools.cached_property
    def _replies(self) -> KeptReplies:
        # made on the first answer: the settings bound it
        queries = self.service.queries
        return KeptReplies(self.service.settings.result_messages_kept, queries.current_generation, queries.is_current,
                           self.service.names)

    # Every query RPC becomes one MetricCall (server/requests.py), which the query engine resolves
    # into its family's typed query and the family's planner answers (`QueryEngine.answer`): the
    # generic Measure RPC for any registered metric; the older RPCs from their fields, the options a
    # metric does not use not read (as they always were).
    def Similarity(self, request, context):
        return self._replies.answer("Similarity", request, lambda: self.service.queries.answer(
            self._similarity_call(request), request.require_bound))

    @staticmethod
    def _similarity_call(request) -> MetricCall:
        metric = enum_name(pb.SimilarityRequest.Metric, request.metric, "similarity metric")
        layers = (tuple(request.layers_a), tuple(request.layers_b))
        if metric != "measure":
            given = given_in_message(request, ("center", "batch_size", "remainder", "k", "align", "word_pool"))
            return MetricCall(measures.get(metric, query="similarity"), request.run_a, request.run_b, *layers, given,
                              request.refresh)
        # the legacy form of Measure: the message carries every measure's options, read where taken
        if not request.measure:
            raise InvalidArgument(f"name the measure: one of {', '.join(m.identifier for m in measures.measures())}")
        spec = measures.get(request.measure, query="measure")
        legacy = {name: from_message(SIMILARITY, name, request) for name in ("alpha", "sigma_fraction", "k")}
        return MetricCall(spec, request.run_a, request.run_b, *layers, spec.taken(legacy), request.refresh)

    def Measure(self, request, context):
        return self._replies.answer("Measure", request, lambda: self.service.queries.answer(
            MetricCall.of_request(request), request.require_bound))

    def _answer(self, method: str, request, spec: measures.Measure, run_a: str, layers_a=(), run_b: str = "",
                layers_b=(), options: Iterable[str] | None = None):
        """The reply of an older query RPC: kept, or `spec`'s answer to the call its fields make
        (`options`: the fields read as options; None: the spec's own)."""
        names = [option.name for option in spec.options] if options is None else options
        return self._replies.answer(method, request, lambda: self.service.queries.answer(MetricCall(
            spec, run_a, run_b, tuple(layers_a), tuple(layers_b), given_in_message(request, names), request.refresh)))

    def Entropy(self, request, context):
        spec = measures.get(enum_name(pb.EntropyRequest.Metric, request.metric, "entropy metric"), query="entropy")
        # every field is read and checked, those of options this metric does not use too (as always)
        return self._answer("Entropy", request, spec, request.run, request.layers,
                            options=[name for name in ENTROPY if name != "metric"])

    def ResidualNorm(self, request, context):
        return self._answer("ResidualNorm", request, measures.get("residual_norm"), request.run, request.layers)

    def Stitch(self, request, context):
        return self._answer("Stitch", request, measures.get("stitch"), request.run_a, [request.layer_a],
                            request.run_b, [request.layer_b])

    def SubmitCKAMatrix(self, request, context):
        strict = bool(request.options_json)  # the measure's own options, or the legacy alpha field
        options = options_from_json(request.options_json) if strict else (
            {"alpha": from_message(SIMILARITY, "alpha", request)} if request.measure else {})
        return job_proto(self.service.submit_cka_matrix(list(request.runs), request.refresh,
                                                        principal=current_principal.get(), measure=request.measure,
                                                        options=options, strict=strict))

    def Lens(self, request, context):
        return self._answer("Lens", request, measures.get("lens"), request.run)

    def NeuralCollapse(self, request, context):
        return self._answer("NeuralCollapse", request, measures.get("nc1"), request.run, request.layers)

    def GetResult(self, request, context):
        return self._replies.answer("GetResult", request, lambda: self.service.queries.result(request.result_key))

    def ReadActivations(self, request, context):
        for start, values, ids in self.service.readers.read_activations(request.run, request.layer, request.start,
                                                                        request.stop):
            yield pb.ActivationChunk(start=start, values=to_ndarray(values), sample_ids=ids)


class TokensServicer(tokens_pb2_grpc.TokensServicer):
    def __init__(self, service: ActStoreService) -> None:
        self.service = service

    def CreateToken(self, request, context):
        token = self.service.create_token(request.name, request.role)
        return tokens_pb2.CreatedToken(name=request.name, role=request.role, token=token)

    def ListTokens(self, request, context):
        return tokens_pb2.ListTokensResponse(principals=[tokens_pb2.Principal(name=name, role=role)
                                                         for name, role in self.service.tokens()])

    def RevokeToken(self, request, context):
        self.service.revoke_token(request.name)
        return tokens_pb2.RevokeTokenResponse(name=request.name)


def verify_report_proto(report: dict) -> pb.VerifyReport:
    return pb.VerifyReport(job_id=report["job_id"], repair=report["repair"], runs=[
        pb.RunVerdict(**{**run, "damage": [pb.Damage(**d) for d in run["damage"]]}) for run in report["runs"]])


class IntegrityServicer(rpc.IntegrityServicer):
    def __init__(self, service: ActStoreService) -> None:
        self.service = service

    def SubmitVerify(self, request, context):
        return job_proto(self.service.verifies.submit(list(request.runs), request.all, repair=False,
                                                      principal=current_principal.get()))

    def SubmitRepair(self, request, context):
        return job_proto(self.service.verifies.submit(list(request.runs), request.all, repair=True,
                                                      principal=current_principal.get()))

    def GetVerifyReport(self, request, context):
        return verify_report_proto(self.service.verifies.report(request.job_id))


class HousekeepingServicer(rpc.HousekeepingServicer):
    def __init__(self, service: ActStoreService) -> None:
        self.service = service

    def BackupCatalog(self, request, context):
        made, kept = self.service.backup_catalog()
        return pb.BackupCatalogResponse(path=str(made), bytes=made.stat().st_size, kept=[str(p) for p in kept])

    def CollectGarbage(self, request, context):
        report = self.service.collect_garbage(from_wire(GC, "older_than", request.older_than),
                                              from_message(GC, "max_bytes", request), request.apply)
        return pb.CollectGarbageResponse(
            items=[pb.Garbage(kind=g.kind, name=g.name, bytes=g.bytes, reason=g.reason) for g in report.items],
            applied=report.applied, total_bytes=report.total_bytes, kept=report.kept)
