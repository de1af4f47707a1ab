"""The one exception tree of actstore.

Every class names the gRPC status code it travels as. The server's interceptor turns a raised
``ActStoreError`` into that status with the message, and the client raises the same class again
from the status, so a caller sees one error type on both sides of the wire. Anything else that
escapes the service layer is a bug and travels as INTERNAL.

This module imports nothing, so the thin client can use it without grpc internals.
"""

from __future__ import annotations


class ActStoreError(Exception):
    """Base class. ``code`` is the name of a ``grpc.StatusCode`` member."""

    code = "UNKNOWN"


class InvalidArgument(ActStoreError):
    """The request itself is wrong: a layer out of range, mismatched sample ids, bad options."""

    code = "INVALID_ARGUMENT"


class NotFound(ActStoreError):
    """An unknown model, dataset, run, job or result."""

    code = "NOT_FOUND"


class AlreadyExists(ActStoreError):
    """A name is taken by something else."""

    code = "ALREADY_EXISTS"


class FailedPrecondition(ActStoreError):
    """The request is well formed but the state does not allow it (run not committed, NaN/Inf)."""

    code = "FAILED_PRECONDITION"


class ResourceExhausted(ActStoreError):
    """The request would exceed a configured limit (matrix size, memory, job count)."""

    code = "RESOURCE_EXHAUSTED"


class Unauthenticated(ActStoreError):
    """No token, or an unknown token."""

    code = "UNAUTHENTICATED"


class PermissionDenied(ActStoreError):
    """The token's role does not allow this method."""

    code = "PERMISSION_DENIED"


class DataLoss(ActStoreError):
    """Stored bytes are corrupt (a checksum mismatch) or missing."""

    code = "DATA_LOSS"


class Cancelled(ActStoreError):
    """The job was cancelled."""

    code = "CANCELLED"


class Unavailable(ActStoreError):
    """The server or the Ray cluster cannot be reached."""

    code = "UNAVAILABLE"


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
    )
}
