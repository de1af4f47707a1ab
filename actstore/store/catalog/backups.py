"""Backups of the catalog file: made, listed, kept to the last K, and restored.

A backup is a copy of the checkpointed catalog file in ``backups/`` beside it (for an s3://
store the catalog lives in the server's own directory, and so do its backups), named by its UTC
time so the names sort by age: ``backups/catalog-20261124T200501.123456Z.duckdb``.

How: DuckDB copies its own database (``ATTACH`` a new file, ``COPY FROM DATABASE`` into it,
``DETACH``) on the catalog's one connection, under the catalog's lock. That copy runs in one
transaction, so it is a consistent point in time even while jobs are writing (their next statement
waits for it), and the result is a DuckDB file that opens as it is: a restore is a file move, with
no re-import (``EXPORT DATABASE`` would write every table as CSV or Parquet and need an ``IMPORT``
into a fresh file to come back). Not a byte copy of the checkpointed file: DuckDB locks the file
with a POSIX lock, which the kernel drops when the process closes *any* descriptor of that file,
so opening the catalog to copy it would leave it unlocked for a second server (a test checks).

`Catalog.backup` takes the lock and makes the copy; this module names, checks, publishes and restores.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import uuid
from datetime import UTC, datetime
from pathlib import Path

import duckdb

from actstore.errors import DataLoss, FailedPrecondition, NotFound, Unavailable
from actstore.store.atomic import FILE_MODE, fsync_path

BACKUP_DIR = "backups"
_NAME = re.compile(r"^catalog-\d{8}T\d{6}\.\d{6}Z\.duckdb$")


def backup_dir(catalog_path: Path) -> Path:
    return catalog_path.parent / BACKUP_DIR


def list_backups(catalog_path: Path) -> list[Path]:
    """The catalog's backups, oldest first."""
    folder = backup_dir(catalog_path)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if _NAME.match(p.name))


def latest_backup(catalog_path: Path) -> Path | None:
    found = list_backups(catalog_path)
    return found[-1] if found else None


def staging_path(catalog_path: Path) -> Path:
    """A new, absent file in the backup folder for a copy to be published (see `publish`)."""
    folder = backup_dir(catalog_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f".catalog.staging-{uuid.uuid4().hex}.duckdb"


def check_backup(path: Path) -> None:
    """DataLoss unless ``path`` opens as a catalog (read-only: nothing is written to it)."""
    try:
        con = duckdb.connect(str(path), read_only=True)
        try:
            con.execute("SELECT count(*) FROM runs").fetchall()
        finally:
            con.close()
    except duckdb.Error as exc:
        raise DataLoss(f"the backup {path} is not a usable catalog ({str(exc).splitlines()[0]}): pick an older "
                       "one, or rebuild the catalog from the store with `actstore catalog rebuild`") from None


def publish(staged: Path, catalog_path: Path, keep: int) -> Path:
    """Check the staged copy, rename it to its timestamped name, and remove all but the newest ``keep``."""
    try:
        fsync_path(staged)
        os.chmod(staged, FILE_MODE)
        check_backup(staged)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        target = backup_dir(catalog_path) / f"catalog-{stamp}.duckdb"
        os.replace(staged, target)
    finally:
        staged.unlink(missing_ok=True)
    fsync_path(target.parent)
    for old in list_backups(catalog_path)[:-keep]:
        old.unlink(missing_ok=True)
    return target


def wal_path(catalog_path: Path) -> Path:
    """DuckDB's write-ahead log of a database file: beside it, its name plus ``.wal``."""
    return catalog_path.with_name(catalog_path.name + ".wal")


def aside_path(catalog_path: Path) -> Path:
    """Where a catalog file that is being replaced goes (its log: the same name plus ``.wal``)."""
    return catalog_path.with_name(f"{catalog_path.name}.replaced-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S.%fZ')}")


def move_wal_aside(catalog_path: Path, aside: Path) -> Path | None:
    """Move the catalog's write-ahead log, if there is one, to ``aside``'s (where it went, else
    None). A log left by a server that died holds that file's last transactions: DuckDB replays it
    onto whatever file has the catalog's name next, and refuses a file it does not belong to ("WAL
    does not match database file"), so a new file must never meet it; kept, it opens with its file."""
    wal = wal_path(catalog_path)
    if not wal.exists():
        return None
    target = wal_path(aside)
    os.replace(wal, target)
    return target


def _held_by_another_process(catalog_path: Path) -> str | None:
    """DuckDB's lock message if another process has the catalog open, else None."""
    try:
        duckdb.connect(str(catalog_path)).close()
    except duckdb.Error as exc:
        text = str(exc).splitlines()[0]
        if re.search(r"\block\b", text, re.IGNORECASE):
            return text
    return None  # free, or damaged (which is why one restores)


def restore(catalog_path: Path, backup: Path | None = None) -> tuple[Path, Path | None]:
    """Put ``backup`` (default: the latest) in the catalog's place; the current file, if any, and
    its write-ahead log are moved aside, never deleted. Returns (backup, where the old file went).
    Offline only: refused while a server holds the catalog."""
    if backup is None:
        backup = latest_backup(catalog_path)
        if backup is None:
            raise NotFound(f"there are no backups of {catalog_path} in {backup_dir(catalog_path)}: name a backup "
                           "file, or rebuild the catalog from the store with `actstore catalog rebuild`")
    if not backup.is_file():
        raise NotFound(f"no backup file {backup}: list them with `ls {backup_dir(catalog_path)}`")
    held = _held_by_another_process(catalog_path) if catalog_path.exists() else None
    if held is not None:
        raise Unavailable(f"the catalog {catalog_path} is in use by a running actstore server ({held}): stop the "
                          "server first, then restore")
    if backup.resolve() == catalog_path.resolve():
        raise FailedPrecondition("the backup is the catalog itself: name a file in the backups folder")
    check_backup(backup)
    aside = aside_path(catalog_path)
    move_wal_aside(catalog_path, aside)  # a stale log must never be replayed onto the restored file
    if catalog_path.exists():
        os.replace(catalog_path, aside)
    else:
        aside = None
    fd, staging = tempfile.mkstemp(prefix=f".{catalog_path.name}.staging-", dir=catalog_path.parent)
    os.close(fd)
    try:
        shutil.copyfile(backup, staging)
        fsync_path(staging)
        os.chmod(staging, FILE_MODE)
        os.replace(staging, catalog_path)
    finally:
        Path(staging).unlink(missing_ok=True)
    fsync_path(catalog_path.parent)
    return backup, aside
