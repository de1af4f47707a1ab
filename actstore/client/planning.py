"""Dry runs from the client: what a capture or a CKA matrix job would cost, answered by the
server without running it (`Client.plan_capture`, `Client.plan_cka_matrix`). The plans are the
server's own records (`actstore.records`), built here from their protos."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields

from actstore._proto.actstore.v1 import actstore_pb2 as pb
from actstore._proto.actstore.v1 import planning_pb2
from actstore.client.arguments import options
from actstore.options import CAPTURE
from actstore.records import CapturePlanInfo, CKAMatrixPlanInfo


def capture_request(model: str, dataset: str, pooling: str | None, dtype: str | None, max_len: int | None,
                    sites: list[str] | None, max_cka_error: float | None = None) -> pb.CaptureRequest:
    """The request of a capture, from arguments `@options(CAPTURE)` checked (`sites` parsed: a list of names)."""
    return pb.CaptureRequest(model=model, dataset=dataset, pooling=pooling or "", dtype=dtype or "",
                             max_len=max_len, sites=sites or [], max_cka_error=max_cka_error)


def capture_plan(p: planning_pb2.CapturePlan) -> CapturePlanInfo:
    """The plan of a capture, from its proto (the sites' run keys and stored flags as dicts)."""
    rest = {f.name: getattr(p, f.name) for f in fields(CapturePlanInfo) if f.name not in ("sites", "stored")}
    return CapturePlanInfo({s.site: s.run_key for s in p.sites}, {s.site: s.stored for s in p.sites}, **rest)


def cka_matrix_plan(p: planning_pb2.CKAMatrixPlan) -> CKAMatrixPlanInfo:
    """The plan of a CKA matrix job, from its proto."""
    values = {f.name: getattr(p, f.name) for f in fields(CKAMatrixPlanInfo)}
    return CKAMatrixPlanInfo(**{**values, "run_keys": list(p.run_keys)})


class PlanningMixin:
    """The dry-run methods of `Client` (its `_planning` stub)."""

    _planning: object

    @options(CAPTURE)
    def plan_capture(self, model: str, dataset: str, *, pooling: str | None = CAPTURE.pooling.default,
                     dtype: str | None = CAPTURE.dtype.default, max_len: int | None = CAPTURE.max_len.default,
                     site: Sequence[str] | str | None = None,
                     max_cka_error: float | None = CAPTURE.max_cka_error.default) -> CapturePlanInfo:
        """What `capture` with these arguments would store and take, checked like a submit (the
        layers a `max_cka_error` keeps exact are known only once captured: counted as int8)."""
        request = capture_request(model, dataset, pooling, dtype, max_len, site, max_cka_error)
        return capture_plan(self._planning.PlanCapture(request))

    def plan_cka_matrix(self, runs: Sequence[str]) -> CKAMatrixPlanInfo:
        """What `cka_matrix(runs)` would take: tiles, memory, FLOPs."""
        return cka_matrix_plan(self._planning.PlanCKAMatrix(pb.CKAMatrixRequest(runs=list(runs))))
