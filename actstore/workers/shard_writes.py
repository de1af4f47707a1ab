"""A shard's write on the host, after its forward pass: chunk rows (crc32c, extremes, NaN/Inf
counts), layer statistics, compression and the store's PUT.

No torch here, so a process that only writes (a GPU node's one-CPU write tasks) starts without
importing it: on a fresh worker that import was most of the first write's cost. The numbers are
the stored ones (float16, float32, or bfloat16 decoded from its uint16 bits), read by numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import crc32c
import numpy as np
import ray

from actstore.metrics.layer_stats import LayerStats
from actstore.store.array_store import ArrayStore, decode_stored
from actstore.store.handle import StoreHandle


@dataclass(frozen=True)
class PreparedShard:
    """A shard in its storage dtype with the reductions made where its forward pass ran
    (`workers.capture.prepare_shards`)."""

    layers: np.ndarray  # (L+1, rows, d), each layer contiguous: as the store keeps it (an inner chunk per layer)
    sums: np.ndarray  # (L+1, d) float64 sums of the stored numbers, exactly
    extremes: tuple[list, list]  # per layer min and max of the stored numbers (NaN propagates)

    @property
    def stored(self) -> np.ndarray:
        """(rows, L+1, d), each layer's numbers in one piece."""
        return self.layers.transpose(1, 0, 2)


def stored_numbers(stored: np.ndarray) -> np.ndarray:
    """The stored values as numbers: bfloat16's uint16 bits widened to float32, float16 and float32
    as they are (the statistics copy them into float64 anyway: as fast from float16 as from a
    float32 widening of it)."""
    return decode_stored(stored, "bfloat16" if stored.dtype == np.uint16 else "float32")


def chunk_metadata(run_key: str, shard: int, stored: np.ndarray,
                   extremes: tuple[list, list] | None = None) -> dict[str, list]:
    """One catalog row per layer of a shard: rows, crc32c of the stored bytes, and the finite
    min/max and NaN/Inf counts of the stored numbers (an fp16 overflow shows up here as Inf).

    ``extremes`` are the layers' min and max, NaN propagating (computed here when not given):
    where both are finite, the layer has no NaN or Inf and they are its finite extremes; only
    other layers are counted. (bfloat16 is decoded only where its numbers are needed: for the
    extremes when not given, and for a layer with NaN or Inf.)"""
    if extremes is None:
        numbers = stored_numbers(stored)
        extremes = numbers.min(axis=(0, 2)).tolist(), numbers.max(axis=(0, 2)).tolist()
    lows, highs = extremes
    rows: dict[str, list] = {k: [] for k in
                             ("run_key", "shard", "layer", "rows", "checksum", "min", "max", "nan_count", "inf_count")}
    for layer in range(stored.shape[1]):
        low, high, nans, infs = lows[layer], highs[layer], 0, 0
        if not (np.isfinite(low) and np.isfinite(high)):
            values = np.asarray(stored_numbers(stored[:, layer, :]), dtype=np.float32)
            finite = np.isfinite(values)
            low = float(values[finite].min()) if finite.any() else float("nan")
            high = float(values[finite].max()) if finite.any() else float("nan")
            nans, infs = int(np.isnan(values).sum()), int(np.isinf(values).sum())
        rows["run_key"].append(run_key)
        rows["shard"].append(shard)
        rows["layer"].append(layer)
        rows["rows"].append(stored.shape[0])
        rows["checksum"].append(crc32c.crc32c(np.ascontiguousarray(stored[:, layer, :])))  # no copy if laid out so
        rows["min"].append(low)
        rows["max"].append(high)
        rows["nan_count"].append(nans)
        rows["inf_count"].append(infs)
    return rows


def write_prepared(arrays: ArrayStore, run_key: str, shard: int, prepared: PreparedShard,
                   token_ids: np.ndarray | None = None) -> dict[str, list]:
    """Write a prepared shard whole: its chunk rows, statistics and token ids go in the shard
    object (`ArrayStore.write_shard`); returns the rows the catalog records."""
    stored = prepared.stored
    rows = chunk_metadata(run_key, shard, stored, prepared.extremes)
    stats = LayerStats.empty(stored.shape[1]).update(stored_numbers(stored)).to_dict()
    arrays.write_shard(run_key, shard, stored, prepared.sums, token_ids, rows, stats)
    return rows


def _write_on_worker(store: StoreHandle, run_key: str, shard: int, prepared: PreparedShard,
                     token_ids: np.ndarray | None) -> dict[str, list]:
    return write_prepared(store.open(), run_key, shard, prepared, token_ids)


# a whole shard, so a retry (its worker lost) writes the same object again
write_remotely = ray.remote(num_cpus=1, max_retries=2)(_write_on_worker)
