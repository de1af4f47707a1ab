"""Dry runs from the client: the requests and plans of what a capture or a CKA matrix job would
cost, answered by the server without running it (`Captures.plan_capture`, `Queries.plan_cka_matrix`).
The plans are the server's own records (`actstore.records`), built here from their protos."""

from __future__ import annotations

from dataclasses import fields

from actstore._proto.actstore.v1 import actstore_pb2 as pb
from actstore._proto.actstore.v1 import planning_pb2
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
