"""A full local disk as our error: RESOURCE_EXHAUSTED naming the path and the space needed.

A write that finds no space (ENOSPC, or a quota's EDQUOT; DuckDB reports the same as an IO error
whose message says so) is not a bug and not a flaky network: retrying it fails the same way until
someone frees space. `full` tells such an error; `no_space` makes the error a caller raises, with
what the disk holds free now and what the write needed (when the caller knows).
"""

from __future__ import annotations

import errno
import re
import shutil
from pathlib import Path

from actstore.errors import ResourceExhausted

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_FULL_TEXT = ("No space left on device", "Disk quota exceeded", "not enough space", "disk is full")
_QUOTED_PATH = re.compile(r'"(/[^"]+)"')


def full(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) is a write that found the disk full."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, ResourceExhausted):
            return False  # already ours
        if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
            return True
        if any(text in str(exc) for text in _FULL_TEXT):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _mb(count: int) -> str:
    return f"{count / 2**20:.1f} MB" if count >= 2**20 else f"{count} bytes"


def free_bytes(path: Path | str) -> int | None:
    """The bytes free for this user on the disk holding ``path`` (its nearest existing parent)."""
    path = Path(path)
    for candidate in (path, *path.parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return None


def no_space(exc: BaseException, path: Path | str | None, needed: int | None = None, what: str = "a write",
             fallback: Path | str | None = None) -> ResourceExhausted:
    """RESOURCE_EXHAUSTED for ``exc``, a write of ``what`` that found the disk of ``path`` full
    (None: the path the error names, an OSError's file or a quoted path in DuckDB's message, else
    ``fallback``)."""
    named = getattr(exc, "filename", None) or next(iter(_QUOTED_PATH.findall(str(exc))), None)
    where = Path(path or named or fallback or ".")
    free = free_bytes(where)
    room = f"{_mb(free)} free" if free is not None else "its free space unknown"
    need = f", {_mb(needed)} needed" if needed else ""
    return ResourceExhausted(f"no space left on the disk of {where} for {what} ({room}{need}): free space on "
                             "that disk (or move the store, ACTSTORE_STORE / ACTSTORE_SERVER_DIR, to a larger one), "
                             "then submit again: what was stored is kept")
