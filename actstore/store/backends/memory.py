"""In-memory stores for tests: ``memory://NAME`` is zarr's MemoryStore over one dict a name and
process, so two opens of the same root in one process see the same bytes (and a store opened
again after its objects were dropped finds them). No other process sees them: a server, whose
work runs in Ray workers, refuses such a store (`spans_processes`). It has no files area."""

from __future__ import annotations

from zarr.abc.buffer import Buffer
from zarr.storage import MemoryStore

from actstore.errors import InvalidArgument
from actstore.store.backends import register
from actstore.store.backends.base import Backend, Options
from actstore.store.backends.retries import RetryPolicy

_STORES: dict[str, dict[str, Buffer]] = {}  # NAME -> its objects, for the life of the process


class MemoryBackend(Backend):
    scheme = "memory"
    spans_processes = False

    def open(self, root: str, options: Options | None, retry: RetryPolicy) -> MemoryStore:
        name = str(root).split("://", 1)[1].strip("/")
        if not name:
            raise InvalidArgument(f"store {root} names no memory store: give memory://NAME")
        return MemoryStore(_STORES.setdefault(name, {}))  # setdefault is atomic: threads share one dict


register(MemoryBackend())
