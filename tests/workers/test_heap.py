"""`workers/heap.unmap_large_frees`: after it, a large buffer is a mapping of its own (handed back
to the OS on free) even once glibc's dynamic rule would have served it from the heap."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")

SCRIPT = textwrap.dedent("""
    import ctypes, sys

    import numpy as np

    from actstore.workers.heap import unmap_large_frees


    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                         "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    took = unmap_large_frees() if sys.argv[1] == "fix" else None
    big = np.ones(8 << 20, np.uint8)
    del big  # a freed 8 MiB mapping: glibc's dynamic threshold rises to 8 MiB
    before = libc.mallinfo2().hblkhd
    buffer = np.ones(2 << 20, np.uint8)
    print(took, libc.mallinfo2().hblkhd - before)
""")


def _mapped_bytes(mode: str) -> tuple[str, int]:
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    took, mapped = done.stdout.split()
    return took, int(mapped)


def test_a_large_buffer_is_mapped_after_larger_ones_were_freed():
    assert _mapped_bytes("default") == ("None", 0)  # glibc's default: from the heap, kept there on free
    took, mapped = _mapped_bytes("fix")
    assert took == "True" and mapped >= 2 << 20
