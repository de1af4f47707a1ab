"""The DuckDB catalog: what exists, by digest and key.

One process owns it (the server, or the embedded client's in-process server): DuckDB allows a
single writer. Ray workers never open it; they return chunk metadata, inserted here in batches
from Arrow (row-by-row inserts are ~100x slower). A chunk row is inserted only after its data is
durable, and a run is `committed` only once every chunk is recorded.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import replace
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from actstore.errors import (
    ActStoreError,
    AlreadyExists,
    DataLoss,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from actstore.store import backups
from actstore.store.catalog_schema import (
    CHUNK_SCHEMA,
    SCHEMA,
    ChunkHealth,
    DatasetRecord,
    JobRecord,
    ModelRecord,
    RunRecord,
)

RUN_STATUSES = ("running", "committed", "failed")
JOB_STATUSES = ("queued", "running", "done", "failed", "cancelled", "interrupted")
MIN_RUN_PREFIX = 8  # hex characters of a run key that name it
# DuckDB's file starts with its main header and two alternating database headers, 4 KiB each
DUCKDB_HEADER_BYTES = 3 * 4096


def _open_failure(path: Path, exc: duckdb.Error | str) -> ActStoreError:
    """Why the catalog file cannot be opened, and what to do (no DuckDB traceback)."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if re.search(r"\block\b", text, re.IGNORECASE):  # "Could not set lock on file ..."
        return Unavailable(f"cannot open the catalog {path}: another process holds it ({text}). Another "
                           "actstore server owns this store: connect to it with --address instead")
    latest = backups.latest_backup(path)
    restore = (f"restore its latest backup with `actstore catalog restore {latest} --catalog {path}`" if latest else
               f"restore a backup with `actstore catalog restore BACKUP --catalog {path}` (none is in "
               f"{backups.backup_dir(path)})")
    wal = backups.wal_path(path)
    log = f"its write-ahead log {wal.name}" if wal.exists() else "a write-ahead log left beside it"
    return DataLoss(f"the catalog {path} is damaged ({text}). Either {restore}, which moves the damaged file and "
                    f"{log} aside, or move {path.name} aside yourself and recreate it from the store with "
                    f"`actstore catalog rebuild --store STORE --catalog {path}`, which moves {log} aside too")


class Catalog:
    """Thread-safe access to the catalog file. All statements go through one connection."""

    def __init__(self, path: Path, memory_bytes: int | None = None) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        # DuckDB's buffer pool is a cache too: unbounded it grows to 80% of the machine's memory
        config = {"memory_limit": f"{memory_bytes}B"} if memory_bytes else {}
        try:
            self._con = duckdb.connect(str(path), config=config)
            self._con.execute(SCHEMA)
            self._con.execute("SELECT count(*) FROM runs").fetchall()
            # DuckDB reads a data block only when a query needs it, so a truncated file opens and
            # counts rows; the blocks in use must all be in the file, which a cut-off file cannot
            # hold. total_blocks is not the measure: a checkpoint trims trailing free blocks off the
            # file after writing the header, so total_blocks (= used + free) may name blocks past its end
            block_size, used_blocks = self._con.execute(
                "SELECT block_size, used_blocks FROM pragma_database_size() "
                "WHERE database_name = current_database()").fetchall()[0]
        except duckdb.Error as exc:
            raise _open_failure(path, exc) from None
        size = path.stat().st_size
        if size < DUCKDB_HEADER_BYTES + block_size * used_blocks:
            self._con.close()
            raise _open_failure(path, f"the file has {size} bytes; {used_blocks} blocks of {block_size} bytes "
                                      f"are in use, which need {DUCKDB_HEADER_BYTES + block_size * used_blocks}")
        self._lock = threading.RLock()

    def close(self) -> None:
        with self._lock:
            self._con.close()

    def backup(self, keep: int) -> Path:
        """A consistent copy of the catalog in ``backups/``, keeping the newest ``keep`` (see
        `store.backups` for why DuckDB's own copy under the lock)."""
        staged = backups.staging_path(self.path)
        with self._lock:
            try:
                self._con.execute("ATTACH '" + str(staged).replace("'", "''") + "' AS actstore_backup")
                try:
                    name = self._con.execute("SELECT current_database()").fetchone()[0].replace('"', '""')
                    self._con.execute(f'COPY FROM DATABASE "{name}" TO actstore_backup')
                finally:
                    self._con.execute("DETACH actstore_backup")
            except BaseException:
                staged.unlink(missing_ok=True)
                raise
        return backups.publish(staged, self.path, keep)

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A new connection to the same database, with its own transactions, for the read-only
        SQL endpoint (`store.catalog_sql`); the caller closes it."""
        with self._lock:
            return self._con.cursor()

    def _rows(self, sql: str, params: list | tuple = ()) -> list[tuple]:
        with self._lock:
            return self._con.execute(sql, params).fetchall()

    def _run(self, sql: str, params: list | tuple = ()) -> None:
        with self._lock:
            self._con.execute(sql, params)

    # ---- models -------------------------------------------------------------------------------
    def add_model(self, record: ModelRecord) -> None:
        self._run(
            "INSERT INTO models (digest, kind, arch, num_layers, hidden_size, max_positions, path, has_head, "
            "lineage) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            [record.digest, record.kind, record.arch, record.num_layers, record.hidden_size,
             record.max_positions, record.path, record.has_head, json.dumps(record.lineage)],
        )

    def set_model_alias(self, alias: str, digest: str) -> None:
        self._set_alias("model_aliases", alias, digest)

    def _set_alias(self, table: str, alias: str, digest: str) -> None:
        if not alias or alias != alias.strip() or "/" in alias and alias.startswith("/"):
            raise InvalidArgument(f"alias {alias!r} is not a valid name (no leading '/', no padding)")
        self._run(
            f"INSERT INTO {table} (alias, digest) VALUES (?, ?) "
            "ON CONFLICT (alias) DO UPDATE SET digest = excluded.digest, updated_at = now()",
            [alias, digest],
        )

    def _aliases(self, table: str, digest: str) -> tuple[str, ...]:
        return tuple(r[0] for r in self._rows(f"SELECT alias FROM {table} WHERE digest = ? ORDER BY alias", [digest]))

    def _resolve(self, table: str, alias_table: str, name: str, what: str) -> str:
        hit = self._rows(f"SELECT digest FROM {alias_table} WHERE alias = ?", [name])
        if hit:
            return hit[0][0]
        matches = self._rows(f"SELECT digest FROM {table} WHERE starts_with(digest, ?)", [name])
        if len(matches) == 1 and len(name) >= 8:
            return matches[0][0]
        if len(matches) > 1 and len(name) >= 8:
            raise InvalidArgument(f"{what} prefix {name!r} is ambiguous: give more characters")
        raise NotFound(f"unknown {what} {name!r}: list them with `actstore {what}s` or register it first")

    def model(self, name_or_digest: str) -> ModelRecord:
        digest = self._resolve("models", "model_aliases", name_or_digest, "model")
        row = self._rows(
            "SELECT digest, kind, arch, num_layers, hidden_size, max_positions, path, has_head, lineage "
            "FROM models WHERE digest = ?",
            [digest],
        )
        if not row:
            raise NotFound(f"alias {name_or_digest!r} points to model {digest[:12]} which is gone")
        r = row[0]
        return ModelRecord(*r[:8], lineage=json.loads(r[8]), aliases=self._aliases("model_aliases", digest))

    def models(self) -> list[ModelRecord]:
        return [self.model(r[0]) for r in self._rows("SELECT digest FROM models ORDER BY created_at")]

    # ---- datasets -----------------------------------------------------------------------------
    def add_dataset(self, record: DatasetRecord) -> None:
        self._run(
            "INSERT INTO datasets (digest, kind, n, num_labels, has_groups, path, source) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            [record.digest, record.kind, record.n, record.num_labels, record.has_groups,
             record.path, json.dumps(record.source)],
        )

    def set_dataset_alias(self, alias: str, digest: str) -> None:
        self._set_alias("dataset_aliases", alias, digest)

    def dataset(self, name_or_digest: str) -> DatasetRecord:
        digest = self._resolve("datasets", "dataset_aliases", name_or_digest, "dataset")
        row = self._rows(
            "SELECT digest, kind, n, num_labels, has_groups, path, source FROM datasets WHERE digest = ?", [digest]
        )
        if not row:
            raise NotFound(f"alias {name_or_digest!r} points to dataset {digest[:12]} which is gone")
        r = row[0]
        return DatasetRecord(*r[:6], source=json.loads(r[6]), aliases=self._aliases("dataset_aliases", digest))

    def datasets(self) -> list[DatasetRecord]:
        return [self.dataset(r[0]) for r in self._rows("SELECT digest FROM datasets ORDER BY created_at")]

    # ---- runs ---------------------------------------------------------------------------------
    _RUN_COLUMNS = ("run_key, model_digest, dataset_digest, pooling, dtype, max_len, n, rows, "
                    "num_layers, width, num_shards, status, spec")

    def add_run(self, record: RunRecord) -> None:
        self._run(
            f"INSERT INTO runs ({self._RUN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT DO NOTHING",
            [record.run_key, record.model_digest, record.dataset_digest, record.pooling, record.dtype,
             record.max_len, record.n, record.rows, record.num_layers, record.width, record.num_shards,
             record.status, json.dumps(record.spec)],
        )

    def _run_from_row(self, r: tuple) -> RunRecord:
        return RunRecord(*r[:12], spec=json.loads(r[12]))

    def find_run(self, run_key: str) -> RunRecord | None:
        rows = self._rows(f"SELECT {self._RUN_COLUMNS} FROM runs WHERE run_key = ?", [run_key])
        return self._run_from_row(rows[0]) if rows else None

    def run(self, key_or_prefix: str) -> RunRecord:
        """The run a key or its first MIN_RUN_PREFIX+ hex characters name (any case)."""
        prefix = key_or_prefix.strip().lower()  # keys are lower-case hex
        if len(prefix) < MIN_RUN_PREFIX:
            (count,) = self._rows("SELECT count(*) FROM runs WHERE starts_with(run_key, ?)", [prefix])[0]
            matched = f"it is the start of {count} run key(s)" if count else "no run key starts with it"
            raise NotFound(f"run prefix {key_or_prefix!r} is too short: give at least {MIN_RUN_PREFIX} hex characters "
                           f"of the run key ({matched}); list runs with `actstore runs`")
        rows = self._rows(f"SELECT {self._RUN_COLUMNS} FROM runs WHERE starts_with(run_key, ?)", [prefix])
        if len(rows) > 1:
            raise InvalidArgument(f"run prefix {key_or_prefix!r} is ambiguous: give more characters")
        if not rows:
            raise NotFound(f"unknown run {key_or_prefix!r}: list runs with `actstore runs`")
        return self._run_from_row(rows[0])

    def committed_run(self, key_or_prefix: str) -> RunRecord:
        record = self.run(key_or_prefix)
        if record.status != "committed":
            raise FailedPrecondition(
                f"run {record.run_key[:12]} is {record.status}, not committed: wait for its capture "
                "job (`actstore jobs`), or submit the same capture again to resume it"
            )
        return record

    def runs(self, model_digest: str | None = None, dataset_digest: str | None = None,
             status: str | None = None) -> list[RunRecord]:
        if status is not None and status not in RUN_STATUSES:
            raise InvalidArgument(f"run status {status!r} is not one of {', '.join(RUN_STATUSES)}")
        rows = self._rows(
            f"SELECT {self._RUN_COLUMNS} FROM runs WHERE (? IS NULL OR model_digest = ?) "
            "AND (? IS NULL OR dataset_digest = ?) AND (? IS NULL OR status = ?) ORDER BY created_at",
            [model_digest, model_digest, dataset_digest, dataset_digest, status, status],
        )
        return [self._run_from_row(r) for r in rows]

    # ---- the capture path's unit of work: open, record shards, commit ---------------------------
    def open_run(self, record: RunRecord) -> tuple[RunRecord, set[int]]:
        """Add the run (as running) unless it is known; returns its record and the shards
        already recorded, which a resumed capture skips."""
        self.add_run(record)
        stored = self.find_run(record.run_key)
        assert stored is not None
        if stored.status == "failed":  # a capture that failed before is being resumed
            self.set_run_status(record.run_key, "running")
            stored = replace(stored, status="running")
        return stored, self.recorded_shards(record.run_key, record.num_layers)

    def record_shard(self, chunk_rows: pa.Table) -> None:
        """A shard's chunk rows, after its arrays were written (see `insert_chunks`)."""
        self.insert_chunks(chunk_rows)

    def commit_run(self, record: RunRecord) -> None:
        """Mark the run committed once every shard and row is recorded; DataLoss otherwise."""
        recorded = self.recorded_shards(record.run_key, record.num_layers)
        rows = self.chunk_rows_total(record.run_key)
        if len(recorded) != record.num_shards or rows != record.rows:
            raise DataLoss(f"run {record.run_key[:12]}: {len(recorded)} of {record.num_shards} shards and {rows} "
                           f"of {record.rows} rows recorded; submit the capture again to finish it")
        self.set_run_status(record.run_key, "committed")

    def set_run_status(self, run_key: str, status: str) -> None:
        self._run(
            "UPDATE runs SET status = ?, committed_at = CASE WHEN ? = 'committed' THEN current_timestamp "
            "ELSE committed_at END WHERE run_key = ?",
            [status, status, run_key],
        )

    def delete_run(self, run_key: str) -> None:
        with self._lock:
            self._con.execute("BEGIN")
            for table in ("chunks", "runs"):
                self._con.execute(f"DELETE FROM {table} WHERE run_key = ?", [run_key])
            self._con.execute("DELETE FROM results WHERE list_contains(CAST(run_keys AS VARCHAR[]), ?)", [run_key])
            self._con.execute("COMMIT")

    def failed_runs(self, older_than_seconds: float) -> list[str]:
        """Keys of the `failed` runs created at least ``older_than_seconds`` ago."""
        return [r[0] for r in self._rows(
            "SELECT run_key FROM runs WHERE status = 'failed' AND "
            "epoch(current_timestamp::TIMESTAMP - created_at) >= ? ORDER BY created_at", [older_than_seconds])]

    # ---- chunks -------------------------------------------------------------------------------
    def insert_chunks(self, table: pa.Table) -> None:
        """Insert a batch of chunk rows (CHUNK_SCHEMA). Re-inserting a recorded chunk is a no-op:
        chunk writes are idempotent, so a retried task may report a shard twice."""
        with self._lock:
            self._con.register("incoming_chunks", table.cast(CHUNK_SCHEMA))
            try:
                self._con.execute("INSERT INTO chunks SELECT * FROM incoming_chunks ON CONFLICT DO NOTHING")
            finally:
                self._con.unregister("incoming_chunks")

    def recorded_shards(self, run_key: str, num_layers: int) -> set[int]:
        """Shards with a chunk row for every layer 0..L."""
        rows = self._rows(
            "SELECT shard FROM chunks WHERE run_key = ? GROUP BY shard HAVING count(*) = ?",
            [run_key, num_layers + 1],
        )
        return {r[0] for r in rows}

    def chunk_health(self, run_key: str, num_layers: int) -> ChunkHealth:
        rows = self._rows(
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

    def chunk_checksums(self, run_key: str) -> dict[int, dict[int, tuple[int, int]]]:
        """shard -> layer -> (rows, crc32c) of every chunk row the catalog holds for the run."""
        checksums: dict[int, dict[int, tuple[int, int]]] = {}
        for shard, layer, rows, checksum in self._rows(
                "SELECT shard, layer, rows, checksum FROM chunks WHERE run_key = ?", [run_key]):
            checksums.setdefault(shard, {})[layer] = (rows, checksum)
        return checksums

    def drop_shards(self, run_key: str, shards: list[int], status: str) -> None:
        """Forget the shards' chunk rows and set the run's status, in one transaction (a repair:
        the next capture of the run rewrites those shards)."""
        with self._lock:
            self._con.execute("BEGIN")
            self._con.execute("DELETE FROM chunks WHERE run_key = ? AND list_contains(?, shard)", [run_key, shards])
            self._con.execute("UPDATE runs SET status = ? WHERE run_key = ?", [status, run_key])
            self._con.execute("COMMIT")

    def chunk_rows_total(self, run_key: str) -> int:
        rows = self._rows("SELECT coalesce(sum(rows), 0) FROM chunks WHERE run_key = ? AND layer = 0", [run_key])
        return int(rows[0][0])

    # ---- results ------------------------------------------------------------------------------
    def result(self, result_key: str) -> tuple[bytes, float] | None:
        record = self.result_record(result_key)
        return (record[4], record[5]) if record else None

    def result_record(self, result_key: str) -> tuple[str, int, dict, list[str], bytes, float] | None:
        rows = self._rows("SELECT metric, version, options, run_keys, payload, seconds FROM results "
                          "WHERE result_key = ?", [result_key])
        if not rows:
            return None
        metric, version, options, run_keys, payload, seconds = rows[0]
        return metric, version, json.loads(options), json.loads(run_keys), bytes(payload), seconds

    def put_result(self, result_key: str, metric: str, version: int, options: dict,
                   run_keys: list[str], payload: bytes, seconds: float, replace: bool = False) -> None:
        """Store a result under its key. A stored result stays as it is unless `replace` (a
        recomputation the user asked for): then the new payload and compute time take its place."""
        conflict = ("DO UPDATE SET payload = excluded.payload, seconds = excluded.seconds, "
                    "created_at = now()") if replace else "DO NOTHING"
        self._run(
            "INSERT INTO results (result_key, metric, version, options, run_keys, payload, seconds) "
            f"VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (result_key) {conflict}",
            [result_key, metric, version, json.dumps(options), json.dumps(run_keys), payload, seconds],
        )

    def cached_results(self) -> list[tuple[str, str, int, float]]:
        """(result key, metric, payload bytes, age in seconds) of every stored result, oldest first."""
        return self._rows("SELECT result_key, metric, octet_length(payload), "
                          "epoch(current_timestamp::TIMESTAMP - created_at) FROM results ORDER BY created_at, "
                          "result_key")

    def delete_results(self, result_keys: list[str]) -> None:
        self._run("DELETE FROM results WHERE list_contains(?, result_key)", [result_keys])

    # ---- jobs ---------------------------------------------------------------------------------
    def add_job(self, job: JobRecord) -> None:
        self._run(
            "INSERT INTO jobs (job_id, kind, target, status, request, done, total, error, principal) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [job.job_id, job.kind, job.target, job.status, json.dumps(job.request), job.done,
             job.total, job.error, job.principal],
        )

    def update_job(self, job_id: str, *, status: str | None = None, done: int | None = None,
                   total: int | None = None, error: str | None = None) -> None:
        self._run(
            "UPDATE jobs SET status = coalesce(?, status), done = coalesce(?, done), "
            "total = coalesce(?, total), error = coalesce(?, error), updated_at = now() "
            "WHERE job_id = ?",
            [status, done, total, error, job_id],
        )

    def job(self, job_id: str) -> JobRecord:
        rows = self._rows(
            "SELECT job_id, kind, target, status, request, done, total, error, principal FROM jobs WHERE job_id = ?",
            [job_id],
        )
        if not rows:
            raise NotFound(f"unknown job {job_id!r}: list jobs with `actstore jobs`")
        r = rows[0]
        return JobRecord(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5], r[6], r[7], r[8])

    def latest_job(self, target: str) -> JobRecord | None:
        """The newest job for ``target`` (a run key or result key), if any."""
        rows = self._rows("SELECT job_id FROM jobs WHERE target = ? ORDER BY created_at DESC LIMIT 1", [target])
        return self.job(rows[0][0]) if rows else None

    def jobs(self, status: str | None = None) -> list[JobRecord]:
        if status is not None and status not in JOB_STATUSES:
            raise InvalidArgument(f"job status {status!r} is not one of {', '.join(JOB_STATUSES)}")
        ids = self._rows(
            "SELECT job_id FROM jobs WHERE (? IS NULL OR status = ?) ORDER BY created_at", [status, status]
        )
        return [self.job(r[0]) for r in ids]

    def finished_captures(self, limit: int) -> list[tuple[dict, float]]:
        """(request, seconds from submit to done) of the newest `limit` capture jobs that computed
        something (a cache hit is recorded done at once and never updated)."""
        rows = self._rows("SELECT request, epoch(updated_at - created_at) FROM jobs WHERE kind = 'capture' "
                          "AND status = 'done' AND updated_at > created_at ORDER BY updated_at DESC LIMIT ?", [limit])
        return [(json.loads(r[0]), float(r[1])) for r in rows]

    # ---- principals and audit -----------------------------------------------------------------
    def add_principal(self, name: str, role: str, token_hash: str) -> None:
        if self._rows("SELECT 1 FROM principals WHERE name = ?", [name]):
            raise AlreadyExists(f"principal {name!r} exists: pick another name or revoke it first")
        self._run("INSERT INTO principals (token_hash, name, role) VALUES (?, ?, ?)", [token_hash, name, role])

    def revoke_principal(self, name: str) -> None:
        if not self._rows("SELECT 1 FROM principals WHERE name = ?", [name]):
            raise NotFound(f"no principal named {name!r}")
        self._run("DELETE FROM principals WHERE name = ?", [name])

    def principals(self) -> list[tuple[str, str]]:
        """(name, role) of every token holder, by name; never the hashes."""
        return [(r[0], r[1]) for r in self._rows("SELECT name, role FROM principals ORDER BY name")]

    def principal(self, token_hash: str) -> tuple[str, str] | None:
        rows = self._rows("SELECT name, role FROM principals WHERE token_hash = ?", [token_hash])
        return (rows[0][0], rows[0][1]) if rows else None

    def audit(self, principal: str | None, method: str, target: str, status: str) -> None:
        self._run("INSERT INTO audit (principal, method, target, status) VALUES (?, ?, ?, ?)",
                  [principal, method, target, status])
