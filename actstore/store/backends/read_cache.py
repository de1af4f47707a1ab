"""A read-through cache of an object store in a local directory (a node's NVMe): the chunk
objects a node reads are kept there, so repeated metric jobs on a cluster read them from disk
instead of from S3 again.

It is a zarr store (`zarr.abc.store.Store`, the byte-level interface under the arrays: get,
ranged get, set, list, delete) wrapping the object store's, so zarr and `ZarrArrayStore` use it
as they use any store; only its reads differ. It reads the object store's versions through the
obstore store under it (``objects``: `Backend.objects`), which a remote backend gives:

  * Only chunk objects are cached (keys with a ``/c/`` part: shards, token ids, side chunks);
    metadata documents and markers are small and change, and always come from the object store.
  * A cached copy is named by the object's key and a tag of its version (ETag, size, last
    modified), and every read asks the object store for that version first (a HEAD, no body):
    an object rewritten or deleted through any node is never served from an older copy. What a
    cache saves is the object's bytes, not the round trip.
  * A miss fetches the whole object (one GET, its version from the same response), keeps it
    (written to a temporary file, then renamed: a reader sees it whole or not at all), and serves
    the range asked for from it: a one-layer read of an uncached shard moves the whole shard once.
    Only a suffix of an uncached object (a shard's index, or the sums and details the commit
    reads) is fetched alone and not kept.
  * The directory is bounded (``limit_bytes``): when the copies this process added pass a tenth
    of the limit, the least recently read copies are removed until the directory holds at most
    nine tenths of it. Processes of one node share the directory; each evicts by what it finds.
  * A copy whose bytes were damaged on the local disk fails its chunk's crc32c like any damaged
    chunk; `forget` drops it, and `ZarrArrayStore` then reads the object store once more.

Writes, listings and deletes go to the object store; a delete also drops the local copies.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import threading
from pathlib import Path

import obstore
from zarr.abc.buffer import Buffer, BufferPrototype
from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, Store, SuffixByteRequest
from zarr.storage import WrapperStore

from actstore.errors import ResourceExhausted
from actstore.store.atomic import write_file
from actstore.store.backends.retries import RetryPolicy

log = logging.getLogger(__name__)

CACHED_PART = "/c/"  # the chunk objects of a zarr array: `<array>/c/<coords>`


def _version(meta: dict) -> str:
    """A file-name-safe tag of one version of an object (its ETag, size and time of writing)."""
    seen = f"{meta.get('e_tag')}|{meta['size']}|{meta.get('last_modified')}|{meta.get('version')}"
    return hashlib.sha256(seen.encode()).hexdigest()[:24]


def _within(data: bytes | memoryview, byte_range: ByteRequest | None) -> memoryview:
    """The part of a whole object's bytes a byte range asks for (zarr's ranges)."""
    view = memoryview(data)
    if byte_range is None:
        return view
    if isinstance(byte_range, RangeByteRequest):
        return view[byte_range.start:byte_range.end]
    if isinstance(byte_range, OffsetByteRequest):
        return view[byte_range.offset:]
    if isinstance(byte_range, SuffixByteRequest):
        return view[max(0, len(view) - byte_range.suffix):]
    raise TypeError(f"unexpected byte range {byte_range!r}")


class ReadThroughCache(WrapperStore[Store]):
    """An object store's zarr store (``store``, the obstore store ``objects`` under it, named
    ``url`` in errors) with its chunk objects read through ``folder`` (see the module); the
    blocking reads retried by ``policy``."""

    def __init__(self, store: Store, objects, folder: Path | str, limit_bytes: int, url: str,
                 policy: RetryPolicy | None = None) -> None:
        super().__init__(store)
        self.objects = objects  # its blocking calls run in the caller's thread
        self.folder = Path(folder)
        self.limit_bytes = limit_bytes
        self.url, self.policy = url, policy or RetryPolicy()
        self._added = 0
        self._evicting = threading.Lock()

    def _with_store(self, store: Store) -> ReadThroughCache:
        return type(self)(store, self.objects, self.folder, self.limit_bytes, self.url, self.policy)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ReadThroughCache) and self._store == other._store and self.folder == other.folder

    def __repr__(self) -> str:
        return f"ReadThroughCache({self._store!r}, {str(self.folder)!r})"

    def _copies(self, key: str) -> list[Path]:
        folder = (self.folder / key).parent
        prefix = f"{Path(key).name}~"
        try:
            return [entry for entry in folder.iterdir() if entry.name.startswith(prefix)]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def forget(self, key: str) -> None:
        """Drop every local copy of ``key`` (one whose bytes proved damaged, or a deleted object's)."""
        for copy in self._copies(key):
            copy.unlink(missing_ok=True)

    def forget_under(self, prefix: str) -> None:
        """Drop every local copy of the objects under ``prefix``."""
        shutil.rmtree(self.folder / prefix, ignore_errors=True)

    def read(self, key: str, byte_range: ByteRequest | None = None) -> memoryview | None:
        """An object's bytes (or the range of them asked for), from the local copy of its current
        version where there is one, else from the object store, keeping a copy; None: no object.
        Blocking, in the calling thread (object-store errors are obstore's), retried as a whole by
        the store's policy (`store.backends.retries`) where it fails transiently."""
        return self.policy.call(self.url, f"GET {key}", lambda: self._read(key, byte_range))

    def _read(self, key: str, byte_range: ByteRequest | None) -> memoryview | None:
        if CACHED_PART not in key and byte_range is None:
            try:
                return memoryview(obstore.get(self.objects, key).bytes())
            except FileNotFoundError:
                return None
        if CACHED_PART not in key:
            raise TypeError(f"{key} is not cached: its ranges are the object store's to read")
        try:
            meta = obstore.head(self.objects, key)
        except FileNotFoundError:
            self.forget(key)
            return None
        copy = self.folder / f"{key}~{_version(meta)}"
        try:
            with open(copy, "rb") as f:
                found = f.read()
        except (FileNotFoundError, NotADirectoryError):
            found = None
        if found is not None and len(found) == meta["size"]:
            os.utime(copy)  # recently read: evicted last
            return _within(found, byte_range)
        try:
            if isinstance(byte_range, SuffixByteRequest):  # a shard's index or trailer: not worth the whole
                return memoryview(obstore.get(self.objects, key, options={"range": {"suffix": byte_range.suffix}})
                                  .bytes())
            fetched = obstore.get(self.objects, key)
        except FileNotFoundError:
            self.forget(key)
            return None
        data = fetched.bytes()
        self.forget(key)  # older versions
        try:
            write_file(self.folder / f"{key}~{_version(fetched.meta)}", data)
        except ResourceExhausted as exc:  # a full cache disk costs the copy, never the read
            log.warning("no copy of %s kept in the read cache: %s", key, exc)
            return _within(data, byte_range)
        self._count(len(data))
        return _within(data, byte_range)

    def _count(self, added: int) -> None:
        with self._evicting:
            self._added += added
            if self._added <= self.limit_bytes // 10:
                return
            self._added = 0
        self.evict()

    def evict(self) -> None:
        """Remove the least recently read copies until the directory holds at most 90% of the limit."""
        found = []
        for folder, _, names in os.walk(self.folder):
            for name in names:
                path = Path(folder) / name
                try:
                    stat = path.stat()
                except FileNotFoundError:  # evicted by another process meanwhile
                    continue
                found.append((stat.st_mtime, stat.st_size, path))
        total = sum(size for _, size, _ in found)
        if total <= self.limit_bytes:
            return
        for _, size, path in sorted(found):
            if total <= self.limit_bytes * 9 // 10:
                break
            path.unlink(missing_ok=True)
            total -= size

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
                  ) -> Buffer | None:
        if CACHED_PART not in key:
            return await self._store.get(key, prototype, byte_range)
        found = await asyncio.to_thread(self.read, key, byte_range)
        return None if found is None else prototype.buffer.from_bytes(found)

    async def get_partial_values(self, prototype: BufferPrototype, key_ranges) -> list[Buffer | None]:
        return list(await asyncio.gather(*(self.get(key, prototype, byte_range) for key, byte_range in key_ranges)))

    async def delete(self, key: str) -> None:
        await self._store.delete(key)
        self.forget(key)

    async def delete_dir(self, prefix: str) -> None:
        await self._store.delete_dir(prefix)
        self.forget_under(prefix)

    async def clear(self) -> None:
        await self._store.clear()
        shutil.rmtree(self.folder, ignore_errors=True)

