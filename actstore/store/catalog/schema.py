"""What the catalog holds: its tables (DDL), the Arrow schema of chunk rows, and one frozen record
type per kind of row. `store.catalog` reads and writes them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from actstore.records import RunSummary

SCHEMA = """
CREATE TABLE IF NOT EXISTS models (
    digest VARCHAR PRIMARY KEY, kind VARCHAR, arch VARCHAR, num_layers INTEGER,
    hidden_size INTEGER, max_positions INTEGER, path VARCHAR, has_head BOOLEAN, lineage JSON,
    created_at TIMESTAMP DEFAULT current_timestamp);
CREATE TABLE IF NOT EXISTS model_aliases (
    alias VARCHAR PRIMARY KEY, digest VARCHAR, updated_at TIMESTAMP DEFAULT current_timestamp);
CREATE TABLE IF NOT EXISTS datasets (
    digest VARCHAR PRIMARY KEY, kind VARCHAR, n BIGINT, num_labels INTEGER, has_groups BOOLEAN,
    path VARCHAR, source JSON, created_at TIMESTAMP DEFAULT current_timestamp);
CREATE TABLE IF NOT EXISTS dataset_aliases (
    alias VARCHAR PRIMARY KEY, digest VARCHAR, updated_at TIMESTAMP DEFAULT current_timestamp);
CREATE TABLE IF NOT EXISTS runs (
    run_key VARCHAR PRIMARY KEY, model_digest VARCHAR, dataset_digest VARCHAR, pooling VARCHAR,
    dtype VARCHAR, max_len INTEGER, n BIGINT, rows BIGINT, num_layers INTEGER, width INTEGER,
    num_shards INTEGER, status VARCHAR, spec JSON,
    created_at TIMESTAMP DEFAULT current_timestamp, committed_at TIMESTAMP);
CREATE TABLE IF NOT EXISTS chunks (
    run_key VARCHAR, shard INTEGER, layer INTEGER, rows INTEGER, checksum UBIGINT,
    min DOUBLE, max DOUBLE, nan_count BIGINT, inf_count BIGINT,
    PRIMARY KEY (run_key, shard, layer));
CREATE TABLE IF NOT EXISTS results (
    result_key VARCHAR PRIMARY KEY, metric VARCHAR, version INTEGER, options JSON,
    run_keys JSON, payload BLOB, seconds DOUBLE, created_at TIMESTAMP DEFAULT current_timestamp);
CREATE TABLE IF NOT EXISTS jobs (
    job_id VARCHAR PRIMARY KEY, kind VARCHAR, target VARCHAR, status VARCHAR, request JSON,
    done BIGINT, total BIGINT, error VARCHAR, principal VARCHAR,
    created_at TIMESTAMP DEFAULT current_timestamp, updated_at TIMESTAMP DEFAULT current_timestamp);
CREATE TABLE IF NOT EXISTS principals (
    token_hash VARCHAR PRIMARY KEY, name VARCHAR UNIQUE, role VARCHAR,
    created_at TIMESTAMP DEFAULT current_timestamp);
CREATE TABLE IF NOT EXISTS label_sets (
    dataset_digest VARCHAR, name VARCHAR, digest VARCHAR, kind VARCHAR, classes JSON, labelled BIGINT,
    samples BIGINT, path VARCHAR, source JSON, created_at TIMESTAMP DEFAULT current_timestamp,
    PRIMARY KEY (dataset_digest, name));
CREATE TABLE IF NOT EXISTS audit (
    ts TIMESTAMP DEFAULT current_timestamp, principal VARCHAR, method VARCHAR, target VARCHAR,
    status VARCHAR);
"""

CHUNK_SCHEMA = pa.schema(
    [
        ("run_key", pa.string()),
        ("shard", pa.int32()),
        ("layer", pa.int32()),
        ("rows", pa.int32()),
        ("checksum", pa.uint64()),
        ("min", pa.float64()),
        ("max", pa.float64()),
        ("nan_count", pa.int64()),
        ("inf_count", pa.int64()),
    ]
)


@dataclass(frozen=True)
class ModelRecord:
    digest: str
    kind: str
    arch: str
    num_layers: int
    hidden_size: int
    max_positions: int | None
    path: str
    has_head: bool
    lineage: dict[str, Any]
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class DatasetRecord:
    digest: str
    kind: str
    n: int
    num_labels: int
    has_groups: bool
    path: str
    source: dict[str, Any]
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class LabelSetRecord:
    """A label set registered against a dataset under a name (`store.datasets.labels`)."""

    dataset_digest: str
    name: str
    digest: str
    kind: str  # categorical | continuous
    classes: tuple[str, ...]  # categorical: the class names, in code order; continuous: ()
    labelled: int
    samples: int
    path: str
    source: dict[str, Any]


@dataclass(frozen=True)
class RunRecord(RunSummary):
    """A run's row: its summary and the capture spec it was made by (what a rebuild reads back)."""

    spec: dict[str, Any]


@dataclass
class ChunkHealth:
    """Per-layer totals of a run's chunk metadata."""

    recorded_shards: int
    nan_count: np.ndarray
    inf_count: np.ndarray
    min: np.ndarray
    max: np.ndarray


@dataclass
class JobRecord:
    job_id: str
    kind: str
    target: str
    status: str
    request: dict[str, Any]
    done: int
    total: int
    error: str | None
    principal: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
