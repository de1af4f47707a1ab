"""Capture: run a model over a dataset and write every layer's hidden states, one shard a task.

A `ShardCapturer` holds one model replica. `capture(shard)` computes the rows of that shard,
writes the whole shard (writers own whole shards) and returns the chunk metadata that the job
manager records in the catalog after the write: write-then-commit. Rewriting a shard with the
same content is harmless, so a retried or resumed task may recompute a shard.

Pooled runs: shard k holds samples [k*S, (k+1)*S). Token-level runs: shard k holds token rows
[k*S, (k+1)*S) of the concatenation of every prompt's non-pad tokens; the prompts that straddle a
shard boundary are computed by both neighbours, and each writes only its own rows.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import crc32c
import numpy as np
import torch

from actstore.modeling.adapter import ModelAdapter
from actstore.store.array_store import RunLayout
from actstore.store.datasets import DatasetData, load_dataset
from actstore.store.handle import StoreHandle

_TORCH_STORAGE = {"float16": torch.float16, "float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class CapturePlan:
    run_key: str
    dataset_path: str
    pooling: str
    max_len: int
    batch_size: int
    layout: RunLayout


def model_inputs(data: DatasetData, start: int, stop: int):
    return data.texts[start:stop] if data.kind == "text" else data.images[start:stop]


def to_storage(values: torch.Tensor, dtype: str) -> np.ndarray:
    """Cast float32 hidden states to the storage dtype; bfloat16 leaves as its uint16 bits."""
    cast = values.to(_TORCH_STORAGE[dtype])
    if dtype == "bfloat16":
        return cast.view(torch.int16).numpy().view(np.uint16)
    return cast.numpy()


def chunk_metadata(run_key: str, shard: int, stored: np.ndarray, numbers: np.ndarray) -> dict[str, list]:
    """One catalog row per layer of a shard: rows, crc32c of the stored bytes, and the finite
    min/max and NaN/Inf counts of the stored numbers (an fp16 overflow shows up here as Inf)."""
    rows: dict[str, list] = {k: [] for k in
                             ("run_key", "shard", "layer", "rows", "checksum", "min", "max", "nan_count", "inf_count")}
    for layer in range(stored.shape[1]):
        values = numbers[:, layer, :]
        finite = np.isfinite(values)
        rows["run_key"].append(run_key)
        rows["shard"].append(shard)
        rows["layer"].append(layer)
        rows["rows"].append(stored.shape[0])
        rows["checksum"].append(crc32c.crc32c(np.ascontiguousarray(stored[:, layer, :]).tobytes()))
        rows["min"].append(float(values[finite].min()) if finite.any() else float("nan"))
        rows["max"].append(float(values[finite].max()) if finite.any() else float("nan"))
        rows["nan_count"].append(int(np.isnan(values).sum()))
        rows["inf_count"].append(int(np.isinf(values).sum()))
    return rows


class ShardCapturer:
    """One model replica. It outlives a job (the service keeps a pool), so it loads its model once
    and each dataset and run layout the first time a shard of it arrives.

    Run as an actor with several calls at once (Settings.capture_concurrent_shards), the model still
    computes one shard at a time (`_compute`): a finished shard is checksummed, compressed and
    written while the next one computes, so the model does not wait on the store."""

    def __init__(self, model_path: str, store: StoreHandle, num_threads: int | None = None) -> None:
        if num_threads:
            torch.set_num_threads(num_threads)
        self.adapter = ModelAdapter.load(store.local(model_path))
        self.store = store
        self.arrays = store.open()
        self._datasets: dict[str, DatasetData] = {}
        self._offsets: dict[str, np.ndarray] = {}
        self._compute = threading.Lock()

    def ready(self) -> bool:
        return True

    def _data(self, plan: CapturePlan) -> DatasetData:
        if plan.dataset_path not in self._datasets:
            self._datasets[plan.dataset_path] = load_dataset(self.store.local(plan.dataset_path))
        return self._datasets[plan.dataset_path]

    def _pooled(self, plan: CapturePlan, start: int, stop: int) -> torch.Tensor:
        """(rows, L+1, d) float32 for samples [start, stop)."""
        data = self._data(plan)
        parts = []
        for lo in range(start, stop, plan.batch_size):
            hi = min(lo + plan.batch_size, stop)
            batch = self.adapter.encode(model_inputs(data, lo, hi), plan.max_len)
            hidden = self.adapter.hidden_states(batch)
            parts.append(self.adapter.pool(hidden, batch.mask, plan.pooling).transpose(0, 1))
        return torch.cat(parts)

    def _tokens(self, plan: CapturePlan, start: int, stop: int) -> tuple[torch.Tensor, np.ndarray | None]:
        """(rows, L+1, d) float32 for token rows [start, stop), and their token ids (text models)."""
        if plan.run_key not in self._offsets:
            self._offsets[plan.run_key] = self.arrays.offsets(plan.run_key)
        offsets = self._offsets[plan.run_key]
        data = self._data(plan)
        first = int(np.searchsorted(offsets, start, side="right")) - 1
        last = int(np.searchsorted(offsets, stop, side="left"))
        parts, ids = [], []
        for lo in range(first, last, plan.batch_size):
            hi = min(lo + plan.batch_size, last)
            batch = self.adapter.encode(model_inputs(data, lo, hi), plan.max_len)
            hidden = self.adapter.hidden_states(batch)
            tokens, _ = self.adapter.pool_tokens(hidden, batch.mask)
            parts.append(tokens.transpose(0, 1))
            if batch.mask is not None and "input_ids" in batch.inputs:
                ids.append(batch.inputs["input_ids"][batch.mask.bool()].numpy())
        begin = start - int(offsets[first])
        token_ids = np.concatenate(ids)[begin: begin + (stop - start)] if ids else None
        return torch.cat(parts)[begin: begin + (stop - start)], token_ids

    def capture(self, plan: CapturePlan, shard: int) -> dict[str, list]:
        layout = plan.layout
        start, stop = layout.shard_range(shard)
        token_ids = None
        with self._compute:
            if layout.pooling == "tokens":
                values, token_ids = self._tokens(plan, start, stop)
            else:
                values = self._pooled(plan, start, stop)
        stored = to_storage(values, layout.dtype)
        numbers = stored if layout.dtype != "bfloat16" else values.to(torch.bfloat16).float().numpy()
        numbers = numbers.astype(np.float32, copy=False)
        sums = numbers.sum(axis=0, dtype=np.float64)
        self.arrays.write_shard(plan.run_key, shard, stored, sums, token_ids)
        rows = chunk_metadata(plan.run_key, shard, stored, numbers)
        self.arrays.write_chunk_rows(plan.run_key, shard, rows)
        return rows


def token_char_spans(store: StoreHandle, model_path: str, dataset_path: str, max_len: int) -> np.ndarray | None:
    """Every token row's character span in its text (`ModelAdapter.char_spans`), or None."""
    adapter = ModelAdapter.load(store.local(model_path))
    data = load_dataset(store.local(dataset_path))
    return adapter.char_spans(model_inputs(data, 0, data.n), max_len)


def token_offsets(store: StoreHandle, model_path: str, dataset_path: str, max_len: int) -> np.ndarray:
    """Prompt i owns token rows offsets[i]:offsets[i+1] of a token-level run."""
    adapter = ModelAdapter.load(store.local(model_path))
    data = load_dataset(store.local(dataset_path))
    counts = adapter.token_counts(model_inputs(data, 0, data.n), max_len)
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
