"""What the client checks before it sends, so that a caller gets InvalidArgument naming the argument
instead of a silently different answer or protobuf's ValueError traceback.

- `@options(TABLE, ...)` on a method whose keyword defaults come from option tables: each argument
  named like an option is checked (and normalised) by that option, as the server would. This matters
  most for zeros: proto3 sends 0 as "not given", so `mutual_knn(run, k=0)` would otherwise come back
  with the default k=10.
- `@refusing_out_of_range` on the client class: an int too large for its request field (protobuf's
  "Value out of range", e.g. k=2**63) becomes InvalidArgument naming the argument that held it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
from collections.abc import Sequence

import numpy as np

from actstore.errors import InvalidArgument
from actstore.options import Table

__all__ = ["options", "refusing_out_of_range"]


def options(*tables: Table, leave: tuple[str, ...] = ()):
    """Check the arguments named like an option of `tables` (the first table that has the name)
    before the method runs; None means "the default" and is passed on unchecked. ``leave`` names
    options the server checks itself with another code (an unknown recipe is NOT_FOUND). A list option
    also takes a comma-separated string (as `site` does)."""

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
                    if option.many and isinstance(value, str):
                        value = value.split(",")
                    bound.arguments[name] = option.check(value)
            return method(*bound.args, **bound.kwargs)

        return call

    return decorate


def refusing_out_of_range(cls):
    """Wrap every public method of `cls` (its own and its mixins') so that protobuf's "Value out of
    range" while it builds a request is InvalidArgument naming the argument. A generator method's
    stream is wrapped too: it builds its request on the first iteration."""
    for name, method in inspect.getmembers(cls, inspect.isfunction):
        if not name.startswith("_"):
            setattr(cls, name, _in_range(method))
    return cls


_OUT_OF_RANGE = re.compile(r"Value out of range: (-?[0-9]+)")  # protobuf's message, with the value


def _in_range(method):
    signature = inspect.signature(method)

    @contextlib.contextmanager
    def refusing(args, kwargs):
        try:
            yield
        except ValueError as exc:
            found = _OUT_OF_RANGE.fullmatch(str(exc))
            if found is None:
                raise
            value = int(found[1])
            names = [n for n, v in signature.bind(*args, **kwargs).arguments.items() if _holds(v, value)]
            raise InvalidArgument(_message(" / ".join(names) or "an integer argument", value)) from None

    def streamed(stream, args, kwargs):
        with refusing(args, kwargs):
            yield from stream

    @functools.wraps(method)
    def call(*args, **kwargs):
        with refusing(args, kwargs):
            result = method(*args, **kwargs)
        return streamed(result, args, kwargs) if inspect.isgenerator(result) else result

    return call


def _holds(argument, value: int) -> bool:
    """Whether `argument` is the int `value` or a sequence holding it."""
    if isinstance(argument, (Sequence, np.ndarray)) and not isinstance(argument, (str, bytes)):
        return any(_holds(a, value) for a in argument)
    return hasattr(argument, "__index__") and not isinstance(argument, bool) and int(argument) == value


def _message(what: str, value: int) -> str:
    if -2**63 <= value < 2**63:  # a 64-bit field takes it, so it went to a 32-bit one
        return f"{what} {value} is out of range: that request field holds a 32-bit integer ({-2**31}..{2**31 - 1})"
    return f"{what} {value} is out of range: request fields hold at most 64-bit integers ({-2**63}..{2**63 - 1})"
