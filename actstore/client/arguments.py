"""What the client checks before it sends, so that a caller gets InvalidArgument naming the argument
instead of a silently different answer or protobuf's ValueError traceback.

- `@options(TABLE, ...)` on a method whose keyword defaults come from option tables: each argument
  named like an option is checked (and normalised) by that option, as the server would, before
  anything is sent (the server refuses an explicit 0 of an `optional` field too; a plain proto3
  field's 0 reads as "not given", so such an option left unset is sent as None, never 0).
- `@checking_arguments` on the client class, for every public method:
  - each argument is checked against its annotation before the method runs, so a wrong type is
    InvalidArgument naming the argument and the type (not protobuf's TypeError, or a str taken as a
    list of one-character keys). int takes ints and numpy integers, not bools nor floats (not even
    1.0); float takes ints and floats; a `Sequence[...]` takes a list, a tuple or a 1-d numpy array
    whose items are checked in turn, never a str, a dict or a set; None only where the annotation
    allows it. Values are normalised (numpy integers -> int, sequences -> list) so the method
    builds its request from plain Python values;
  - an int too large for its request field (protobuf's "Value out of range", e.g. k=2**63) becomes
    InvalidArgument naming the argument that held it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
import reprlib
import types
import typing
from collections.abc import Sequence

import numpy as np

from actstore.errors import InvalidArgument
from actstore.options import TYPE_NAMES, Table

__all__ = ["checking_arguments", "options"]


def options(*tables: Table, leave: tuple[str, ...] = ()):
    """Check the arguments named like an option of `tables` (the first table that has the name)
    before the method runs; None means "the default" and is passed on unchecked. ``leave`` names
    options the server checks itself with another code (an unknown recipe is NOT_FOUND). A list option
    whose annotation also takes a str (`site`) takes a comma-separated string: the option parses it
    (`Option.split`)."""

    def decorate(method):
        signature = inspect.signature(method)
        checked = {name: next(t[name] for t in tables if name in t)
                   for name in signature.parameters if name not in leave and any(name in t for t in tables)}

        @functools.wraps(method)
        def call(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            for name, option in checked.items():
                value = bound.arguments.get(name)
                if value is not None:
                    bound.arguments[name] = option.check(value)
            return method(*bound.args, **bound.kwargs)

        return call

    return decorate


def checking_arguments(cls):
    """Wrap every public method of `cls` (its own and its mixins') so that its arguments are checked
    against their annotations before it runs, and protobuf's "Value out of range" while it builds a
    request is InvalidArgument naming the argument. A generator method's arguments are checked at
    the call; its stream is wrapped too: it builds its request on the first iteration."""
    for name, method in inspect.getmembers(cls, inspect.isfunction):
        if not name.startswith("_"):
            setattr(cls, name, _checked(method))
    return cls


_OUT_OF_RANGE = re.compile(r"Value out of range: (-?[0-9]+)")  # protobuf's message, with the value


def _checked(method):
    signature = inspect.signature(method)
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)  # the method checks its own
    kinds = {name: kind for name, kind in typing.get_type_hints(method).items()
             if name in signature.parameters and signature.parameters[name].kind not in variadic}

    @contextlib.contextmanager
    def refusing(arguments):
        try:
            yield
        except ValueError as exc:
            found = _OUT_OF_RANGE.fullmatch(str(exc))
            if found is None:
                raise
            value = int(found[1])
            names = [n for n, v in arguments.items() if _holds(v, value)]
            raise InvalidArgument(_message(" / ".join(names) or "an integer argument", value)) from None

    def streamed(stream, arguments):
        with refusing(arguments):
            yield from stream

    @functools.wraps(method)
    def call(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        for name, value in bound.arguments.items():
            if name in kinds:
                bound.arguments[name] = _conform(name, value, kinds[name])
        with refusing(bound.arguments):
            result = method(*bound.args, **bound.kwargs)
        return streamed(result, bound.arguments) if inspect.isgenerator(result) else result

    return call


_A = {**TYPE_NAMES, float: "a number"}  # an int is taken where a float is asked
_PLURAL = {bool: "bools", int: "ints", float: "numbers", str: "strings"}
_SHORT = reprlib.Repr()
_SHORT.maxstring, _SHORT.maxother = 72, 72


def _meaning(name: str) -> tuple[str, str] | None:
    """What an argument named like this holds, one and many, for the messages: run keys, layers."""
    if name.startswith("run"):
        return "a run key", "run keys"
    if name.startswith("layer"):
        return "a layer number", "layer numbers"
    return None


def _described(kind, name: str) -> str:
    """'an int', 'a string (a run key)', 'a list of layer numbers (ints)': what `kind` takes."""
    meaning = _meaning(name)
    if typing.get_origin(kind) is Sequence:
        (item,) = typing.get_args(kind)
        return f"a list of {meaning[1]} ({_PLURAL[item]})" if meaning else f"a list of {_PLURAL[item]}"
    what = _A.get(kind, f"a {getattr(kind, '__name__', kind)}")
    return f"{what} ({meaning[0]})" if meaning else what


def _conform(name: str, value, kind):
    """`value` as the annotation `kind` takes it (numpy integers as int, a sequence as a list), or
    InvalidArgument naming the argument and what it takes."""
    alternatives = typing.get_args(kind) if isinstance(kind, types.UnionType) else (kind,)
    if value is None:
        if type(None) in alternatives:
            return None
        raise InvalidArgument(f"{name} is required: give {_described(alternatives[0], name)}")
    refusals = []
    for alternative in alternatives:
        try:
            return _as(alternative, value, name)
        except InvalidArgument as refused:
            refusals.append(refused)
    raise refusals[0]


def _as(kind, value, name: str):
    if typing.get_origin(kind) is Sequence:
        (item,) = typing.get_args(kind)
        if isinstance(value, (str, bytes)) or not (isinstance(value, Sequence) or np.ndim(value) == 1):
            one = f": write [{_SHORT.repr(value)}] for one" if _fits(item, value, name) else ""
            raise InvalidArgument(f"{name} must be {_described(kind, name)}, got {_SHORT.repr(value)}{one}")
        return [_as(item, v, f"{name}[{i}]") for i, v in enumerate(value)]
    if kind is int:
        ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    elif kind is bool:
        ok = isinstance(value, (bool, np.bool_))
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise InvalidArgument(f"{name} must be {_described(kind, name)}, got {_SHORT.repr(value)}")
    return kind(value) if kind in _A else value


def _fits(kind, value, name: str) -> bool:
    try:
        _as(kind, value, name)
    except InvalidArgument:
        return False
    return True


def _holds(argument, value: int) -> bool:
    """Whether `argument` is the int `value` or a sequence holding it."""
    if isinstance(argument, (Sequence, np.ndarray)) and not isinstance(argument, (str, bytes)):
        return any(_holds(a, value) for a in argument)
    return hasattr(argument, "__index__") and not isinstance(argument, bool) and int(argument) == value


def _message(what: str, value: int) -> str:
    if -2**63 <= value < 2**63:  # a 64-bit field takes it, so it went to a 32-bit one
        return f"{what} {value} is out of range: that request field holds a 32-bit integer ({-2**31}..{2**31 - 1})"
    return f"{what} {value} is out of range: request fields hold at most 64-bit integers ({-2**63}..{2**63 - 1})"
