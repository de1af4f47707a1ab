"""Retries of object-store calls: what is retried, how, for how long, and how it is counted.

Every call this store makes to an object store is idempotent at the object level, so every one is
retried when it fails transiently:

* GET, ranged GET, HEAD and LIST read;
* PUT writes a whole object: a shard or a content-addressed folder's file (the same bytes whatever
  writes them), or a whole replacement by the object's one writer (a run's metadata, a marker).
  Sent again after a lost answer, it leaves the same object;
* a multipart upload is retried as a whole, with a new upload: its creation (a POST) is the one
  request of S3's that is not idempotent, so it is never sent again on its own. An upload whose
  creation answer was lost stays incomplete in the bucket, unseen by readers: a bucket lifecycle
  rule (AbortIncompleteMultipartUpload) removes such uploads;
* DELETE (and S3's bulk delete, a POST) removes keys; removing one already gone is no error.

The store makes no read-modify-write request (no copy, no rename); its one conditional request,
zarr's create-if-absent of a metadata object, takes an object that exists as done, so it too may be
sent again.

Transient: 5xx answers, throttling (429, SlowDown), request timeouts (408) and transport errors:
timeouts, refused or reset connections, a body cut short, whether before the request's body was
sent, while it was being sent or read, or after the server did the request. Anything else (absent
object, refused credentials, missing bucket, a 4xx) is not retried. The policy (`RetryPolicy`, from
the settings) is tenacity's: full-jitter exponential backoff, at most `attempts` tries within
`seconds`. obstore's own retries are turned off (`obstore_retry`): they cannot be counted, and
they skip a LIST or a multipart creation whose answer's body is cut, and a bulk delete whose
connection resets. A call that spends its budget fails UNAVAILABLE naming the store, the request
and what was tried.

Each retry and each call given up is counted (`COUNTS`, this process's) and handed to the policy's
`observer` where one is set (the server counts those of every process of its cluster), and logged.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TypeVar

import tenacity

from actstore.errors import ActStoreError, Unavailable

log = logging.getLogger(__name__)

T = TypeVar("T")

Observer = Callable[[str, str], None]  # (event: "retried" | "gave_up", the store's URL)

COUNTS: Counter = Counter()  # (event, store URL): this process's
_COUNTS_LOCK = threading.Lock()

# a 4xx that is not worth retrying names its status; these are the transient ones
_TRANSIENT_STATUS = re.compile(r"\b(5\d\d|429|408)\b")
_STATUS = re.compile(r"status(?: code)?:? (\d{3})\b|\b(\d{3}) (?:[A-Z][a-z]+ ?)+:")
_THROTTLED = ("SlowDown", "Throttl", "RequestTimeout", "TooManyRequests", "ServiceUnavailable", "InternalError")
_PERMANENT_CODES = ("NoSuchBucket", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken",
                    "ExpiredToken", "InvalidBucketName", "NoSuchKey")


@dataclass(frozen=True)
class RetryPolicy:
    """How object-store calls are retried (the settings' `store_*` fields), carried by a store
    handle to every process that opens the store."""

    attempts: int = 10
    seconds: float = 120.0
    backoff: float = 0.2
    max_backoff: float = 10.0
    timeout: float = 60.0  # one request's own limit, connecting included (obstore's client `timeout`)
    observer: Observer | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_settings(cls, settings, observer: Observer | None = None) -> RetryPolicy:
        return cls(settings.store_retry_attempts, settings.store_retry_seconds, settings.store_backoff_seconds,
                   settings.store_backoff_max_seconds, settings.store_request_seconds, observer)

    def call(self, store: str, request: str, fn: Callable[[], T]) -> T:
        """``fn()`` with retries of its transient failures (see the module)."""
        retrying = tenacity.Retrying(**self._tenacity(store, request))
        try:
            return retrying(fn)
        except tenacity.RetryError as exc:
            raise self._gave_up(store, request, exc) from None

    async def call_async(self, store: str, request: str, fn: Callable[[], Awaitable[T]]) -> T:
        """``await fn()`` with retries of its transient failures (see the module)."""
        retrying = tenacity.AsyncRetrying(**self._tenacity(store, request))

        async def attempt() -> T:  # a coroutine function: tenacity calls a plain one without awaiting it
            return await fn()

        try:
            return await retrying(attempt)
        except tenacity.RetryError as exc:
            raise self._gave_up(store, request, exc) from None

    def _tenacity(self, store: str, request: str) -> dict:
        def retried(state: tenacity.RetryCallState) -> None:
            _count("retried", store, self.observer)
            log.warning("object store %s: %s failed (%s); try %d of %d in %.2f s", store, request,
                        brief(state.outcome.exception()), state.attempt_number + 1, self.attempts,
                        state.next_action.sleep if state.next_action else 0.0)

        return {"stop": tenacity.stop_after_attempt(self.attempts) | tenacity.stop_before_delay(self.seconds),
                "wait": tenacity.wait_random_exponential(multiplier=self.backoff, max=self.max_backoff),
                "retry": tenacity.retry_if_exception(transient), "before_sleep": retried, "reraise": False}

    def _gave_up(self, store: str, request: str, exc: tenacity.RetryError) -> Unavailable:
        state = exc.last_attempt
        tries = state.attempt_number
        _count("gave_up", store, self.observer)
        error = Unavailable(
            f"the object store {store} did not answer {request}: {tries} tries in the retry budget "
            f"(ACTSTORE_STORE_RETRY_ATTEMPTS={self.attempts}, ACTSTORE_STORE_RETRY_SECONDS={self.seconds:g}) "
            f"all failed, the last with: {brief(state.exception())}. Check that the store is up and reachable "
            "(AWS_ENDPOINT_URL), then submit again: what was stored is kept")
        log.error("%s", error)
        return error


def _count(event: str, store: str, observer: Observer | None) -> None:
    with _COUNTS_LOCK:
        COUNTS[(event, store)] += 1
    if observer is not None:
        try:
            observer(event, store)
        except Exception as exc:  # counting must never fail the call it counts
            log.warning("an object-store %s was not counted: %s", event, brief(exc))


def totals() -> dict[str, int]:
    """This process's retries and calls given up, over every store."""
    with _COUNTS_LOCK:
        found = Counter()
        for (event, _), count in COUNTS.items():
            found[event] += count
    return {"retried": found["retried"], "gave_up": found["gave_up"]}


def transient(exc: BaseException) -> bool:
    """Whether a failed object-store call may succeed if sent again (see the module)."""
    if isinstance(exc, (FileNotFoundError, ActStoreError, tenacity.RetryError)):
        return False
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    from obstore import exceptions as obx

    if isinstance(exc, (obx.PermissionDeniedError, obx.UnauthenticatedError, obx.AlreadyExistsError,
                        obx.PreconditionError, obx.NotModifiedError, obx.InvalidPathError, obx.NotSupportedError,
                        obx.UnknownConfigurationKeyError)):
        return False
    if not isinstance(exc, obx.BaseError):  # a local file's error, or a bug: not the store's
        return False
    text = str(exc)
    if any(code in text for code in _PERMANENT_CODES):
        return False
    if any(word in text for word in _THROTTLED):
        return True
    statuses = [a or b for a, b in _STATUS.findall(text)]
    if statuses:
        return any(_TRANSIENT_STATUS.fullmatch(status) for status in statuses)
    # no HTTP status: the request failed on the way (connecting, sending, reading the answer)
    return True


def brief(exc: BaseException | None) -> str:
    """The first line of an error, bounded: what a message or a log line may say."""
    if exc is None:
        return "no error"
    text = str(exc).strip()
    return (text.splitlines()[0][:300] if text else type(exc).__name__)


def obstore_retry() -> dict:
    """obstore's own retry config: none (every retry is this module's, counted)."""
    return {"max_retries": 0, "retry_timeout": timedelta(seconds=1)}
