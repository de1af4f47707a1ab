"""Directories and files that appear whole or not at all.

Every writer of a folder that readers may open concurrently (datasets, registered models, model
caches, training checkpoints) and every small status file goes through here, so all of them stage
beside the target, fsync every file, rename into place and fsync the parent. A crash at any moment
leaves either nothing or the complete target, plus at most a stale staging folder that a later
writer of the same target removes.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from actstore.store import disk

# A staging folder older than this belongs to a writer that crashed; younger ones may be live.
STALE_STAGING_SECONDS = 3600.0
# mkdtemp makes folders 0700 and mkstemp files 0600; the store is shared by a team.
DIR_MODE = 0o755
FILE_MODE = 0o644


def fsync_tree(root: Path) -> None:
    """fsync every file below ``root`` and every folder, so a rename publishes durable bytes."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):  # a link's target is not ours (and may not exist)
                fsync_path(path)
        fsync_path(dirpath)


def fsync_path(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_stale_staging(parent: Path, prefix: str) -> None:
    now = time.time()
    for stale in parent.glob(glob.escape(prefix) + "*"):
        try:
            if now - stale.lstat().st_mtime > STALE_STAGING_SECONDS:
                if stale.is_dir() and not stale.is_symlink():
                    shutil.rmtree(stale, ignore_errors=True)
                else:
                    stale.unlink()
        except OSError:
            pass  # removed by another writer meanwhile


@contextmanager
def atomic_directory(target: Path | str, needed: int | None = None, what: str = "a folder") -> Iterator[Path]:
    """Yield an empty staging folder; when the block ends cleanly it becomes ``target``.

    Raises ``FileExistsError`` when ``target`` exists by the time the block ends (another writer
    won the race): the caller decides whether the existing folder is acceptable. On any error the
    staging folder is removed and ``target`` is untouched; a full disk is RESOURCE_EXHAUSTED naming
    ``target`` and, where the caller gives it, the space ``what`` needs (`disk.no_space`).
    """
    target = Path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        prefix = f".{target.name}.staging-"
        _remove_stale_staging(target.parent, prefix)
        staging = Path(tempfile.mkdtemp(prefix=prefix, dir=target.parent))
    except OSError as exc:
        if disk.full(exc):
            raise disk.no_space(exc, target, needed, what) from None
        raise
    try:
        os.chmod(staging, DIR_MODE)
        try:
            yield staging
            fsync_tree(staging)
        except OSError as exc:
            if disk.full(exc):
                raise disk.no_space(exc, target, needed, what) from None
            raise
        # rename(2) silently replaces an *empty* folder, so look first; the rename's error covers
        # a target that appears after this look.
        if os.path.lexists(target):
            raise FileExistsError(str(target))
        try:
            os.rename(staging, target)
        except OSError as e:
            if os.path.lexists(target):
                raise FileExistsError(str(target)) from e
            raise
        fsync_path(target.parent)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    """Replace the file at ``path`` with ``data``: readers see the old or the new bytes, never a part."""
    path = Path(path)
    staging = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        prefix = f".{path.name}.staging-"
        _remove_stale_staging(path.parent, prefix)
        fd, staging = tempfile.mkstemp(prefix=prefix, dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(staging, FILE_MODE)
        os.replace(staging, path)
    except BaseException as exc:
        if staging is not None:
            Path(staging).unlink(missing_ok=True)
        if isinstance(exc, OSError) and disk.full(exc):
            raise disk.no_space(exc, path, len(data), f"the file {path.name}") from None
        raise
    fsync_path(path.parent)


def atomic_write_text(path: Path | str, text: str) -> None:
    """``atomic_write_bytes`` for UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"))


def write_file(path: Path, data) -> None:
    """Replace the file at ``path`` with ``data`` (bytes-like, or a list of bytes-like parts laid
    end to end) as zarr's LocalStore writes a file: into a new temporary file beside it, then
    renamed over it, so a reader sees the old bytes or the new, never a part (no fsync, as
    LocalStore: a killed process loses nothing the kernel has; the store's writers rewrite what a
    crashed machine lost). The array store's fast path for a local store's objects, and the read
    cache's copies (`store.format.store_calls`, `store.backends.read_cache`)."""
    staging = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(staging, "xb") as f:  # a new file, with the process's umask (shared stores: 0644)
            for part in data if isinstance(data, list) else [data]:
                f.write(part)  # a large part goes to the file as it is, not through the buffer
        os.replace(staging, path)
    except BaseException as exc:
        staging.unlink(missing_ok=True)
        if isinstance(exc, OSError) and disk.full(exc):
            parts = data if isinstance(data, list) else [data]
            raise disk.no_space(exc, path, sum(memoryview(p).nbytes for p in parts), f"the object {path.name}") \
                from None
        raise
