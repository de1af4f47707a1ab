"""Thin gRPC servicer of the dry runs (planning.proto): proto in, `CostPlanner` (`service.costs`), proto out."""

from __future__ import annotations

from dataclasses import asdict

from actstore._proto.actstore.v1 import planning_pb2 as pb
from actstore._proto.actstore.v1 import planning_pb2_grpc as rpc
from actstore.server.service import ActStoreService
from actstore.server.servicer import capture_request


class PlanningServicer(rpc.PlanningServicer):
    def __init__(self, service: ActStoreService) -> None:
        self.service = service

    def PlanCapture(self, request, context):
        plan = asdict(self.service.costs.capture(capture_request(request)))
        stored = plan.pop("stored")
        sites = [pb.SitePlan(site=site, run_key=key, stored=stored[site]) for site, key in plan.pop("sites").items()]
        return pb.CapturePlan(sites=sites, **plan)

    def PlanCKAMatrix(self, request, context):
        return pb.CKAMatrixPlan(**asdict(self.service.costs.cka_matrix(list(request.runs))))
