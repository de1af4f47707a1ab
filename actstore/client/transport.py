"""The client's connection to a server: gRPC stubs whose calls raise actstore errors (never
grpc.RpcError, and FailedPrecondition once the client is closed), the TLS CA file, and the entry
point that starts an embedded server without importing it."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc

from actstore.errors import ERRORS_BY_CODE, ActStoreError, FailedPrecondition

SERVER_ENTRY_POINTS = "actstore.servers"  # the seam to the server: pyproject's [project.entry-points]

MAX_MESSAGE_BYTES = 64 << 20


_NO_SERVER = ("failed to connect to all addresses", "DNS resolution failed")  # gRPC's own, before any server


def _raise_as_ours(exc: grpc.RpcError) -> None:
    code, details = exc.code(), exc.details()
    if code is grpc.StatusCode.UNAVAILABLE and details.startswith(_NO_SERVER):
        details = (f"no actstore server answers ({details}): start one with `actstore serve`, or check the "
                   "address (Client(address); the CLI's --address or ACTSTORE_ADDRESS)")
    error = ERRORS_BY_CODE.get(code.name, ActStoreError)(details)
    if type(error) is ActStoreError:
        error.code = code.name
    raise error from None


class Translating:
    """Wraps a stub so every call raises actstore errors instead of grpc.RpcError, and a call after
    the client is closed (`closed` set) FailedPrecondition instead of gRPC's ValueError."""

    def __init__(self, stub, metadata: list[tuple[str, str]], closed: threading.Event) -> None:
        self._stub = stub
        self._metadata = metadata
        self._closed = closed

    def __getattr__(self, name: str):
        method = getattr(self._stub, name)

        @functools.wraps(method)
        def call(request, **kwargs):
            if self._closed.is_set():
                raise FailedPrecondition("this Client is closed (its `with` block has ended, or close() was "
                                         "called): make a new one")
            try:
                response = method(request, metadata=self._metadata, **kwargs)
            except grpc.RpcError as exc:
                _raise_as_ours(exc)
            if isinstance(response, Iterator):
                return _translating_stream(response)
            return response

        return call


def _translating_stream(stream):
    try:
        yield from stream
    except grpc.RpcError as exc:
        _raise_as_ours(exc)


def server_starter(name: str = "embedded"):
    """The server's `start_server(settings)` and its `Settings`, found through the entry point
    group, so that importing the client never imports the server (torch, Ray, DuckDB, Zarr)."""
    from importlib.metadata import entry_points

    install = "pip install 'actstore[server]'"
    found = list(entry_points(group=SERVER_ENTRY_POINTS, name=name))
    if not found:
        raise FailedPrecondition(f"no actstore server is installed (no {name!r} entry point in group "
                                 f"{SERVER_ENTRY_POINTS!r}): {install} to run one in-process, or connect to "
                                 "a running `actstore serve` with Client(address)")
    try:
        return found[0].load()
    except ImportError as exc:
        raise FailedPrecondition(f"the embedded server cannot be imported ({exc}): {install}") from None


def read_ca(path: str | Path) -> bytes:
    """The PEM bytes of a CA certificate file (for `root_certificates`)."""
    try:
        return Path(path).expanduser().read_bytes()
    except OSError as exc:
        raise FailedPrecondition(f"cannot read the TLS CA certificate {path} ({exc.strerror}): give the PEM file "
                                 "that signed the server's certificate (--tls-ca, ACTSTORE_TLS_CA)") from None
