"""What a shard object carries besides its values: its layer sums, and its chunk rows and layer
statistics (its "details"), as fixed-size checksummed blocks between its inner chunks and its
index, where zarr does not look (`store.format.codecs`):

    [inner chunks][details (L+1, 12) float64 + crc32c][layer sums (L+1, d) float64 + crc32c][index]

(an int8 run's shard also carries its steps and offsets, (2, L+1, d) float32 + crc32c, just before
its details: a read decodes a shard from one object, `store.format.quantised`; its layer sums are float32,
of the decoded values, summed in float64)

so a capture writes a shard with everything the catalog and the commit need in one PUT, and a
reader gets both blocks with one suffix request of a known length. Each block is described in
the activation array's attributes (``layer_sums``, ``shard_details``), in zarr's own terms; a
run without the ``shard_details`` attribute (written before) keeps its chunk rows and statistics
in two JSON objects per shard beside it (`LEGACY_ROWS`, `LEGACY_STATS`), and one without
``layer_sums`` too (the oldest) its sums in a ``layer_sums`` array.

A details block holds one row per layer: the catalog's chunk row (`catalog_schema.CHUNK_SCHEMA`;
its run key, shard and layer are where the block lies, so not stored) and the layer's running
statistics (`metrics.layer_stats`). Every stored number fits a float64 exactly: counts and crc32c
values are integers below 2^53, the extremes and statistics are float64 or float32 already. A
part the writer did not give is all NaN (a shard written without statistics has none, as a run
written before statistics existed).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager

import numpy as np
from zarr.abc.store import SuffixByteRequest

from actstore.metrics.layer_stats import LayerStats
from actstore.store.array_store import RunLayout
from actstore.store.catalog.schema import CHUNK_SCHEMA
from actstore.store.format.codecs import ChunkCodec, FixedBlock
from actstore.store.format.damage import DECODE_ERRORS, damaged, why_failed
from actstore.store.format.quantised import is_one_byte

SUMS_ATTRIBUTE = "layer_sums"
SUMS_WHERE = "in each shard object, between its inner chunks and its index"
DETAILS_ATTRIBUTE = "shard_details"
DETAILS_WHERE = "in each shard object, just before its layer sums"
DECODING_ATTRIBUTE = "decoding"  # an int8 run's steps and offsets (store.format.quantised), the scales array's copy
DECODING_WHERE = "in each shard object, just before its details: the shard's row of the scales array"
# the chunk row's columns a details block stores (the rest are where the block lies) and which are integers
ROW_COLUMNS = ("rows", "checksum", "min", "max", "nan_count", "inf_count")
INTEGER_COLUMNS = {"rows", "checksum", "nan_count", "inf_count"}
STATS_COLUMNS = tuple(LayerStats.empty(0).to_dict())
COLUMNS = ROW_COLUMNS + STATS_COLUMNS
# where a run written before keeps its chunk rows and layer statistics: one JSON object per shard
LEGACY_ROWS = "runs/{run_key}/chunk_rows/{shard}.json"
LEGACY_STATS = "runs/{run_key}/layer_stats/{shard}.json"
# shard ends read at once by `write_means` and the like: 64 shards' sums of a 33 x 4096 model are 69 MB
SHARDS_AT_ONCE = 64


def sums_block(layout: RunLayout, dtype: str | None = None) -> FixedBlock:
    """The layer sums a shard object of a run with ``layout`` carries: float64, an int8 run's float32
    (their means are within float32 rounding of the decoded values'; half the bytes per value);
    ``dtype``: the one the run's attributes name."""
    return FixedBlock.of((layout.num_states, layout.width), dtype or ("float32" if is_one_byte(layout.dtype)
                                                                      else "float64"))


def decoding_block(layout: RunLayout) -> FixedBlock:
    """The steps and offsets an int8 run's shard object carries (`store.format.quantised`)."""
    return FixedBlock.of((2, layout.num_states, layout.width), "float32")


def details_block(layout: RunLayout) -> FixedBlock:
    """The chunk rows and statistics a shard object of a run with ``layout`` carries."""
    return FixedBlock.of((layout.num_states, len(COLUMNS)), "float64")


def describe(layout: RunLayout) -> dict:
    """The attributes of a new run's activation array that say what its shards carry, and where."""
    details = {"where": DETAILS_WHERE, "columns": list(COLUMNS), **details_block(layout).describe()}
    described = {SUMS_ATTRIBUTE: {"where": SUMS_WHERE, **sums_block(layout).describe()}, DETAILS_ATTRIBUTE: details}
    if is_one_byte(layout.dtype):
        described[DECODING_ATTRIBUTE] = {"where": DECODING_WHERE, **decoding_block(layout).describe()}
    return described


def details_values(run_key: str, shard: int, layers: int, rows: dict[str, list] | None,
                   stats: dict[str, list] | None) -> np.ndarray:
    """The (layers, len(COLUMNS)) values of a details block; ValueError for rows that are not one
    per layer of this run's shard (what the block leaves out must be where it lies)."""
    values = np.full((layers, len(COLUMNS)), np.nan)
    if rows is not None:
        expected = {"run_key": [run_key] * layers, "shard": [shard] * layers, "layer": list(range(layers))}
        if set(rows) != set(CHUNK_SCHEMA.names) or any(list(rows[k]) != v for k, v in expected.items()):
            raise ValueError(f"shard {shard}'s chunk rows must be one per layer, with the columns {CHUNK_SCHEMA.names}")
        for i, column in enumerate(ROW_COLUMNS):
            values[:, i] = rows[column]
    if stats is not None:
        for i, column in enumerate(STATS_COLUMNS, len(ROW_COLUMNS)):
            values[:, i] = stats[column]
    return values


def from_details(run_key: str, shard: int, values: np.ndarray) -> tuple[dict[str, list] | None, dict | None]:
    """The chunk rows and statistics a details block holds (None for a part not written)."""
    rows = stats = None
    part = values[:, :len(ROW_COLUMNS)]
    if not np.isnan(part[:, 0]).all():
        layers = len(values)
        rows = {"run_key": [run_key] * layers, "shard": [shard] * layers, "layer": list(range(layers))}
        for i, column in enumerate(ROW_COLUMNS):
            cells = part[:, i].tolist()
            rows[column] = [int(c) for c in cells] if column in INTEGER_COLUMNS else cells
        rows = {name: rows[name] for name in CHUNK_SCHEMA.names}
    part = values[:, len(ROW_COLUMNS):]
    if not np.isnan(part[:, 0]).all():
        stats = {column: part[:, i].tolist() for i, column in enumerate(STATS_COLUMNS)}
    return rows, stats


def shard_batches(layout: RunLayout) -> list[range]:
    """The run's shards in batches of `SHARDS_AT_ONCE`, read at once (memory stays bounded)."""
    return [range(first, min(first + SHARDS_AT_ONCE, layout.num_shards))
            for first in range(0, layout.num_shards, SHARDS_AT_ONCE)]


class ShardEnds:
    """Mixin of `ZarrArrayStore`: reading what shard objects carry after their values (and an
    older run's JSON objects beside them), over the store's own calls."""

    _codec: Callable[[str, str], ChunkCodec]
    layout: Callable[[str], RunLayout]
    _fetch: Callable[[list], list]
    _group: Callable[..., object]
    _reported: Callable[[], AbstractContextManager]

    def _carried(self, run_key: str, layout: RunLayout) -> tuple[FixedBlock | None, FixedBlock | None]:
        """The blocks the run's shard objects carry, from its array's attributes: the layer sums
        (None: the oldest runs keep them in a `layer_sums` array) and the details (None: runs
        written before keep chunk rows and statistics in JSON objects)."""
        attributes = self._codec(run_key, layout.array_name).attributes
        sums = attributes.get(SUMS_ATTRIBUTE)
        return (sums_block(layout, sums.get("data_type")) if sums is not None else None,
                details_block(layout) if DETAILS_ATTRIBUTE in attributes else None)

    def _decoding_at(self, run_key: str, layout: RunLayout) -> tuple[FixedBlock, int] | None:
        """An int8 run's shards' decoding block and how many bytes of trailer lie between it and
        the index (None: another dtype, or a run written before shards carried it)."""
        if DECODING_ATTRIBUTE not in self._codec(run_key, layout.array_name).attributes:
            return None
        sums, details = self._carried(run_key, layout)
        return decoding_block(layout), sums.nbytes + details.nbytes

    def _blocks(self, run_key: str, layout: RunLayout, shards: range, name: str, block: FixedBlock,
                after: int = 0) -> list[np.ndarray | None]:
        """A block the shards' objects carry, `after` bytes before their index: the end of each,
        one GET per shard, all at once (None for a shard not stored); DataLoss naming a shard (and
        the block as `name`) whose block fails its check."""
        codec = self._codec(run_key, layout.array_name)
        found = self._fetch([(codec.key((shard, 0, 0)), SuffixByteRequest(block.nbytes + after + codec.index_size))
                             for shard in shards])
        blocks = []
        for shard, data in zip(shards, found):
            try:
                blocks.append(None if data is None else block.decode(data[:block.nbytes]))
            except DECODE_ERRORS as exc:
                raise damaged(run_key, name, why_failed(exc), shard=shard) from None
        return blocks

    def _shard_sums(self, run_key: str, layout: RunLayout, shards: range) -> list[np.ndarray]:
        """The layer sums the shards' objects carry; DataLoss for a shard not stored."""
        sums = self._blocks(run_key, layout, shards, "layer_sums", sums_block(layout))
        for shard, found in zip(shards, sums):
            if found is None:
                self.layout(run_key)  # NotFound if the whole run is gone
                raise damaged(run_key, "layer_sums", "is missing from the store", shard=shard)
        return sums

    def _kept(self, run_key: str, shards: range) -> list[tuple[dict | None, dict | None]]:
        """Each shard's chunk rows and statistics, as given to `write_shard` (None: none kept,
        or the shard is not stored), all shards' at once; DataLoss naming a damaged one."""
        layout = self.layout(run_key)
        block = self._carried(run_key, layout)[1]
        if block is not None:
            found = self._blocks(run_key, layout, shards, "shard_details", block, sums_block(layout).nbytes)
            return [(None, None) if values is None else from_details(run_key, shard, values)
                    for shard, values in zip(shards, found)]
        parts = (("chunk_rows", LEGACY_ROWS), ("layer_stats", LEGACY_STATS))  # a run written before
        found = iter(self._fetch([(template.format(run_key=run_key, shard=shard), None)
                                  for shard in shards for _, template in parts]))
        kept = []
        for shard in shards:
            decoded = []
            for (name, _), data in zip(parts, [next(found), next(found)]):
                try:
                    decoded.append(None if data is None else json.loads(bytes(data)))
                except ValueError as exc:
                    raise damaged(run_key, name, f"does not decode ({exc})", shard=shard) from None
            kept.append((decoded[0], decoded[1]))
        return kept

    def _every_kept(self, run_key: str) -> list[tuple[dict | None, dict | None]]:
        """`_kept` of every shard of the run, a batch of shards at a time (memory stays bounded)."""
        return [kept for batch in shard_batches(self.layout(run_key)) for kept in self._kept(run_key, batch)]

    def chunk_rows(self, run_key: str) -> dict[str, list]:
        combined: dict[str, list] = {}
        for rows, _ in self._every_kept(run_key):
            for column, cells in (rows or {}).items():
                combined.setdefault(column, []).extend(cells)
        return combined

    def shard_details(self, run_key: str, shard: int) -> tuple[dict | None, dict | None]:
        return self._kept(run_key, range(shard, shard + 1))[0]

    def write_layer_stats(self, run_key: str) -> dict | None:
        layout = self.layout(run_key)
        total = LayerStats.empty(layout.num_states)
        for shard, (_, stats) in enumerate(self._every_kept(run_key)):
            if stats is None:  # a shard written without statistics (before they existed): the run has none
                return None
            try:
                total.merge(LayerStats.from_dict(stats))
            except (ValueError, KeyError) as exc:
                raise damaged(run_key, "layer_stats", f"does not decode ({exc})", shard=shard) from None
        stats = total.finalize()
        with self._reported():
            self._group(run_key, mode="r+").attrs.update({"layer_stats": stats})
        return stats

