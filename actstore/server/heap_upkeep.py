"""The server process's heap: large frees unmapped at once, few malloc arenas, and freed pages handed
back to the OS every few seconds, so the memory a large query or a burst of requests used does not
stay with the server.

glibc keeps what a process frees for its next allocations: a freed block inside a heap stays
mapped, every thread that allocates at once may get an arena of its own (up to 8 per core, each
with its own free space), and after a large buffer is freed the mmap threshold rises to its size,
so later buffers of up to 32 MiB come from the heap and stay (`workers.heap`). The server's 32
request threads, its query reductions and the sandboxes of its SQL queries all allocate and free
that way. `HeapUpkeep` fixes the mmap threshold (1 MiB) and caps the arenas when the server starts,
and a thread calls malloc_trim(0) every `seconds` (a few ms each on a server's heap).
"""

from __future__ import annotations

import threading

from actstore.workers.heap import give_back, limit_arenas, unmap_large_frees

ARENAS = 4  # glibc's default on this 2-core machine is 16; 4 kept the cached path's rate (bench/soak.py)


class HeapUpkeep:
    def __init__(self, seconds: float = 5.0) -> None:
        unmap_large_frees()
        limit_arenas(ARENAS)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._trim_forever, args=(seconds,), name="heap-upkeep", daemon=True)
        self._thread.start()

    def _trim_forever(self, seconds: float) -> None:
        while not self._stop.wait(seconds):
            give_back()

    def stop(self) -> None:
        self._stop.set()
