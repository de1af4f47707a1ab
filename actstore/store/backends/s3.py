"""S3-compatible object stores, through obstore (Rust ``object_store``): the ``s3`` backend.

``s3://bucket/prefix`` URLs open a zarr ``ObjectStore`` over obstore's ``S3Store``, configured
by the standard AWS variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``), so MinIO, Ceph and AWS all work. Every call is
retried where it fails transiently, by the store's `retries.RetryPolicy` (`RetryingStore` for the
calls zarr makes; the blocking calls of this package through `RetryPolicy.call`); a request's own
time is bounded by the client's timeouts (``CLIENT_OPTIONS``, the policy's `timeout`).
Errors of the object store become ours: a missing bucket or refused credentials are
FAILED_PRECONDITION naming the variable to fix, a call that spent its retries UNAVAILABLE.
The files area is objects under the same prefix (`files.ObjectFiles` over `s3_store`).
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator, Iterable
from datetime import timedelta
from functools import partial
from urllib.parse import urlparse

from obstore.exceptions import BaseError as ObjectStoreError
from obstore.store import S3Store
from zarr.abc.buffer import Buffer, BufferPrototype
from zarr.abc.store import ByteRequest
from zarr.storage import ObjectStore, WrapperStore

from actstore.errors import ActStoreError, FailedPrecondition, InvalidArgument, Unavailable
from actstore.store.backends import register
from actstore.store.backends.base import Backend
from actstore.store.backends.files import ObjectFiles
from actstore.store.backends.retries import RetryPolicy, obstore_retry

# Bounded: a request that gets no answer fails within the policy's timeout and is retried.
CLIENT_OPTIONS = {"connect_timeout": timedelta(seconds=5)}
_CREDENTIAL_CODES = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken",
                     "ExpiredToken")


# The standard AWS variables and the obstore settings they become (first variable that is set).
_AWS_VARIABLES = {
    "endpoint": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
    "access_key_id": ("AWS_ACCESS_KEY_ID",),
    "secret_access_key": ("AWS_SECRET_ACCESS_KEY",),
    "token": ("AWS_SESSION_TOKEN",),
    "region": ("AWS_REGION", "AWS_DEFAULT_REGION"),
}
S3Config = tuple[tuple[str, str], ...]  # the backend's `Options`: (obstore setting, value), sorted


def config_from_env() -> S3Config:
    """The S3 configuration the AWS variables of this process give, as a hashable value that a
    store handle carries to every worker (so workers need no variables of their own)."""
    found = {}
    for key, names in _AWS_VARIABLES.items():
        value = next((os.environ[name] for name in names if os.environ.get(name)), None)
        if value is not None:
            found[key] = value
    return tuple(sorted(found.items()))


def s3_store(url: str, config: S3Config | None = None, policy: RetryPolicy | None = None) -> S3Store:
    """obstore's S3Store for ``s3://bucket/prefix`` with ``config`` (default: this process's AWS
    variables); plain-HTTP endpoints (MinIO on a LAN, a test server on loopback) are allowed.
    obstore retries nothing itself: its callers retry by ``policy`` (`retries`)."""
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise InvalidArgument(f"store URL {url!r} is not s3://bucket/prefix")
    settings = dict(config_from_env() if config is None else config)
    policy = policy or RetryPolicy()
    options = {**CLIENT_OPTIONS, "timeout": timedelta(seconds=policy.timeout),
               "allow_http": settings.get("endpoint", "").startswith("http://")}
    return S3Store(parsed.netloc, prefix=parsed.path.strip("/") or None, config=settings, client_options=options,
                   retry_config=obstore_retry())


def zarr_store(url: str, config: S3Config | None = None, policy: RetryPolicy | None = None) -> RetryingStore:
    policy = policy or RetryPolicy()
    return RetryingStore(ObjectStore(s3_store(url, config, policy)), url, policy)


class RetryingStore(WrapperStore[ObjectStore]):
    """zarr's ObjectStore with every call retried by ``policy`` (`retries`). A listing is collected
    whole, then handed out, so that a listing cut short is listed again from its start."""

    def __init__(self, store: ObjectStore, url: str, policy: RetryPolicy) -> None:
        super().__init__(store)
        self.url, self.policy = url, policy

    def _with_store(self, store: ObjectStore) -> RetryingStore:
        return type(self)(store, self.url, self.policy)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RetryingStore) and self._store == other._store

    def __repr__(self) -> str:
        return f"RetryingStore({self._store!r})"

    @property
    def store(self) -> S3Store:
        """The obstore store underneath (for the blocking calls made with `policy.call`)."""
        return self._store.store

    def _retried(self, request: str, fn):
        return self.policy.call_async(self.url, request, fn)

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None:
        return await self._retried(f"GET {key}", lambda: self._store.get(key, prototype, byte_range))

    async def get_partial_values(self, prototype: BufferPrototype,
                                 key_ranges: Iterable[tuple[str, ByteRequest | None]]) -> list[Buffer | None]:
        key_ranges = list(key_ranges)
        first = key_ranges[0][0] if key_ranges else ""
        return await self._retried(f"GET {len(key_ranges)} ranges ({first} ...)",
                                   lambda: self._store.get_partial_values(prototype, key_ranges))

    async def exists(self, key: str) -> bool:
        return await self._retried(f"HEAD {key}", lambda: self._store.exists(key))

    async def set(self, key: str, value: Buffer) -> None:
        await self._retried(f"PUT {key}", lambda: self._store.set(key, value))

    async def set_if_not_exists(self, key: str, value: Buffer) -> None:
        # zarr's ObjectStore ignores an object that exists, so a try after a lost answer is harmless
        await self._retried(f"PUT {key} (if absent)", lambda: self._store.set_if_not_exists(key, value))

    async def _set_many(self, values: Iterable[tuple[str, Buffer]]) -> None:
        await asyncio.gather(*(self.set(key, value) for key, value in values))

    async def _get_many(self, requests: Iterable[tuple[str, BufferPrototype, ByteRequest | None]]
                        ) -> AsyncIterator[tuple[str, Buffer | None]]:
        for key, prototype, byte_range in requests:
            yield key, await self.get(key, prototype, byte_range)

    async def delete(self, key: str) -> None:
        await self._retried(f"DELETE {key}", lambda: self._store.delete(key))

    async def delete_dir(self, prefix: str) -> None:
        await self._retried(f"DELETE {prefix}/*", lambda: self._store.delete_dir(prefix))

    async def getsize(self, key: str) -> int:
        return await self._retried(f"HEAD {key}", lambda: self._store.getsize(key))

    async def getsize_prefix(self, prefix: str) -> int:
        return await self._retried(f"LIST {prefix}", lambda: self._store.getsize_prefix(prefix))

    async def is_empty(self, prefix: str) -> bool:
        return await self._retried(f"LIST {prefix}", lambda: self._store.is_empty(prefix))

    async def _listed(self, method: str, *args: str) -> list[str]:
        async def collect() -> list[str]:
            return [name async for name in getattr(self._store, method)(*args)]

        return await self._retried(f"LIST {args[0] if args else ''}", collect)

    async def list(self) -> AsyncIterator[str]:
        for name in await self._listed("list"):
            yield name

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        for name in await self._listed("list_prefix", prefix):
            yield name

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        for name in await self._listed("list_dir", prefix):
            yield name


def failure(exc: BaseException, url: str) -> ActStoreError:
    """Our error for an object-store failure, saying what to fix."""
    if isinstance(exc, ActStoreError):
        return exc
    text = str(exc)
    code = re.search(r"<Code>(\w+)</Code>", text)
    code = code.group(1) if code else ""
    if code == "NoSuchBucket" or "NoSuchBucket" in text:
        return FailedPrecondition(f"the bucket of {url} does not exist: create it, or point ACTSTORE_STORE at "
                                  "an existing bucket")
    if code in _CREDENTIAL_CODES or any(c in text for c in _CREDENTIAL_CODES):
        return FailedPrecondition(f"the object store refused the credentials for {url} ({code or 'denied'}): "
                                  "check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_REGION)")
    first_line = text.strip().splitlines()[0][:300] if text.strip() else type(exc).__name__
    endpoint = os.environ.get("AWS_ENDPOINT_URL", "the default AWS endpoint")
    return Unavailable(f"the object store for {url} at {endpoint} did not answer ({first_line}): check "
                       "AWS_ENDPOINT_URL and that the server is up, then retry")


def check_reachable(url: str, config: S3Config | None = None, policy: RetryPolicy | None = None) -> None:
    """Fail fast, with the variable to fix, when the bucket cannot be listed."""
    policy = policy or RetryPolicy()
    store = s3_store(url, config, policy)
    try:
        policy.call(url, "LIST", lambda: next(iter(store.list(chunk_size=1)), None))
    except Exception as exc:
        raise failure(exc, url) from None


class S3Backend(Backend):
    scheme = "s3"
    is_remote = True
    errors = (ObjectStoreError, OSError)

    def options(self) -> S3Config:
        return config_from_env()

    def open(self, root: str, options: S3Config | None, retry: RetryPolicy) -> RetryingStore:
        return zarr_store(root, options, retry)

    def objects(self, store: RetryingStore) -> S3Store:
        return store.store

    def failure(self, exc: BaseException, root: str) -> ActStoreError:
        return failure(exc, root)

    def files(self, root: str, options: S3Config | None, retry: RetryPolicy) -> ObjectFiles:
        return ObjectFiles(root, partial(s3_store, root, options, retry), failure, retry=retry)

    def check(self, root: str, options: S3Config | None, retry: RetryPolicy) -> None:
        check_reachable(root, options, retry)


register(S3Backend())
