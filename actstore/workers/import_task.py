"""Import, run as Ray tasks on the node whose disk holds the files: ``inspect_source`` opens the
source once (checks, sample ids, the digest of the files for the run key), then ``import_shard``
writes one whole shard, through the same ``store_shard`` a capture's shards take.

Pooled runs: shard k holds samples [k*S, (k+1)*S), pooled here from a per-token source. Token-level
runs: shard k holds token rows [k*S, (k+1)*S) of every sample's tokens one after another
(``offsets``, stored with the run); the samples straddling a boundary are read by both shards.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from actstore.errors import InvalidArgument
from actstore.metrics.rounding import ErrorFigures
from actstore.store.array_store import RunLayout
from actstore.store.datasets import load_dataset
from actstore.store.format.quantised import is_one_byte
from actstore.store.handle import StoreHandle
from actstore.workers.capture import ShardsWritten, store_shard
from actstore.workers.importers import FLOAT_DTYPES, ImportSource, open_source, pool_blocks


@dataclass(frozen=True)
class SourceSummary:
    """What the job needs to know of a source before it opens the run."""

    format: str
    n: int
    num_states: int
    width: int
    dtype: str  # the source's float dtype
    default_storage: str  # the storage dtype that keeps it (float64 -> float32)
    token_counts: np.ndarray | None  # per sample, for a source holding every token
    digest: str
    description: str


@dataclass(frozen=True)
class ImportPlan:
    run_key: str
    path: str
    format: str
    dataset_path: str
    pooling: str
    layout: RunLayout


def _open(store: StoreHandle, path: str, fmt: str | None, dataset_path: str) -> tuple[ImportSource, list[str]]:
    ids = load_dataset(store.local(dataset_path)).sample_ids
    return open_source(Path(path), fmt, ids), ids


def inspect_source(store: StoreHandle, path: str, fmt: str | None, dataset_path: str) -> SourceSummary:
    """Open the source, check its rows against the dataset (count and, where it names them, the
    sample ids in order) and digest the files it reads."""
    source, ids = _open(store, path, fmt, dataset_path)
    where = source.describe()
    if source.n != len(ids):
        raise InvalidArgument(f"{where} holds {source.n} samples but the dataset has {len(ids)}: import the "
                              "activations of exactly the dataset's samples, in its order")
    if source.sample_ids is not None and source.sample_ids != ids:
        if len(source.sample_ids) != len(ids):
            raise InvalidArgument(f"{where}: its sample ids list {len(source.sample_ids)} ids for {len(ids)} samples")
        i = next(i for i, (a, b) in enumerate(zip(source.sample_ids, ids)) if a != b)
        raise InvalidArgument(f"{where}: sample ids differ from the dataset's at row {i} ({source.sample_ids[i]!r} "
                              f"vs {ids[i]!r}): rows must be the dataset's samples in its order")
    return SourceSummary(format=source.format, n=source.n, num_states=source.num_states, width=source.width,
                         dtype=source.dtype, default_storage=FLOAT_DTYPES[source.dtype],
                         token_counts=source.token_counts(), digest=source.digest(), description=where)


def import_shard(store: StoreHandle, plan: ImportPlan, shard: int) -> ShardsWritten:
    """Read, check and write shard ``shard``; returns its catalog rows (one table: one run), and for
    a lossy storage dtype what its rounding did to the source's values."""
    # checked at submit: only a vllm folder needs the sample ids again (its files are named by them)
    ids = load_dataset(store.local(plan.dataset_path)).sample_ids if plan.format == "vllm" else []
    source = open_source(Path(plan.path), plan.format, ids, check=False)
    arrays = store.open()
    layout = plan.layout
    start, stop = layout.shard_range(shard)
    token_ids = None
    if layout.pooling == "tokens":
        values, token_ids = _token_rows(source, arrays.offsets(plan.run_key), start, stop)
    elif source.per_token:
        values = pool_blocks(source.token_blocks(start, stop), layout.pooling)
    else:
        values = source.pooled_rows(start, stop)
    expected = (stop - start, layout.num_states, layout.width)
    if tuple(values.shape) != expected:  # the files changed since the import was inspected
        raise InvalidArgument(f"{plan.path}: shard {shard} reads as {tuple(values.shape)}, not {expected}: "
                              "the files changed during the import; import them again")
    figures = ErrorFigures(layout.num_states, layout.width) if is_one_byte(layout.dtype) else None
    rows = store_shard(arrays, plan.run_key, shard, layout.dtype, values, token_ids, figures)
    return ShardsWritten([rows], None if figures is None else {plan.run_key: figures})


def _token_rows(source: ImportSource, offsets: np.ndarray, start: int, stop: int
                ) -> tuple[torch.Tensor, np.ndarray | None]:
    first = int(np.searchsorted(offsets, start, side="right")) - 1
    last = int(np.searchsorted(offsets, stop, side="left"))
    blocks = source.token_blocks(first, last)
    begin = start - int(offsets[first])
    values = torch.cat([values for values, _ in blocks])[begin: begin + (stop - start)]
    ids = [ids for _, ids in blocks]
    token_ids = None if any(i is None for i in ids) else np.concatenate(ids)[begin: begin + (stop - start)]
    return values, token_ids
