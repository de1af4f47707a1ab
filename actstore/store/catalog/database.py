"""The DuckDB catalog: what exists, by digest and key.

One process owns it (the server, or the embedded client's in-process server): DuckDB allows a
single writer. `Catalog` owns the file's one connection and its lock; the statements of each table
family are in their own module, reached as attributes: `catalog.models`, `.datasets`, `.runs`,
`.label_sets`, `.chunks`, `.results`, `.jobs`, `.principals`, `.audit` (`store.catalog.models` and so on). The
records they return are defined in `store.catalog.schema` and importable from the package (`store.catalog`).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb

from actstore.errors import ActStoreError, DataLoss, Unavailable
from actstore.store import disk
from actstore.store.catalog import backups
from actstore.store.catalog.audit import Audit
from actstore.store.catalog.chunks import Chunks
from actstore.store.catalog.datasets import Datasets
from actstore.store.catalog.jobs import Jobs
from actstore.store.catalog.label_sets import LabelSets
from actstore.store.catalog.models import Models
from actstore.store.catalog.principals import Principals
from actstore.store.catalog.results import Results
from actstore.store.catalog.runs import Runs
from actstore.store.catalog.schema import SCHEMA

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
    """Thread-safe access to the catalog file. All statements go through one connection, the
    table families' too (`rows`, `execute`, `connection`)."""

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
        self.models = Models(self)
        self.datasets = Datasets(self)
        self.label_sets = LabelSets(self)
        self.chunks = Chunks(self)
        self.runs = Runs(self, self.chunks)
        self.results = Results(self)
        self.jobs = Jobs(self)
        self.principals = Principals(self)
        self.audit = Audit(self)

    def close(self) -> None:
        with self._lock:
            self._con.close()

    def backup(self, keep: int) -> Path:
        """A consistent copy of the catalog in ``backups/``, keeping the newest ``keep`` (see
        `store.catalog.backups` for why DuckDB's own copy under the lock)."""
        staged = backups.staging_path(self.path)
        with self._lock:
            try:
                self._con.execute("ATTACH '" + str(staged).replace("'", "''") + "' AS actstore_backup")
                try:
                    name = self._con.execute("SELECT current_database()").fetchone()[0].replace('"', '""')
                    self._con.execute(f'COPY FROM DATABASE "{name}" TO actstore_backup')
                finally:
                    self._con.execute("DETACH actstore_backup")
            except BaseException as exc:
                staged.unlink(missing_ok=True)
                if disk.full(exc):
                    size = sum(p.stat().st_size for p in (self.path, backups.wal_path(self.path)) if p.exists())
                    raise disk.no_space(exc, staged.parent, size, "a catalog backup") from None
                raise
        return backups.publish(staged, self.path, keep)

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A new connection to the same database, with its own transactions, for the read-only
        SQL endpoint (`store.catalog.sql`); the caller closes it."""
        with self._lock:
            return self._con.cursor()

    def rows(self, sql: str, params: list | tuple = ()) -> list[tuple]:
        """The rows of one statement."""
        with self._lock:
            return self._con.execute(sql, params).fetchall()

    def execute(self, sql: str, params: list | tuple = ()) -> None:
        """Run one statement for its effect."""
        with self._lock, self._writing():
            self._con.execute(sql, params)

    @contextmanager
    def connection(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """The connection, held under the lock, for statements that must run together (a
        transaction, a registered Arrow table)."""
        with self._lock, self._writing():
            yield self._con

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """A write that finds the catalog's disk full as RESOURCE_EXHAUSTED naming it (DuckDB keeps
        answering reads, and writes again once there is space)."""
        try:
            yield
        except duckdb.Error as exc:
            if disk.full(exc):
                raise disk.no_space(exc, None, None, "the catalog", fallback=self.path) from None
            raise
