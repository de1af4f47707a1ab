"""A shard's write on the host, after its forward pass: the crc32c of each layer, the chunk rows,
and the store's PUT of the shard with its layer sums and statistics.

Everything else a shard needs, its layer sums, extremes, NaN/Inf counts and statistics, is
reduced where its forward pass ran (`workers.capture.prepare_shards`: on the GPU there, on the
host by `reduced_on_host` for a CPU replica or an import), so a GPU node's host only checksums
and writes: per byte, the same work as copying the bytes to a file with a checksum
(bench/capture_sink.py measures the two side by side).

No torch here, so a process that only writes (a one-CPU write task, `gpu_writes="ray-tasks"`) starts without
importing it: on a fresh worker that import was most of the first write's cost. The numbers are
the stored ones (float16, float32, bfloat16 decoded from its uint16 bits, or int8 codes decoded
with their shard's steps and offsets), read by numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import crc32c
import numpy as np
import ray

from actstore.metrics.layer_stats import LayerStats
from actstore.store.array_store import RunWriter, decode_stored
from actstore.store.format import quantised
from actstore.store.handle import StoreHandle


@dataclass(frozen=True)
class PreparedShard:
    """A shard in its storage dtype with every reduction of its numbers made."""

    layers: np.ndarray  # (L+1, rows, d), each layer contiguous: as the store keeps it (an inner chunk per layer)
    sums: np.ndarray  # (L+1, d) float64 sums of the stored numbers (NaN and Inf propagate)
    extremes: tuple[list, list]  # per layer the finite min and max of the stored numbers (NaN: none finite)
    counts: tuple[list, list]  # per layer the NaN and Inf counts
    stats: dict[str, list]  # the shard's `LayerStats.to_dict()`, of its finite numbers
    decoding: np.ndarray | None = None  # int8 codes' (2, L+1, d) steps and offsets (`store.format.quantised`)

    @property
    def stored(self) -> np.ndarray:
        """(rows, L+1, d), each layer's numbers in one piece."""
        return self.layers.transpose(1, 0, 2)


def stored_numbers(stored: np.ndarray, decoding: np.ndarray | None = None) -> np.ndarray:
    """The stored values as numbers: bfloat16's uint16 bits widened to float32, int8 codes
    (L+1, rows, d) decoded with their ``decoding``, float16 and float32 as they are (the
    statistics copy them into float64 anyway: as fast from float16 as from a float32 widening)."""
    if decoding is not None:
        return quantised.decode(stored, decoding)
    return decode_stored(stored, "bfloat16" if stored.dtype == np.uint16 else "float32")


def reduced_on_host(layers: np.ndarray, sums: np.ndarray, extremes: tuple[list, list] | None = None,
                    decoding: np.ndarray | None = None, numbers: np.ndarray | None = None) -> PreparedShard:
    """The shard of stored values ``layers`` (L+1, rows, d), with its ``sums``, reduced here by
    numpy: each layer's finite extremes, NaN and Inf counts and statistics (`LayerStats`, in
    float64). ``extremes`` are the layers' min and max with NaN propagating, where the caller has
    them (computed here when not): a layer whose two are finite has no NaN or Inf and they are its
    finite extremes; only the other layers are counted, from their numbers. (bfloat16 is decoded
    only where its numbers are needed: for the extremes when not given, for a layer with NaN or
    Inf, and for the statistics.) int8 codes come with their ``decoding``, and every number is of
    the decoded values (``numbers``, where the caller decoded them already)."""
    numbers = stored_numbers(layers, decoding) if numbers is None else numbers
    if extremes is None:
        extremes = numbers.min(axis=(1, 2)).tolist(), numbers.max(axis=(1, 2)).tolist()
    lows, highs, nans, infs = [], [], [], []
    for layer, (low, high) in enumerate(zip(*extremes)):
        nan_count = inf_count = 0
        if not (np.isfinite(low) and np.isfinite(high)):
            values = np.asarray(numbers[layer], dtype=np.float32)
            finite = np.isfinite(values)
            low = float(values[finite].min()) if finite.any() else float("nan")
            high = float(values[finite].max()) if finite.any() else float("nan")
            nan_count, inf_count = int(np.isnan(values).sum()), int(np.isinf(values).sum())
        lows.append(float(low))
        highs.append(float(high))
        nans.append(nan_count)
        infs.append(inf_count)
    stats = LayerStats.empty(layers.shape[0]).update(numbers.transpose(1, 0, 2)).to_dict()
    return PreparedShard(layers, sums, (lows, highs), (nans, infs), stats, decoding)


def chunk_rows(run_key: str, shard: int, prepared: PreparedShard) -> dict[str, list]:
    """One catalog row per layer of a shard: rows, crc32c of the layer's stored bytes, and the
    finite min/max and NaN/Inf counts of its numbers (an fp16 overflow shows up here as Inf)."""
    layers, rows = prepared.layers.shape[0], prepared.layers.shape[1]
    return {"run_key": [run_key] * layers, "shard": [shard] * layers, "layer": list(range(layers)),
            "rows": [rows] * layers,
            # each layer is contiguous (a PreparedShard's): summed where it lies, not copied
            "checksum": [crc32c.crc32c(np.ascontiguousarray(layer)) for layer in prepared.layers],
            "min": list(prepared.extremes[0]), "max": list(prepared.extremes[1]),
            "nan_count": list(prepared.counts[0]), "inf_count": list(prepared.counts[1])}


def chunk_metadata(run_key: str, shard: int, stored: np.ndarray) -> dict[str, list]:
    """The chunk rows of a shard of stored values (rows, L+1, d), reduced here (`reduced_on_host`)."""
    layers = np.ascontiguousarray(stored.transpose(1, 0, 2))
    return chunk_rows(run_key, shard, reduced_on_host(layers, np.zeros(layers.shape[::2])))


def write_prepared(arrays: RunWriter, run_key: str, shard: int, prepared: PreparedShard,
                   token_ids: np.ndarray | None = None) -> dict[str, list]:
    """Write a prepared shard whole: its chunk rows, statistics and token ids go in the shard
    object (`RunWriter.write_shard`); returns the rows the catalog records."""
    rows = chunk_rows(run_key, shard, prepared)
    arrays.write_shard(run_key, shard, prepared.stored, prepared.sums, token_ids, rows, prepared.stats,
                       checksums=rows["checksum"], decoding=prepared.decoding)
    return rows


def _write_on_worker(store: StoreHandle, run_key: str, shard: int, prepared: PreparedShard,
                     token_ids: np.ndarray | None) -> dict[str, list]:
    return write_prepared(store.open(), run_key, shard, prepared, token_ids)


# a whole shard, so a retry (its worker lost) writes the same object again
write_remotely = ray.remote(num_cpus=1, max_retries=2)(_write_on_worker)
