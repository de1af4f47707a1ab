"""What a shard object carries besides its values: its layer sums, and its chunk rows and layer
statistics (its "details"), as fixed-size checksummed blocks between its inner chunks and its
index, where zarr does not look (`store.codecs`):

    [inner chunks][details (L+1, 12) float64 + crc32c][layer sums (L+1, d) float64 + crc32c][index]

so a capture writes a shard with everything the catalog and the commit need in one PUT, and a
reader gets both blocks with one suffix request of a known length. Each block is described in
the activation array's attributes (``layer_sums``, ``shard_details``), in zarr's own terms; a
run without the ``shard_details`` attribute keeps them in two JSON objects per shard beside it
(`LEGACY_ROWS`, `LEGACY_STATS`), a run without ``layer_sums`` too in its own array.

A details block holds one row per layer: the catalog's chunk row (`catalog_schema.CHUNK_SCHEMA`;
its run key, shard and layer are where the block lies, so not stored) and the layer's running
statistics (`metrics.layer_stats`). Every stored number fits a float64 exactly: counts and crc32c
values are integers below 2^53, the extremes and statistics are float64 or float32 already. A
part the writer did not give is all NaN (a shard written without statistics has none, as a run
written before statistics existed).
"""

from __future__ import annotations

import numpy as np

from actstore.metrics.layer_stats import LayerStats
from actstore.store.array_store import RunLayout
from actstore.store.catalog_schema import CHUNK_SCHEMA
from actstore.store.codecs import FixedBlock

SUMS_ATTRIBUTE = "layer_sums"
SUMS_WHERE = "in each shard object, between its inner chunks and its index"
DETAILS_ATTRIBUTE = "shard_details"
DETAILS_WHERE = "in each shard object, just before its layer sums"
# the chunk row's columns a details block stores (the rest are where the block lies) and which are integers
ROW_COLUMNS = ("rows", "checksum", "min", "max", "nan_count", "inf_count")
INTEGER_COLUMNS = {"rows", "checksum", "nan_count", "inf_count"}
STATS_COLUMNS = tuple(LayerStats.empty(0).to_dict())
COLUMNS = ROW_COLUMNS + STATS_COLUMNS
# where a run written before keeps its chunk rows and layer statistics: one JSON object per shard
LEGACY_ROWS = "runs/{run_key}/chunk_rows/{shard}.json"
LEGACY_STATS = "runs/{run_key}/layer_stats/{shard}.json"


def sums_block(layout: RunLayout) -> FixedBlock:
    """The layer sums a shard object of a run with ``layout`` carries."""
    return FixedBlock.of((layout.num_states, layout.width), "float64")


def details_block(layout: RunLayout) -> FixedBlock:
    """The chunk rows and statistics a shard object of a run with ``layout`` carries."""
    return FixedBlock.of((layout.num_states, len(COLUMNS)), "float64")


def describe(layout: RunLayout) -> dict:
    """The attributes of a new run's activation array that say what its shards carry, and where."""
    return {SUMS_ATTRIBUTE: {"where": SUMS_WHERE, **sums_block(layout).describe()},
            DETAILS_ATTRIBUTE: {"where": DETAILS_WHERE, "columns": list(COLUMNS), **details_block(layout).describe()}}


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
