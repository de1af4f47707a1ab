"""How `ZarrArrayStore` talks to its zarr store: whole objects and byte ranges, many at once in
one call into zarr's event loop (the store's calls are async; a shard write or read makes one
such call, not one per object), and object-store failures as our errors (`objects.failure`).

A single whole object of an object store (a pooled shard's PUT, a one-shard read's GET) goes
through obstore's blocking call in the calling thread instead: the trip through zarr's event-loop
thread cost 0.3-0.8 ms of CPU a call, a fifth of a shard write's client CPU, and every writer
thread of a process queued on that one loop thread. The request is the one zarr's ObjectStore
makes (`obstore.put` / `obstore.get` of the key on its obstore store). A single whole file of a
local store is read in the calling thread too, as zarr's LocalStore reads it (the file's bytes;
absent: None): a map task's one-shard read spent ~1 ms a shard in the hop to the loop's thread
and back, against ~0.3 ms for the read itself. A local store's writes are made in the calling
thread as well, as LocalStore's own `set` makes them in a worker thread (a temporary file beside
the target, then a rename: `write_file`), for the same reason: a capture's shard write waited
~1.2 ms in the two hops (the loop's thread, then its executor's).

Only zarr's public interface is used (`zarr.abc.store`, `zarr.buffer`, `zarr.storage`); the
store's coroutines run on the store's own event loop (`store.event_loop`). Objects come back as
memoryviews (slices of them are not copies), and go in as any bytes-like object."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import obstore
from obstore.exceptions import BaseError as ObjectStoreError
from zarr.abc.store import ByteRequest, Store
from zarr.buffer import default_buffer_prototype
from zarr.buffer.cpu import Buffer
from zarr.storage import LocalStore

from actstore.event_loop import sync
from actstore.store import disk, objects
from actstore.store.retries import RetryPolicy

if TYPE_CHECKING:
    from actstore.store.read_cache import ReadThroughCache


def write_file(path: Path, data) -> None:
    """Replace the file at ``path`` with ``data`` (bytes-like, or a list of bytes-like parts laid
    end to end) as zarr's LocalStore writes a file: into a new temporary file beside it, then
    renamed over it, so a reader sees the old bytes or the new, never a part (no fsync, as
    LocalStore: a killed process loses nothing the kernel has; the store's writers rewrite what a
    crashed machine lost)."""
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


# An object up to this size goes in one PUT; a larger one in parts of this size, several at once
# (obstore's multipart upload): S3 serves parts of 8-16 MB at full speed per connection.
PART_BYTES = 16 << 20


def _joined(value):
    """A value to store as one bytes-like object (a list of parts: laid end to end)."""
    if not isinstance(value, list):
        return value
    return b"".join(memoryview(part).cast("B") for part in value)


class StoreCalls:
    """Mixin over ``self._zarr`` (a zarr store: `store.byte_stores`), ``self._url`` (whether it is
    an object store), ``self._objects`` (then its obstore store), ``self._cache`` (the zarr store
    where it is a `ReadThroughCache`, else None), ``self._retry`` (how an object store's calls are
    retried: `store.retries`; the zarr store's own calls retry themselves) and ``self.root`` (named
    in errors)."""

    _zarr: Store
    _url: bool
    _objects: object
    _cache: ReadThroughCache | None
    _retry: RetryPolicy
    root: object

    @contextmanager
    def _reported(self) -> Iterator[None]:
        """Object-store errors as ours (a local store's errors are left as they are)."""
        try:
            yield
        except (ObjectStoreError, OSError) as exc:
            if not self._url or isinstance(exc, FileNotFoundError):
                raise
            raise objects.failure(exc, str(self.root)) from None

    def _exists(self, key: str) -> bool:
        with self._reported():
            return sync(self._zarr.exists(key))

    def _put(self, contents: dict[str, bytes]) -> None:
        self._store(contents)

    def _store(self, contents: dict) -> None:
        """PUT whole objects, all at once (one call into zarr's event loop; one object on an
        object store: obstore's blocking call, in this thread; a local store's files: written
        as LocalStore writes them, in this thread, one after another). Values are bytes-like (a
        local store's also a list of parts, laid end to end: `write_file`)."""
        if isinstance(self._zarr, LocalStore):
            if self._zarr.read_only:  # as LocalStore's `set` refuses
                raise ValueError("store was opened in read-only mode and does not support writing")
            for key, value in contents.items():
                write_file(self._zarr.root / key, value)
            return
        if self._url and len(contents) == 1:
            [(key, value)] = contents.items()
            with self._reported():
                self._retry.call(str(self.root), f"PUT {key}",
                                 lambda: obstore.put(self._objects, key, value, chunk_size=PART_BYTES))
            return

        async def put() -> None:
            if self._url:  # the request zarr's ObjectStore makes, with the part size
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
        object: obstore's blocking call (an object store) or the file's bytes (a local store, as
        zarr's LocalStore reads them), in this thread; whole files of a local store one after
        another in this thread (no round trip to wait on)."""
        if len(requests) > 1 and isinstance(self._zarr, LocalStore) and all(r is None for _, r in requests):
            # several whole files of a local store (an int8 shard and its scales): each in this thread too
            return [self._fetch([request])[0] for request in requests]
        if len(requests) == 1 and requests[0][1] is None and (self._url or isinstance(self._zarr, LocalStore)):
            key = requests[0][0]
            try:
                with self._reported():
                    if self._cache is not None:  # None for an absent object
                        return [self._cache.read(key)]
                    found = (self._retry.call(str(self.root), f"GET {key}",
                                              lambda: obstore.get(self._objects, key).bytes()) if self._url
                             else (self._zarr.root / key).read_bytes())
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
