"""A small real filesystem for tests of a full disk: a tmpfs of a few MB mounted on a folder (as
root, where the kernel allows it; elsewhere the tests that need one are skipped), filled to its
last byte and freed again.

    with small_disk(tmp_path / "disk", 64) as disk:
        ...                 # use the folder
        disk.fill()         # 0 bytes free
        disk.free()         # the filler gone
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


class SmallDisk:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.filler = path / ".filler"

    def available(self) -> int:
        stats = os.statvfs(self.path)
        return stats.f_bavail * stats.f_frsize

    def fill(self) -> None:
        """Write a file until the disk has not one byte left."""
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            for size in (1 << 20, 4096, 1):
                block = b"\0" * size
                while True:
                    try:
                        os.write(fd, block)
                    except OSError:
                        break
        finally:
            os.close(fd)
        assert self.available() == 0

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)


@contextmanager
def small_disk(path: Path, megabytes: int) -> Iterator[SmallDisk]:
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"no small filesystem can be mounted here ({mounted.stderr.strip() or 'mount failed'})")
    try:
        yield SmallDisk(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)
