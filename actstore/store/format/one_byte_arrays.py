"""Mixin of `ZarrArrayStore`: the arrays only a lossy (int8) run has. Its `scales` (`store.format.quantised`),
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
from zarr.abc.store import SuffixByteRequest
from zarr.codecs import Crc32cCodec

from actstore.store.array_store import RunLayout
from actstore.store.format.codecs import ChunkCodec
from actstore.store.format.damage import DECODE_ERRORS, damaged, reading_metadata, why_failed
from actstore.store.format.quantised import SCALES, decode, is_one_byte

ERRORS = "errors"  # (L+1, len(columns)) float64, the columns named in its attributes
EXACT = "exact"  # (rows, k, d) float32: the layers the tolerance keeps exact, named in its attributes

SCALES_DECODE = ("value = code * scales[shard, 0, layer, channel] + scales[shard, 1, layer, channel], float32, "
                 "the multiply first; shard = row // the activation array's shard rows")


class OneByteShards:
    """An int8 run's `scales`, `errors` and `exact` arrays, over the store's own calls.

    Layers kept exact (a capture's `max_cka_error`: their bound was over it) are float32 in the
    `exact` array, (rows, k, d), sharded as the activations are (their int8 codes stay in the
    activation array, as written first); `read_layers` takes those layers from there."""

    _codec: Callable[[str, str], ChunkCodec]
    _fetch: Callable[[list], list]
    layout: Callable[[str], RunLayout]
    _group: Callable[..., object]
    _has: Callable[[str, str], bool]
    _whole: Callable[..., np.ndarray]
    _reported: Callable[[], object]
    _read_layers: Callable[..., np.ndarray]
    _store: Callable[[dict], None]
    _exact: dict[str, dict[int, int]]
    _coders: dict
    _opening: object

    def _scale_requests(self, run_key: str, layout: RunLayout, shards: range, decoded: bool) -> list:
        """The GETs of the shards' `scales` chunks that a decoded read of an int8 run needs (none
        for other runs, or for a read of the stored codes)."""
        if not decoded or not is_one_byte(layout.dtype):
            return []
        codec = self._codec(run_key, SCALES)
        return [(codec.key((shard, 0, 0, 0)), None) for shard in shards]

    def _carried_states(self, run_key: str, layout: RunLayout, shards: range, found: list, block, after: int
                        ) -> list[np.ndarray]:
        """The shards' (2, L+1, d) states from the ends of their objects (`found`: whole objects or
        their tails), the block lying `after` bytes before the index; DataLoss naming a damaged one
        (a missing shard: the caller's own error first)."""
        codec = self._codec(run_key, layout.array_name)
        states = []
        for shard, data in zip(shards, found):
            if data is None:
                return []  # the shard itself is missing: reported as such where its chunks are read
            end = len(data) - codec.index_size - after
            try:
                states.append(block.decode(data[end - block.nbytes:end]))
            except DECODE_ERRORS as exc:
                raise damaged(run_key, SCALES, f"the copy in its shard object {why_failed(exc)}", shard=shard) \
                    from None
        return states

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
                 shards: range, states: list) -> np.ndarray:
        """float32 values of the codes (len(layers), rows, d) read from rows ``start`` on, each
        shard's rows with that shard's steps and offsets, (2, L+1, d) each."""
        out = np.empty(codes.shape, np.float32)
        stop = start + codes.shape[1]
        for shard, state in zip(shards, states):
            lo, hi = layout.shard_range(shard)
            a, b = max(lo, start) - start, min(hi, stop) - start
            decode(codes[:, a:b], state[:, layers], out=out[:, a:b])
        return out

    def decoding(self, run_key: str, shard: int) -> np.ndarray | None:
        """The (2, L+1, d) float32 steps and offsets of one shard of an int8 run (None for
        another dtype), from both its copies: the `scales` array's chunk (what plain zarr reads)
        and its shard object's (what the store reads); DataLoss naming the shard if either is
        missing or damaged, or they differ."""
        layout = self.layout(run_key)
        if not is_one_byte(layout.dtype):
            return None
        shards = range(shard, shard + 1)
        state = self._states(run_key, layout, shards, self._fetch(self._scale_requests(run_key, layout, shards,
                                                                                       True)))[0]
        carried = self._decoding_at(run_key, layout)
        if carried is not None:
            codec = self._codec(run_key, layout.array_name)
            tail = self._fetch([(codec.key((shard, 0, 0)), SuffixByteRequest(codec.index_size + carried[0].nbytes
                                                                               + carried[1]))])
            copies = self._carried_states(run_key, layout, shards, tail, *carried)
            if not copies:
                raise damaged(run_key, layout.array_name, "is missing from the store", shard=shard)
            if not np.array_equal(copies[0], state):
                raise damaged(run_key, SCALES, "differs from the copy its shard object carries", shard=shard)
        return state

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

    def create_exact(self, run_key: str, layers: list[int]) -> None:
        """The `exact` array of an int8 run for these layers (replacing one made before)."""
        layout = self.layout(run_key)
        with self._reported():
            self._group(run_key, "r+").create_array(
                EXACT, shape=(layout.rows, len(layers), layout.width), chunks=(layout.shard_rows, 1, layout.width),
                shards=(layout.shard_rows, len(layers), layout.width), dtype="float32", compressors=[Crc32cCodec()],
                fill_value=0, overwrite=True, attributes={"layers": [int(layer) for layer in layers]})
        self._exact.pop(run_key, None)
        self._coders.pop((run_key, EXACT), None)

    def write_exact_shard(self, run_key: str, shard: int, values: np.ndarray) -> None:
        """One whole shard of the `exact` array: float32 (rows, k, d), its layers in `exact_layers` order."""
        codec = self._codec(run_key, EXACT)
        self._store({codec.key((shard, 0, 0)): codec.encode(np.ascontiguousarray(values, np.float32))})

    def exact_layers(self, run_key: str) -> list[int]:
        """The layers an int8 run keeps exact, in their order in `exact` (none: every layer is int8,
        or another dtype)."""
        return list(self._exact_positions(run_key))

    def _exact_positions(self, run_key: str) -> dict[int, int]:
        positions = self._exact.get(run_key)
        if positions is None:
            if not is_one_byte(self.layout(run_key).dtype) or not self._has(run_key, EXACT):
                positions = {}
            else:
                layers = self._codec(run_key, EXACT).attributes.get("layers", [])
                positions = {int(layer): i for i, layer in enumerate(layers)}
            self._exact[run_key] = positions
        return positions

    def _read_with_exact(self, run_key: str, layers: list[int], start: int, stop: int,
                         exact: dict[int, int]) -> np.ndarray:
        """`read_layers` of an int8 run some of whose layers are kept exact: those from `exact`, the
        others decoded from their codes."""
        out = np.empty((len(layers), stop - start, self.layout(run_key).width), np.float32)
        coded = [i for i, layer in enumerate(layers) if layer not in exact]
        kept = [i for i, layer in enumerate(layers) if layer in exact]
        if coded:
            out[coded] = self._read_layers(run_key, [layers[i] for i in coded], start, stop)
        out[kept] = self._read_layers(run_key, [exact[layers[i]] for i in kept], start, stop, array=EXACT)
        return out
