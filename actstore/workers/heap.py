"""A metric task's process hands large freed buffers back to the OS at once.

glibc's malloc serves a request of at least `M_MMAP_THRESHOLD` bytes with a mapping of its own and
unmaps it on free; smaller requests are carved from the heap (and per-thread arenas), which keeps
freed space for reuse. By default the threshold is dynamic: every freed mapping of up to 32 MiB
raises it to that size (mallopt(3)). A metric task frees buffers of many such sizes (zarr's
decoded shards in its reader threads, a panel's read buffer, the float64 pieces it upcasts) while
it holds others, so after the first frees every later buffer comes from the heap, and the heap
keeps the holes between the blocks still held. Measured on one Gram tile task (16 runs x 7 blocks
x 384, a 2,560-row panel, `server/gram_matrix.py`): the process grew 424 MiB for 289 MiB of live
arrays (tracemalloc's peak) and still held 355 MiB after the task; with the threshold fixed at
1 MiB (which also turns the dynamic rule off), 317 MiB and 29 MiB, and the task was no slower
(7.6-18.5 s against 18.4-27.6 s, alternated on a loaded 2-core machine).

Metric tasks and the server's own process call this: a capture replica's torch allocations keep
glibc's defaults. The server's process also caps glibc's arenas (`limit_arenas`: by default one per
thread that allocates at once, up to 8 per core, each keeping its own freed space; the server's 32
request threads spread small allocations over all of them) and hands freed heap back to the OS
from time to time (`give_back`, malloc_trim(3)). Elsewhere than glibc they do nothing.
"""

from __future__ import annotations

import ctypes
import functools

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter numbers
M_ARENA_MAX = -8
MMAP_THRESHOLD_BYTES = 1 << 20


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018 - glibc has both; another C library may not
        return libc
    except (OSError, AttributeError):
        return None


@functools.cache
def unmap_large_frees() -> bool:
    """Fix this process's mmap threshold at `MMAP_THRESHOLD_BYTES` (once per process); whether the
    C library took it."""
    libc = _libc()
    return bool(libc and libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


def limit_arenas(count: int) -> bool:
    """At most `count` malloc arenas in this process from now on; whether the C library took it."""
    libc = _libc()
    return bool(libc and libc.mallopt(M_ARENA_MAX, count))


def give_back() -> bool:
    """Return the free pages at the top of every arena and the wholly free ones inside them to the OS
    (malloc_trim(0)); whether any memory was released."""
    libc = _libc()
    return bool(libc and libc.malloc_trim(0))
