"""The error tree: every class keeps its gRPC code, the families hold what they say, and the
module docstring draws the tree as it is."""

from __future__ import annotations

import re

import grpc
import pytest

from actstore import errors
from actstore.errors import (
    ERRORS_BY_CODE,
    ActStoreError,
    AlreadyExists,
    Cancelled,
    ClientError,
    DataLoss,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Retryable,
    Unauthenticated,
    Unavailable,
)

CODES = {
    InvalidArgument: "INVALID_ARGUMENT", NotFound: "NOT_FOUND", AlreadyExists: "ALREADY_EXISTS",
    FailedPrecondition: "FAILED_PRECONDITION", ResourceExhausted: "RESOURCE_EXHAUSTED",
    Unauthenticated: "UNAUTHENTICATED", PermissionDenied: "PERMISSION_DENIED", DataLoss: "DATA_LOSS",
    Cancelled: "CANCELLED", Unavailable: "UNAVAILABLE", DeadlineExceeded: "DEADLINE_EXCEEDED",
}
FAMILIES = (ClientError, Retryable)


def _concrete() -> list[type[ActStoreError]]:
    found = [v for v in vars(errors).values() if isinstance(v, type) and issubclass(v, ActStoreError)]
    return [c for c in found if c not in (ActStoreError, *FAMILIES)]


def test_codes_are_unchanged_and_every_class_is_reachable_by_its_code():
    assert {cls: cls.code for cls in _concrete()} == CODES
    assert ERRORS_BY_CODE == {code: cls for cls, code in CODES.items()}
    assert ActStoreError.code == "UNKNOWN"


def test_every_code_is_a_grpc_status():
    for code in [*ERRORS_BY_CODE, ActStoreError.code]:
        assert grpc.StatusCode[code].name == code


@pytest.mark.parametrize("cls", [InvalidArgument, NotFound, AlreadyExists, FailedPrecondition, Unauthenticated,
                                 PermissionDenied])
def test_client_errors(cls):
    assert issubclass(cls, ClientError) and not issubclass(cls, Retryable)
    with pytest.raises(ClientError):
        raise cls("the request is wrong")


@pytest.mark.parametrize("cls", [Unavailable, DeadlineExceeded])
def test_retryable(cls):
    assert issubclass(cls, Retryable) and not issubclass(cls, ClientError)
    with pytest.raises(Retryable):
        raise cls("try again")


@pytest.mark.parametrize("cls", [ResourceExhausted, DataLoss, Cancelled])
def test_in_neither_family(cls):
    assert issubclass(cls, ActStoreError) and not issubclass(cls, FAMILIES)


def test_families_have_no_code_of_their_own_and_are_not_on_the_wire():
    for family in FAMILIES:
        assert "code" not in vars(family)
        assert family not in ERRORS_BY_CODE.values()


def test_the_docstring_draws_the_tree_as_it_is():
    doc = errors.__doc__
    drawn = {}
    for line in doc.splitlines():
        match = re.match(r"^\s+[|+\- ]*([A-Z][A-Za-z]+)\s+([A-Z_]+)?", line)
        if match and hasattr(errors, match.group(1)):
            drawn[match.group(1)] = (len(line) - len(line.lstrip(" |+-")), match.group(2))
    names = {cls.__name__ for cls in _concrete()} | {f.__name__ for f in FAMILIES} | {"ActStoreError"}
    assert set(drawn) == names
    for cls in _concrete():
        assert drawn[cls.__name__][1] == cls.code, cls
        # drawn under its parent: one level deeper than the parent's line
        parent = cls.__mro__[1].__name__
        assert drawn[cls.__name__][0] > drawn[parent][0], (cls, parent)


def test_the_client_raises_the_class_of_the_status():
    from actstore.client.transport import _raise_as_ours

    class FakeRpcError(grpc.RpcError):
        def __init__(self, code):
            self._code = code

        def code(self):
            return self._code

        def details(self):
            return "details"

    for code, cls in [(grpc.StatusCode.UNAVAILABLE, Unavailable), (grpc.StatusCode.DEADLINE_EXCEEDED,
                                                                    DeadlineExceeded),
                      (grpc.StatusCode.NOT_FOUND, NotFound)]:
        with pytest.raises(cls):
            _raise_as_ours(FakeRpcError(code))
    with pytest.raises(ActStoreError) as info:
        _raise_as_ours(FakeRpcError(grpc.StatusCode.INTERNAL))
    assert type(info.value) is ActStoreError and info.value.code == "INTERNAL"


def test_a_data_loss_keeps_what_is_damaged_apart_from_its_advice_through_pickling():
    """`damage` is what a report lists (catalog rebuild); a DataLoss raised in a Ray task is
    pickled to the server, and keeps it."""
    import pickle

    from actstore.store.format.damage import damaged

    exc = damaged("a" * 64, "acts", "failed its crc32c check", shard=2, layer=1, rows=(512, 768))
    assert exc.damage == "shard 2 layer 1 of array 'acts' (rows 512..768) failed its crc32c check"
    assert str(exc).startswith(f"run {'a' * 12}: {exc.damage}; `actstore verify")
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is DataLoss and str(again) == str(exc) and again.damage == exc.damage
    plain = DataLoss("the bytes are gone")
    assert plain.damage == "the bytes are gone" and pickle.loads(pickle.dumps(plain)).damage == plain.damage
