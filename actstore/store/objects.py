"""S3-compatible object storage for the store, through obstore (Rust ``object_store``).

``s3://bucket/prefix`` URLs open a zarr ``ObjectStore`` over obstore's ``S3Store``, configured
by the standard AWS variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``), so MinIO, Ceph and AWS all work. Retries with
backoff and timeouts are the library's (``RETRY``, ``CLIENT_OPTIONS``); nothing here loops.
Errors of the object store become ours: a missing bucket or refused credentials are
FAILED_PRECONDITION naming the variable to fix, anything else UNAVAILABLE.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from urllib.parse import urlparse

from obstore.store import S3Store
from zarr.storage import ObjectStore

from actstore.errors import ActStoreError, FailedPrecondition, InvalidArgument, Unavailable

SCHEMES = ("s3",)
# Bounded: a store that does not answer fails a call within about half a minute, never hangs.
RETRY = {
    "max_retries": 3,
    "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=5), "base": 2},
    "retry_timeout": timedelta(seconds=30),
}
CLIENT_OPTIONS = {"connect_timeout": timedelta(seconds=5), "timeout": timedelta(seconds=60)}
_CREDENTIAL_CODES = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken",
                     "ExpiredToken")


def is_url(root: str) -> bool:
    return urlparse(root).scheme in SCHEMES


def s3_store(url: str) -> S3Store:
    """obstore's S3Store for ``s3://bucket/prefix``; plain-HTTP endpoints (MinIO on a LAN, a test
    server on loopback) are allowed when ``AWS_ENDPOINT_URL`` says http."""
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise InvalidArgument(f"store URL {url!r} is not s3://bucket/prefix")
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    options = {**CLIENT_OPTIONS, "allow_http": endpoint.startswith("http://")}
    return S3Store(parsed.netloc, prefix=parsed.path.strip("/") or None, client_options=options,
                   retry_config=RETRY)


def zarr_store(url: str) -> ObjectStore:
    return ObjectStore(s3_store(url))


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


def check_reachable(url: str) -> None:
    """Fail fast, with the variable to fix, when the bucket cannot be listed."""
    store = s3_store(url)
    try:
        next(iter(store.list(chunk_size=1)), None)
    except Exception as exc:
        raise failure(exc, url) from None
