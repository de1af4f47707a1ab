"""Mixin of `ZarrArrayStore`: the arrays only a lossy (int8) run has. Its `scales` (`store.quantised`),
read beside its shards and applied to their codes, and its `errors`: what the rounding did to each
layer, measured at capture from the exact values (`metrics.rounding`), written at commit.

A read of an int8 run's shards fetches each shard's chunk of `scales` (its steps and offsets,
(2, L+1, d) float32 with a crc32c: 10-70 KB for the builtin models) in the same call as the
shards' own bytes, and decodes each layer's codes with its own state; a chunk that is missing or
fails its crc32c is DataLoss naming it, never numbers.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from zarr.codecs import Crc32cCodec

from actstore.store.array_store import RunLayout
from actstore.store.codecs import ChunkCodec
from actstore.store.damage import DECODE_ERRORS, damaged, reading_metadata, why_failed
from actstore.store.quantised import SCALES, decode, is_one_byte

ERRORS = "errors"  # (L+1, len(columns)) float64, the columns named in its attributes

SCALES_DECODE = ("value = code * scales[shard, 0, layer, channel] + scales[shard, 1, layer, channel], float32, "
                 "the multiply first; shard = row // the activation array's shard rows")


class OneByteShards:
    """Reads of the `scales` chunks of an int8 run, over the store's own calls."""

    _codec: Callable[[str, str], ChunkCodec]
    _fetch: Callable[[list], list]
    layout: Callable[[str], RunLayout]
    _group: Callable[..., object]
    _has: Callable[[str, str], bool]
    _whole: Callable[..., np.ndarray]
    _reported: Callable[[], object]

    def _scale_requests(self, run_key: str, layout: RunLayout, shards: range, decoded: bool) -> list:
        """The GETs of the shards' `scales` chunks that a decoded read of an int8 run needs (none
        for other runs, or for a read of the stored codes)."""
        if not decoded or not is_one_byte(layout.dtype):
            return []
        codec = self._codec(run_key, SCALES)
        return [(codec.key((shard, 0, 0, 0)), None) for shard in shards]

    def _states(self, run_key: str, layout: RunLayout, shards: range, found: list) -> list[np.ndarray]:
        """The shards' (2, L+1, d) states from their fetched `scales` chunks; DataLoss naming a
        shard whose chunk is missing or damaged."""
        codec = self._codec(run_key, SCALES)
        states = []
        for shard, data in zip(shards, found):
            if data is None:
                self.layout(run_key)  # NotFound if the whole run is gone
                raise damaged(run_key, SCALES, "is missing from the store", shard=shard)
            try:
                states.append(codec.decode(data)[0])
            except DECODE_ERRORS as exc:
                raise damaged(run_key, SCALES, why_failed(exc), shard=shard) from None
        return states

    def _decoded(self, run_key: str, layout: RunLayout, codes: np.ndarray, layers: list[int], start: int,
                 shards: range, found: list) -> np.ndarray:
        """float32 values of the codes (len(layers), rows, d) read from rows ``start`` on, each
        shard's rows with that shard's steps and offsets."""
        out = np.empty(codes.shape, np.float32)
        stop = start + codes.shape[1]
        for shard, state in zip(shards, self._states(run_key, layout, shards, found)):
            lo, hi = layout.shard_range(shard)
            a, b = max(lo, start) - start, min(hi, stop) - start
            out[:, a:b] = decode(codes[:, a:b], state[:, layers])
        return out

    def decoding(self, run_key: str, shard: int) -> np.ndarray | None:
        """The (2, L+1, d) float32 steps and offsets of one shard of an int8 run (None for
        another dtype); DataLoss naming the shard's chunk if it is missing or damaged."""
        layout = self.layout(run_key)
        if not is_one_byte(layout.dtype):
            return None
        shards = range(shard, shard + 1)
        return self._states(run_key, layout, shards, self._fetch(self._scale_requests(run_key, layout, shards,
                                                                                      True)))[0]

    def write_error_figures(self, run_key: str, figures: dict[str, list]) -> None:
        """Store a lossy run's per-layer error figures ({name: one value per layer}) as its
        checksummed `errors` array, the names in its attributes."""
        columns = list(figures)
        values = np.array([figures[name] for name in columns], dtype=np.float64).T
        with self._reported():
            group = self._group(run_key, "r+")
            group.create_array(ERRORS, data=values, compressors=[Crc32cCodec()], overwrite=True,
                               attributes={"columns": columns})

    def error_figures(self, run_key: str) -> dict[str, list] | None:
        """The figures `write_error_figures` stored (None: a run stored exactly, or not committed);
        DataLoss naming the array if it is damaged."""
        if not self._has(run_key, ERRORS):
            return None
        group = self._group(run_key)
        values = self._whole(run_key, group, ERRORS)
        with self._reported(), reading_metadata(run_key, ERRORS):
            columns = list(group[ERRORS].attrs["columns"])
        if values.shape[1] != len(columns):
            raise damaged(run_key, ERRORS, f"has {values.shape[1]} columns for the {len(columns)} it names")
        return {name: values[:, i].tolist() for i, name in enumerate(columns)}
