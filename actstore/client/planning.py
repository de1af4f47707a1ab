"""Dry runs from the client: what a capture or a CKA matrix job would cost, answered by the
server without running it (`Client.plan_capture`, `Client.plan_cka_matrix`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

from actstore._proto.actstore.v1 import actstore_pb2 as pb
from actstore._proto.actstore.v1 import planning_pb2
from actstore.client.arguments import options
from actstore.options import CAPTURE


def capture_request(model: str, dataset: str, pooling: str | None, dtype: str | None, max_len: int | None,
                    site: Sequence[str] | str | None) -> pb.CaptureRequest:
    """The request of a capture; `site` is one site, a list, or a comma-separated string."""
    sites = [site] if isinstance(site, str) else list(site or [])
    return pb.CaptureRequest(model=model, dataset=dataset, pooling=pooling or "", dtype=dtype or "",
                             max_len=max_len, sites=[s for each in sites for s in each.split(",")])


@dataclass(frozen=True)
class CapturePlanInfo:
    """A capture's cost: per run (each site is one run) its rows and shards; for the runs still to
    capture, the raw and estimated stored bytes and the estimated wall time (0: no basis yet)."""

    sites: dict[str, str]  # site -> run key
    stored: dict[str, bool]  # site -> already committed (nothing to compute)
    n: int
    rows: int
    num_shards: int
    num_layers: int
    width: int
    dtype: str
    pooling: str
    max_len: int
    raw_bytes: int
    stored_bytes: int
    compression: float
    compression_basis: str
    seconds: float
    seconds_basis: str

    @staticmethod
    def from_proto(p: planning_pb2.CapturePlan) -> CapturePlanInfo:
        rest = {f.name: getattr(p, f.name) for f in fields(CapturePlanInfo) if f.name not in ("sites", "stored")}
        return CapturePlanInfo({s.site: s.run_key for s in p.sites}, {s.site: s.stored for s in p.sites}, **rest)


@dataclass(frozen=True)
class CKAMatrixPlanInfo:
    """A CKA matrix job's plan: feature or Gram space, the tiles and map tasks, the peak accumulator
    memory of the largest tile against the server's limit, FLOPs, decoded bytes read."""

    run_keys: list[str]
    blocks: int
    rows: int
    mode: str
    tiles: int
    map_tasks: int
    memory_bytes: int
    memory_limit_bytes: int
    flops: float
    read_bytes: int
    cached: bool

    @staticmethod
    def from_proto(p: planning_pb2.CKAMatrixPlan) -> CKAMatrixPlanInfo:
        values = {f.name: getattr(p, f.name) for f in fields(CKAMatrixPlanInfo)}
        return CKAMatrixPlanInfo(**{**values, "run_keys": list(p.run_keys)})


class PlanningMixin:
    """The dry-run methods of `Client` (its `_planning` stub)."""

    _planning: object

    @options(CAPTURE)
    def plan_capture(self, model: str, dataset: str, *, pooling: str | None = CAPTURE.pooling.default,
                     dtype: str | None = CAPTURE.dtype.default, max_len: int | None = CAPTURE.max_len.default,
                     site: Sequence[str] | str | None = None) -> CapturePlanInfo:
        """What `capture` with these arguments would store and take, checked like a submit."""
        request = capture_request(model, dataset, pooling, dtype, max_len, site)
        return CapturePlanInfo.from_proto(self._planning.PlanCapture(request))

    def plan_cka_matrix(self, runs: Sequence[str]) -> CKAMatrixPlanInfo:
        """What `cka_matrix(runs)` would take: tiles, memory, FLOPs."""
        return CKAMatrixPlanInfo.from_proto(self._planning.PlanCKAMatrix(pb.CKAMatrixRequest(runs=list(runs))))
