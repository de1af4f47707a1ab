"""The one exception tree of actstore.

Every concrete class names the gRPC status code it travels as. The server's interceptor turns a
raised ``ActStoreError`` into that status with the message, and the client raises the same class
again from the status, so a caller sees one error type on both sides of the wire. Anything else
that escapes the service layer is a bug and travels as INTERNAL.

    ActStoreError                  UNKNOWN (and INTERNAL, DEADLINE_EXCEEDED, ... with no class)
    +-- ClientError                the request is wrong: fix it, retrying cannot help
    |   +-- InvalidArgument        INVALID_ARGUMENT
    |   +-- NotFound               NOT_FOUND
    |   +-- AlreadyExists          ALREADY_EXISTS
    |   +-- FailedPrecondition     FAILED_PRECONDITION
    |   +-- Unauthenticated        UNAUTHENTICATED
    |   +-- PermissionDenied       PERMISSION_DENIED
    +-- Retryable                  the same request may succeed later (with backoff)
    |   +-- Unavailable            UNAVAILABLE
    |   +-- DeadlineExceeded       DEADLINE_EXCEEDED
    +-- ResourceExhausted          RESOURCE_EXHAUSTED
    +-- DataLoss                   DATA_LOSS
    +-- Cancelled                  CANCELLED

The two families are for callers: ``except Retryable`` around a loop with backoff, ``except
ClientError`` to report a usage mistake. ``ResourceExhausted`` is in neither: the running-jobs
limit passes with time, a result or memory limit never does (ask for less); its message says which.
``DataLoss`` (corrupt or missing bytes) and ``Cancelled`` (someone cancelled the job; submitting
it again resumes) are in neither either. The family classes have no code of their own and are
never raised themselves.

This module imports nothing, so the thin client can use it without grpc internals.
"""

from __future__ import annotations


class ActStoreError(Exception):
    """Base class. ``code`` is the name of a ``grpc.StatusCode`` member."""

    code = "UNKNOWN"


class ClientError(ActStoreError):
    """Family: the request is wrong (arguments, names, state, credentials); retrying it cannot help."""


class Retryable(ActStoreError):
    """Family: a transient failure; the same request may succeed if sent again later."""


class InvalidArgument(ClientError):
    """The request itself is wrong: a layer out of range, mismatched sample ids, bad options."""

    code = "INVALID_ARGUMENT"


class NotFound(ClientError):
    """An unknown model, dataset, run, job or result."""

    code = "NOT_FOUND"


class AlreadyExists(ClientError):
    """A name is taken by something else."""

    code = "ALREADY_EXISTS"


class FailedPrecondition(ClientError):
    """The request is well formed but the state does not allow it (run not committed, NaN/Inf)."""

    code = "FAILED_PRECONDITION"


class Unauthenticated(ClientError):
    """No token, or an unknown token."""

    code = "UNAUTHENTICATED"


class PermissionDenied(ClientError):
    """The token's role does not allow this method."""

    code = "PERMISSION_DENIED"


class ResourceExhausted(ActStoreError):
    """The request would exceed a configured limit (matrix size, memory, job count)."""

    code = "RESOURCE_EXHAUSTED"


class DataLoss(ActStoreError):
    """Stored bytes are corrupt (a checksum mismatch) or missing. ``damage`` says which bytes and
    why, without the advice the message goes on with (what a report lists, such as `catalog
    rebuild`'s); where nothing narrower was given, the message itself. It survives pickling (a
    DataLoss raised in a Ray task reaches the server whole)."""

    code = "DATA_LOSS"

    def __init__(self, message: str, damage: str | None = None) -> None:
        super().__init__(message)
        self.damage = message if damage is None else damage

    def __reduce__(self):
        return type(self), (str(self), self.damage)


class Cancelled(ActStoreError):
    """The job was cancelled."""

    code = "CANCELLED"


class Unavailable(Retryable):
    """The server or the Ray cluster cannot be reached."""

    code = "UNAVAILABLE"


class DeadlineExceeded(Retryable):
    """The call's deadline (a client ``timeout=``) passed before the server answered."""

    code = "DEADLINE_EXCEEDED"


ERRORS_BY_CODE: dict[str, type[ActStoreError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        AlreadyExists,
        FailedPrecondition,
        ResourceExhausted,
        Unauthenticated,
        PermissionDenied,
        DataLoss,
        Cancelled,
        Unavailable,
        DeadlineExceeded,
    )
}
