"""The catalog's runs: one row per capture of a model over a dataset (`Catalog.runs`).

A run is `committed` only once every chunk is recorded: `open` adds it as running (or resumes a
failed one), `Catalog.chunks.insert` records each shard after its data is durable, and `commit`
checks every shard and row is there before marking it committed.
"""

from __future__ import annotations

import json
from dataclasses import replace

from actstore.errors import DataLoss, FailedPrecondition, InvalidArgument, NotFound
from actstore.store.catalog.chunks import Chunks
from actstore.store.catalog.family import Family, Statements
from actstore.store.catalog.schema import RunRecord

RUN_STATUSES = ("running", "committed", "failed")
MIN_RUN_PREFIX = 8  # hex characters of a run key that name it
_COLUMNS = ("run_key, model_digest, dataset_digest, pooling, dtype, max_len, n, rows, "
            "num_layers, width, num_shards, status, spec")


def _record(r: tuple) -> RunRecord:
    return RunRecord(*r[:12], spec=json.loads(r[12]))


class Runs(Family):
    """The runs table; a run's shards are counted in the chunks table (``chunks``)."""

    def __init__(self, catalog: Statements, chunks: Chunks) -> None:
        super().__init__(catalog)
        self._chunks = chunks

    def add(self, record: RunRecord) -> None:
        """Insert the run; a key already known keeps its row as it is."""
        self._catalog.execute(
            f"INSERT INTO runs ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT DO NOTHING",
            [record.run_key, record.model_digest, record.dataset_digest, record.pooling, record.dtype,
             record.max_len, record.n, record.rows, record.num_layers, record.width, record.num_shards,
             record.status, json.dumps(record.spec)],
        )

    def find(self, run_key: str) -> RunRecord | None:
        """The run with exactly this key, if any (no prefixes: see `get`)."""
        rows = self._catalog.rows(f"SELECT {_COLUMNS} FROM runs WHERE run_key = ?", [run_key])
        return _record(rows[0]) if rows else None

    def get(self, key_or_prefix: str) -> RunRecord:
        """The run a key or its first MIN_RUN_PREFIX+ hex characters name (any case)."""
        prefix = key_or_prefix.strip().lower()  # keys are lower-case hex
        if len(prefix) < MIN_RUN_PREFIX:
            (count,) = self._catalog.rows("SELECT count(*) FROM runs WHERE starts_with(run_key, ?)", [prefix])[0]
            matched = f"it is the start of {count} run key(s)" if count else "no run key starts with it"
            raise NotFound(f"run prefix {key_or_prefix!r} is too short: give at least {MIN_RUN_PREFIX} hex characters "
                           f"of the run key ({matched}); list runs with `actstore runs`")
        rows = self._catalog.rows(f"SELECT {_COLUMNS} FROM runs WHERE starts_with(run_key, ?)", [prefix])
        if len(rows) > 1:
            raise InvalidArgument(f"run prefix {key_or_prefix!r} is ambiguous: give more characters")
        if not rows:
            raise NotFound(f"unknown run {key_or_prefix!r}: list runs with `actstore runs`")
        return _record(rows[0])

    def get_committed(self, key_or_prefix: str) -> RunRecord:
        """`get`, and FailedPrecondition unless the run is committed."""
        record = self.get(key_or_prefix)
        if record.status != "committed":
            raise FailedPrecondition(
                f"run {record.run_key[:12]} is {record.status}, not committed: wait for its capture "
                "job (`actstore jobs`), or submit the same capture again to resume it"
            )
        return record

    def all(self, model_digest: str | None = None, dataset_digest: str | None = None,
            status: str | None = None) -> list[RunRecord]:
        """Every run, oldest first, of the model, dataset and status given (each optional)."""
        if status is not None and status not in RUN_STATUSES:
            raise InvalidArgument(f"run status {status!r} is not one of {', '.join(RUN_STATUSES)}")
        rows = self._catalog.rows(
            f"SELECT {_COLUMNS} FROM runs WHERE (? IS NULL OR model_digest = ?) "
            "AND (? IS NULL OR dataset_digest = ?) AND (? IS NULL OR status = ?) ORDER BY created_at",
            [model_digest, model_digest, dataset_digest, dataset_digest, status, status],
        )
        return [_record(r) for r in rows]

    def failed_keys(self, older_than_seconds: float) -> list[str]:
        """Keys of the `failed` runs created at least ``older_than_seconds`` ago."""
        return [r[0] for r in self._catalog.rows(
            "SELECT run_key FROM runs WHERE status = 'failed' AND "
            "epoch(current_timestamp::TIMESTAMP - created_at) >= ? ORDER BY created_at", [older_than_seconds])]

    # ---- the capture path's unit of work: open, record shards (`Catalog.chunks.insert`), commit --
    def open(self, record: RunRecord) -> tuple[RunRecord, set[int]]:
        """Add the run (as running) unless it is known; returns its record and the shards
        already recorded, which a resumed capture skips."""
        self.add(record)
        stored = self.find(record.run_key)
        assert stored is not None
        if stored.status == "failed":  # a capture that failed before is being resumed
            self.set_status(record.run_key, "running")
            stored = replace(stored, status="running")
        return stored, self._chunks.recorded_shards(record.run_key, record.num_layers)

    def commit(self, record: RunRecord) -> None:
        """Mark the run committed once every shard and row is recorded; DataLoss otherwise."""
        recorded = self._chunks.recorded_shards(record.run_key, record.num_layers)
        rows = self._chunks.rows_total(record.run_key)
        if len(recorded) != record.num_shards or rows != record.rows:
            raise DataLoss(f"run {record.run_key[:12]}: {len(recorded)} of {record.num_shards} shards and {rows} "
                           f"of {record.rows} rows recorded; submit the capture again to finish it")
        self.set_status(record.run_key, "committed")

    def set_status(self, run_key: str, status: str) -> None:
        self._catalog.execute(
            "UPDATE runs SET status = ?, committed_at = CASE WHEN ? = 'committed' THEN current_timestamp "
            "ELSE committed_at END WHERE run_key = ?",
            [status, status, run_key],
        )

    def delete(self, run_key: str) -> None:
        """Forget the run, its chunk rows and every result computed from it, in one transaction."""
        with self._catalog.connection() as con:
            con.execute("BEGIN")
            for table in ("chunks", "runs"):
                con.execute(f"DELETE FROM {table} WHERE run_key = ?", [run_key])
            con.execute("DELETE FROM results WHERE list_contains(CAST(run_keys AS VARCHAR[]), ?)", [run_key])
            con.execute("COMMIT")
