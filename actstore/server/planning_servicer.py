"""Thin gRPC servicer of the dry runs (planning.proto): proto in, `ActStoreService.plan_*`, proto out."""

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
        plan = asdict(self.service.plan_capture(capture_request(request)))
        sites = [pb.SitePlan(site=site, run_key=key, stored=stored) for site, key, stored in plan.pop("sites")]
        return pb.CapturePlan(sites=sites, **plan)

    def PlanCKAMatrix(self, request, context):
        return pb.CKAMatrixPlan(**asdict(self.service.plan_cka_matrix(list(request.runs))))
