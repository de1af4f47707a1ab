"""The catalog's chunk rows: one per (run, shard, layer) array written, with its row count,
checksum and value health (`Catalog.chunks`).

Ray workers never open the catalog; they return chunk metadata, inserted here in batches from
Arrow (row-by-row inserts are ~100x slower). A chunk row is inserted only after its data is durable.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from actstore.store.catalog.family import Family
from actstore.store.catalog.schema import CHUNK_SCHEMA, ChunkHealth


class Chunks(Family):
    def insert(self, table: pa.Table) -> None:
        """Insert a batch of chunk rows (CHUNK_SCHEMA), a shard's after its arrays were written.
        Re-inserting a recorded chunk is a no-op: chunk writes are idempotent, so a retried task
        may report a shard twice."""
        with self._catalog.connection() as con:
            con.register("incoming_chunks", table.cast(CHUNK_SCHEMA))
            try:
                con.execute("INSERT INTO chunks SELECT * FROM incoming_chunks ON CONFLICT DO NOTHING")
            finally:
                con.unregister("incoming_chunks")

    def recorded_shards(self, run_key: str, num_layers: int) -> set[int]:
        """Shards with a chunk row for every layer 0..L."""
        rows = self._catalog.rows(
            "SELECT shard FROM chunks WHERE run_key = ? GROUP BY shard HAVING count(*) = ?",
            [run_key, num_layers + 1],
        )
        return {r[0] for r in rows}

    def rows_total(self, run_key: str) -> int:
        """The rows the run's recorded layer-0 chunks hold."""
        rows = self._catalog.rows("SELECT coalesce(sum(rows), 0) FROM chunks WHERE run_key = ? AND layer = 0",
                                  [run_key])
        return int(rows[0][0])

    def health(self, run_key: str, num_layers: int) -> ChunkHealth:
        """Recorded shards and, per layer, NaN and inf counts and the value range."""
        rows = self._catalog.rows(
            "SELECT layer, sum(nan_count), sum(inf_count), min(min), max(max), count(*) FROM chunks "
            "WHERE run_key = ? GROUP BY layer ORDER BY layer",
            [run_key],
        )
        nan = np.zeros(num_layers + 1, np.int64)
        inf = np.zeros(num_layers + 1, np.int64)
        lo = np.full(num_layers + 1, np.nan)
        hi = np.full(num_layers + 1, np.nan)
        for layer, n_nan, n_inf, mn, mx, _ in rows:
            nan[layer], inf[layer], lo[layer], hi[layer] = n_nan, n_inf, mn, mx
        shards = len(self.recorded_shards(run_key, num_layers))
        return ChunkHealth(shards, nan, inf, lo, hi)

    def checksums(self, run_key: str) -> dict[int, dict[int, tuple[int, int]]]:
        """shard -> layer -> (rows, crc32c) of every chunk row the catalog holds for the run."""
        checksums: dict[int, dict[int, tuple[int, int]]] = {}
        for shard, layer, rows, checksum in self._catalog.rows(
                "SELECT shard, layer, rows, checksum FROM chunks WHERE run_key = ?", [run_key]):
            checksums.setdefault(shard, {})[layer] = (rows, checksum)
        return checksums

    def drop_shards(self, run_key: str, shards: list[int], status: str) -> None:
        """Forget the shards' chunk rows and set the run's status, in one transaction (a repair:
        the next capture of the run rewrites those shards)."""
        with self._catalog.connection() as con:
            con.execute("BEGIN")
            con.execute("DELETE FROM chunks WHERE run_key = ? AND list_contains(?, shard)", [run_key, shards])
            con.execute("UPDATE runs SET status = ? WHERE run_key = ?", [status, run_key])
            con.execute("COMMIT")
