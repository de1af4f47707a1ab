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


# The standard AWS variables and the obstore settings they become (first variable that is set).
_AWS_VARIABLES = {
    "endpoint": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
    "access_key_id": ("AWS_ACCESS_KEY_ID",),
    "secret_access_key": ("AWS_SECRET_ACCESS_KEY",),
    "token": ("AWS_SESSION_TOKEN",),
    "region": ("AWS_REGION", "AWS_DEFAULT_REGION"),
}
S3Config = tuple[tuple[str, str], ...]


def is_url(root: str) -> bool:
    return urlparse(root).scheme in SCHEMES


def config_from_env() -> S3Config:
    """The S3 configuration the AWS variables of this process give, as a hashable value that a
    store handle carries to every worker (so workers need no variables of their own)."""
    found = {}
    for key, names in _AWS_VARIABLES.items():
        value = next((os.environ[name] for name in names if os.environ.get(name)), None)
        if value is not None:
            found[key] = value
    return tuple(sorted(found.items()))


def s3_store(url: str, config: S3Config | None = None) -> S3Store:
    """obstore's S3Store for ``s3://bucket/prefix`` with ``config`` (default: this process's AWS
    variables); plain-HTTP endpoints (MinIO on a LAN, a test server on loopback) are allowed."""
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise InvalidArgument(f"store URL {url!r} is not s3://bucket/prefix")
    settings = dict(config_from_env() if config is None else config)
    options = {**CLIENT_OPTIONS, "allow_http": settings.get("endpoint", "").startswith("http://")}
    return S3Store(parsed.netloc, prefix=parsed.path.strip("/") or None, config=settings, client_options=options,
                   retry_config=RETRY)


def zarr_store(url: str, config: S3Config | None = None) -> ObjectStore:
    return ObjectStore(s3_store(url, config))


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


def check_reachable(url: str, config: S3Config | None = None) -> None:
    """Fail fast, with the variable to fix, when the bucket cannot be listed."""
    store = s3_store(url, config)
    try:
        next(iter(store.list(chunk_size=1)), None)
    except Exception as exc:
        raise failure(exc, url) from None
