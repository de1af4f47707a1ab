"""Data out while the server runs: a layer's rows, a run as shuffled, rank-partitioned batches (the
partition and the buffer are `store.batches`), where a run's arrays are (for readers opening Zarr
themselves), and read-only SQL over the catalog (`store.catalog.sql`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from actstore.config import Settings
from actstore.errors import InvalidArgument, ResourceExhausted
from actstore.options import BATCHES, from_wire
from actstore.server.runs import RunChecks, byte_size
from actstore.store import batches
from actstore.store.array_store import READ_ITEMSIZE, ArrayStore, RunLayout
from actstore.store.catalog import Catalog, RunRecord
from actstore.store.catalog.sql import ADMIN_TABLES, READABLE_TABLES, CatalogSql, SqlAnswer
from actstore.store.format.quantised import is_one_byte


@dataclass(frozen=True)
class BatchPiece:
    """Rows [offset, offset + len(rows)) of batch `batch` (of `batch_rows` rows) of a stream."""

    batch: int
    batch_rows: int
    offset: int
    values: np.ndarray  # (rows, layers, d)
    rows: np.ndarray  # the run's row index of each row
    sample_ids: list[str]
    labels: np.ndarray | None
    buffer_shards: int
    # an int8 run's (shard, start, stop, state) the part's codes need that the stream has not sent yet
    decodings: list[tuple[int, int, int, np.ndarray]] = field(default_factory=list)


@dataclass(frozen=True)
class BatchOptions:
    """A ReadBatches request, resolved once at the boundary: the committed run, its layers checked,
    every option through the BATCHES table (`resolve`)."""

    record: RunRecord
    layers: list[int]
    batch_size: int
    shuffle: bool
    seed: int
    epoch: int
    rank: int
    world_size: int
    buffer_shards: int
    drop_last: bool

    @staticmethod
    def resolve(checks: RunChecks, request: Any) -> BatchOptions:
        """From a BatchesRequest (proto3: a zero value is "not given", the table's default)."""
        resolved = {name: from_wire(BATCHES, name, getattr(request, name)) for name in BATCHES}
        record = checks.committed_run(request.run)
        if resolved["batch_size"] is None:
            raise InvalidArgument("batch_size is required: the rows of one batch")
        if resolved["rank"] >= resolved["world_size"]:
            raise InvalidArgument(f"rank {resolved['rank']} is out of range for world_size {resolved['world_size']}: "
                                  "ranks are 0..world_size-1")
        chosen = checks.check_layers(record, list(request.layers), "layer")
        return BatchOptions(record=record, layers=chosen, shuffle=request.shuffle, **resolved)


@dataclass(frozen=True)
class RunLocation:
    record: RunRecord
    store: str
    group: str
    array: str


class Readers:
    def __init__(self, catalog: Catalog, arrays: ArrayStore, checks: RunChecks, settings: Settings) -> None:
        self.arrays = arrays
        self.checks = checks
        self.settings = settings
        self._sql = CatalogSql(catalog.cursor, settings.sql_memory_bytes)

    # ---- a layer's rows -----------------------------------------------------------------------
    def read_activations(self, run: str, layer: int, start: int, stop: int
                         ) -> Iterator[tuple[int, np.ndarray, list[str]]]:
        """Rows [start, stop) of one layer of a committed run (`stop` 0: to the end), as (first row,
        values, sample ids) pieces of at most `read_chunk_bytes`."""
        record = self.checks.committed_run(run)
        self.checks.check_layers(record, [layer], "layer")
        stop = stop or record.rows
        if not 0 <= start < stop <= record.rows:
            raise InvalidArgument(f"rows {start}..{stop} are outside 0..{record.rows} of run {record.run_key[:12]}")
        step = max(1, self.settings.read_chunk_bytes // (record.width * READ_ITEMSIZE[record.dtype]))
        ids = self.arrays.sample_ids(record.run_key) if record.pooling != "tokens" else []
        for lo in range(start, stop, step):
            hi = min(lo + step, stop)
            yield lo, self.arrays.read_layers(record.run_key, [layer], lo, hi)[0], ids[lo:hi]

    # ---- batches ------------------------------------------------------------------------------
    def batches(self, request: Any) -> Iterator[BatchPiece]:
        """A ReadBatches request's stream, the request resolved here once (`BatchOptions.resolve`)."""
        options = BatchOptions.resolve(self.checks, request)
        record = options.record
        layout = self.arrays.layout(record.run_key)
        k = batches.effective_buffer_shards(options.buffer_shards, options.batch_size, layout.shard_rows)
        # bfloat16 is read back as float32; an int8 run's codes travel as they are (decoded by the client)
        itemsize = 1 if self._coded(record, options.layers) else READ_ITEMSIZE[record.dtype]
        row_bytes = len(options.layers) * record.width * itemsize
        # shuffled: K shards' rows; in order: a shard and the rows carried into the next batch
        held = k * layout.shard_rows if options.shuffle else layout.shard_rows + options.batch_size
        if held * row_bytes > self.settings.batch_buffer_bytes:
            raise ResourceExhausted(
                f"reading {held} rows x {len(options.layers)} layers at once (buffer_shards {k} of "
                f"{layout.shard_rows} rows, batch_size {options.batch_size}) would hold {byte_size(held * row_bytes)}, "
                f"over the {byte_size(self.settings.batch_buffer_bytes)} limit (ACTSTORE_BATCH_BUFFER_BYTES): ask "
                "for fewer layers, a smaller buffer_shards or batch_size")
        return self._stream(record, layout, options, k, row_bytes)

    def _coded(self, record: RunRecord, layers: list[int]) -> bool:
        """Whether a stream of these layers sends an int8 run's codes (every layer int8, none kept exact)."""
        return is_one_byte(record.dtype) and not set(layers) & set(self.arrays.exact_layers(record.run_key))

    def _stream(self, record: RunRecord, layout: RunLayout, options: BatchOptions, k: int, row_bytes: int
                ) -> Iterator[BatchPiece]:
        key = record.run_key
        ids = self.arrays.sample_ids(key)
        labels = self.arrays.labels(key)
        offsets = self.arrays.offsets(key) if record.pooling == "tokens" else None
        shards = batches.shards_of_rank(layout, options.rank, options.world_size, options.shuffle,
                                        options.seed, options.epoch)
        coded = self._coded(record, options.layers)
        states: dict[int, np.ndarray] = {}  # an int8 run's shards read, their state until it is sent

        def read(shard: int) -> np.ndarray:
            if coded:
                codes, states[shard] = self.arrays.read_coded(key, options.layers, shard)
                return np.moveaxis(codes, 0, 1)
            lo, hi = layout.shard_range(shard)
            return np.moveaxis(self.arrays.read_layers(key, options.layers, lo, hi), 0, 1)

        if options.shuffle:
            dtype = np.dtype(np.int8 if coded else np.float16 if record.dtype == "float16" else np.float32)
            rng = np.random.default_rng([options.seed, options.epoch, options.rank])
            stream = batches.shuffled_batches(read, layout, shards, options.batch_size, k, rng,
                                              (len(options.layers), record.width), dtype)
        else:
            stream = batches.sequential_batches(read, layout, shards, options.batch_size)
        per_part = max(1, self.settings.read_chunk_bytes // row_bytes)
        for index, (values, rows) in enumerate(stream):
            if options.drop_last and len(rows) < options.batch_size:
                return
            samples = rows if offsets is None else np.searchsorted(offsets, rows, side="right") - 1
            for lo in range(0, len(rows), per_part):
                part = slice(lo, lo + per_part)
                needed = [int(s) for s in np.unique(rows[part] // layout.shard_rows) if s in states] if coded else []
                yield BatchPiece(index, len(rows), lo, values[part], rows[part], [ids[i] for i in samples[part]],
                                 None if labels is None else labels[samples[part]], k if options.shuffle else 1,
                                 [(s, *layout.shard_range(s), states.pop(s)) for s in needed])

    # ---- where the arrays are -----------------------------------------------------------------
    def locate(self, run: str) -> RunLocation:
        record = self.checks.committed_run(run)
        layout = self.arrays.layout(record.run_key)
        return RunLocation(record, self.settings.store_root, f"runs/{record.run_key}", layout.array_name)

    # ---- SQL ----------------------------------------------------------------------------------
    def sql(self, query: str, limit: int | None, role: str | None) -> SqlAnswer:
        """One read-only SELECT of at most `limit` rows (resolved at the boundary; None: the server's
        sql_max_rows); `role` None (no auth: the store's one user) reads what an admin reads."""
        limit = limit or self.settings.sql_max_rows
        tables = ADMIN_TABLES if role in (None, "admin") else READABLE_TABLES
        return self._sql.run(query, tables, limit, self.settings.sql_timeout_seconds)
