"""The records the server and the client both describe, defined once.

The server builds these (a metric answer's provenance, a dry run's plan, a scrub's finding, a
garbage collection's item) and the thin client builds the same classes back from the protos, so
the fields a user reads on a client object are the fields the server filled in. Plain frozen
dataclasses, importing nothing of actstore's nor anything heavy (numpy only for type checking):
the client imports this module without torch, Ray, Zarr or DuckDB.

A stored run's own fields are `RunSummary`, which the catalog's row (`store.catalog.schema.RunRecord`,
with the capture spec) and the client's `RunInfo` (with aliases, health and sizes) both extend.
Not here, on purpose: the rest of the catalog's rows (a model's record holds server paths, the
client's `ModelInfo` aliases) and a job's state (`server.jobs.JobSnapshot` keeps who submitted it, which the wire
does not carry, so the client's `JobInfo` is its own record).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class RunSummary:
    """What a stored run is, as the catalog records it and the client lists it: its key, the
    model and dataset it was captured from (by digest), how it was pooled and stored, its
    size (samples ``n``, ``rows`` after pooling, layers and width) and its shards' state."""

    run_key: str
    model_digest: str
    dataset_digest: str
    pooling: str
    dtype: str
    max_len: int
    n: int
    rows: int
    num_layers: int
    width: int
    num_shards: int
    status: str  # running | committed | failed

@dataclass(frozen=True)
class RunName:
    """A run as a person knows it: its model's and dataset's names (an alias each; empty where
    there is none), its pooling and capture site."""

    run_key: str
    model: str = ""
    dataset: str = ""
    pooling: str = ""
    site: str = ""

    @property
    def label(self) -> str:
        """`model / dataset`, or the run key's first 12 characters where the names are unknown."""
        if not (self.model or self.dataset):
            return self.run_key[:12]
        return f"{self.model or self.run_key[:12]} / {self.dataset or '?'}"


@dataclass(frozen=True)
class Provenance:
    """Where a metric answer comes from: the metric and its definition version, the options and
    input runs it was asked for, whether it came from the result cache, and its result key.
    `run_names`: the runs by name, as the server's catalog names them when it replies (the server's
    own records leave it empty: it is not part of the stored result). `error_bound`: None where
    every input run is stored exactly; over a lossy (int8) run, the largest bound on how far an
    entry of the answer is from the exact values' answer (linear CKA), or NaN: not bounded."""

    metric: str
    definition_version: int
    options: dict[str, Any]
    run_keys: list[str]
    cached: bool
    seconds: float
    result_key: str
    run_names: list[RunName] = field(default_factory=list)
    error_bound: float | None = None

    def run_name(self, index: int) -> RunName:
        """The name of run_keys[index] (only its key where the reply carried no names)."""
        if index < len(self.run_names):
            return self.run_names[index]
        return RunName(self.run_keys[index])


@dataclass(frozen=True)
class MetricAnswer:
    """Any metric's answer: named arrays and scalars, with provenance and notes. The server's
    `MetricResult` adds its storage encoding, the client's `QueryAnswer` its decoding from the wire."""

    arrays: dict[str, np.ndarray]
    scalars: dict[str, float]
    provenance: Provenance
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CapturePlanInfo:
    """A capture's cost: per run (each site is one run) its rows and shards; for the runs still to
    capture, the raw and estimated stored bytes and the estimated wall time (0: no basis yet)."""

    sites: dict[str, str]  # site -> run key, in the order of the request's sites
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


@dataclass(frozen=True)
class Damage:
    """One finding of a scrub (`actstore verify`): what is damaged, where, and why."""

    array: str  # acts | tokens | layer_sums | token_ids | means | sample_ids | ... | catalog | group | run
    shard: int  # -1: the whole array
    layer: int  # -1: every layer, or not per layer
    reason: str


@dataclass(frozen=True)
class GarbageItem:
    """One thing `actstore gc` removes (or would): its kind, name, bytes, and why it goes."""

    kind: str  # result | partials | orphaned-run | failed-run
    name: str  # the result key, the partials' result key, or the run key
    bytes: int
    reason: str
