"""How `ZarrArrayStore` talks to its zarr store: whole objects and byte ranges, many at once in
one call into zarr's event loop (the store's calls are async; a shard write or read makes one
such call, not one per object), and the byte store's failures as our errors (`Backend.failure`).

A store's backend (`store.backends`) offers faster paths where it can, and these take them:

* An obstore store under the zarr store (`Backend.objects`: an object store): a single whole
  object (a pooled shard's PUT, a one-shard read's GET) goes through obstore's blocking call in
  the calling thread instead: the trip through zarr's event-loop thread cost 0.3-0.8 ms of CPU a
  call, a fifth of a shard write's client CPU, and every writer thread of a process queued on
  that one loop thread. The request is the one zarr's ObjectStore makes (`obstore.put` /
  `obstore.get` of the key on its obstore store).
* Keys that are files on this machine (`Backend.directory`: a local store): a single whole file
  is read in the calling thread, as zarr's LocalStore reads it (the file's bytes; absent: None):
  a map task's one-shard read spent ~1 ms a shard in the hop to the loop's thread and back,
  against ~0.3 ms for the read itself. Writes are made in the calling thread as well, as
  LocalStore's own `set` makes them in a worker thread (a temporary file beside the target, then
  a rename: `atomic.write_file`), for the same reason: a capture's shard write waited ~1.2 ms in
  the two hops (the loop's thread, then its executor's).

Any other store (one in memory) takes zarr's own calls. Only zarr's public interface is used
(`zarr.abc.store`, `zarr.buffer`); the store's coroutines run on the store's own event loop
(`store.event_loop`). Objects come back as memoryviews (slices of them are not copies), and go in
as any bytes-like object."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import obstore
from zarr.abc.store import ByteRequest, Store
from zarr.buffer import default_buffer_prototype
from zarr.buffer.cpu import Buffer

from actstore.event_loop import sync
from actstore.store.atomic import write_file
from actstore.store.backends import Backend
from actstore.store.backends.read_cache import ReadThroughCache
from actstore.store.backends.retries import RetryPolicy

# An object up to this size goes in one PUT; a larger one in parts of this size, several at once
# (obstore's multipart upload): S3 serves parts of 8-16 MB at full speed per connection.
PART_BYTES = 16 << 20


def _joined(value):
    """A value to store as one bytes-like object (a list of parts: laid end to end)."""
    if not isinstance(value, list):
        return value
    return b"".join(memoryview(part).cast("B") for part in value)


class StoreCalls:
    """Mixin over ``self._backend`` (the root's `Backend`), ``self._zarr`` (its zarr store, or the
    `ReadThroughCache` in front of it), ``self._objects`` (the obstore store under it, or None:
    `Backend.objects`), ``self._files_at`` (the directory whose files its keys are, or None:
    `Backend.directory`), ``self._cache`` (the read cache, or None), ``self._retry`` (how the
    obstore calls made here are retried: `store.backends.retries`; the zarr store's own calls retry
    themselves) and ``self.root`` (named in errors)."""

    _backend: Backend
    _zarr: Store
    _objects: object | None
    _files_at: Path | None
    _cache: ReadThroughCache | None
    _retry: RetryPolicy
    root: object

    @contextmanager
    def _reported(self) -> Iterator[None]:
        """The byte store's errors as ours (`Backend.errors`; a backend with none leaves them as they are)."""
        try:
            yield
        except self._backend.errors as exc:
            if isinstance(exc, FileNotFoundError):
                raise
            raise self._backend.failure(exc, str(self.root)) from None

    def _exists(self, key: str) -> bool:
        with self._reported():
            return sync(self._zarr.exists(key))

    def _put(self, contents: dict[str, bytes]) -> None:
        self._store(contents)

    def _store(self, contents: dict) -> None:
        """PUT whole objects, all at once (one call into zarr's event loop; one object with an
        obstore store: obstore's blocking call, in this thread; keys that are local files: written
        as LocalStore writes them, in this thread, one after another). Values are bytes-like or,
        without an obstore store, also lists of parts laid end to end (`atomic.write_file`)."""
        if self._files_at is not None:
            if self._zarr.read_only:  # as LocalStore's `set` refuses
                raise ValueError("store was opened in read-only mode and does not support writing")
            for key, value in contents.items():
                write_file(self._files_at / key, value)
            return
        if self._objects is not None and len(contents) == 1:
            [(key, value)] = contents.items()
            with self._reported():
                self._retry.call(str(self.root), f"PUT {key}",
                                 lambda: obstore.put(self._objects, key, value, chunk_size=PART_BYTES))
            return

        async def put() -> None:
            if self._objects is not None:  # the request zarr's ObjectStore makes, with the part size
                await asyncio.gather(*(self._retry.call_async(
                    str(self.root), f"PUT {key}",
                    lambda key=key, value=value: obstore.put_async(self._objects, key, value, chunk_size=PART_BYTES))
                    for key, value in contents.items()))
                return
            await asyncio.gather(*(self._zarr.set(key, Buffer.from_bytes(_joined(value)))
                                   for key, value in contents.items()))

        with self._reported():
            sync(put())

    def _fetch(self, requests: list[tuple[str, ByteRequest | None]]) -> list[memoryview | None]:
        """GET objects or byte ranges of them, all at once; None for an absent object. One whole
        object: obstore's blocking call (an obstore store) or the file's bytes (local files, as
        zarr's LocalStore reads them), in this thread; whole local files one after another in
        this thread (no round trip to wait on)."""
        local = self._files_at is not None
        if len(requests) > 1 and local and all(r is None for _, r in requests):
            # several whole local files (an int8 shard and its scales): each in this thread too
            return [self._fetch([request])[0] for request in requests]
        if len(requests) == 1 and requests[0][1] is None and (self._objects is not None or local):
            key = requests[0][0]
            try:
                with self._reported():
                    if self._cache is not None:  # None for an absent object
                        return [self._cache.read(key)]
                    found = (self._retry.call(str(self.root), f"GET {key}",
                                              lambda: obstore.get(self._objects, key).bytes())
                             if self._objects is not None else (self._files_at / key).read_bytes())
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                return [None]
            return [memoryview(found)]

        async def get() -> list[memoryview | None]:
            prototype = default_buffer_prototype()
            found = await asyncio.gather(*(self._zarr.get(key, prototype, byte_range) for key, byte_range in requests))
            return [None if data is None else memoryview(data.as_numpy_array()) for data in found]

        with self._reported():
            return sync(get()) if requests else []

    def _get(self, key: str) -> bytes | None:
        found = self._fetch([(key, None)])[0]
        return None if found is None else bytes(found)

    def _listed(self, method: str, prefix: str) -> list[str]:
        """`list_dir` or `list_prefix` of the zarr store (made inside the event loop: the
        object store's listing needs a running loop)."""

        async def collect() -> list[str]:
            return [name async for name in getattr(self._zarr, method)(prefix)]

        with self._reported():
            return sync(collect())
