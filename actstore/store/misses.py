"""A zarr store wrapper that counts the reads of absent keys, so a reader notices a missing shard
from the read itself: Zarr reads an absent chunk or shard as its fill value, and asking first
whether the object exists costs one more round trip per shard on an object store."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable

from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import WrapperStore


class MissCountingStore(WrapperStore[Store]):
    """Every store call is the wrapped store's; `misses(keys)` says how often each key was read
    and found absent so far. A reader compares the counts of its keys before and after its read:
    a key whose count grew was absent during the read (also when other threads read it too)."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self._misses: Counter[str] = Counter()
        self._lock = threading.Lock()

    def misses(self, keys: Iterable[str]) -> list[int]:
        with self._lock:
            return [self._misses[key] for key in keys]

    def _missed(self, key: str) -> None:
        with self._lock:
            self._misses[key] += 1

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None:
        found = await self._store.get(key, prototype, byte_range)
        if found is None:
            self._missed(key)
        return found

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        key_ranges = list(key_ranges)
        found = await self._store.get_partial_values(prototype, key_ranges)
        for (key, _), value in zip(key_ranges, found):
            if value is None:
                self._missed(key)
        return found
