"""The client's connection to a server: one channel with a stub per gRPC service (`Connection`,
which every sub-client of `Client` holds), whose calls raise actstore errors (never grpc.RpcError,
and FailedPrecondition once the client is closed), the TLS CA file, and the entry point that starts
an embedded server without importing it."""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc

from actstore._proto.actstore.v1 import actstore_pb2_grpc as rpc
from actstore._proto.actstore.v1 import (
    diagnostics_pb2_grpc,
    imports_pb2_grpc,
    planning_pb2_grpc,
    readers_pb2_grpc,
    tokens_pb2_grpc,
)
from actstore.errors import ERRORS_BY_CODE, ActStoreError, FailedPrecondition, InvalidArgument

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


class Connection:
    """One channel to a server at `address` and a `Translating` stub per gRPC service (`catalog`,
    `capture`, `query`, `tokens`, `integrity`, `housekeeping`, `planning`, `readers`, `imports`,
    `diagnostics`): what every sub-client of `Client` holds. `token` (default ACTSTORE_TOKEN) goes
    with every call; `root_certificates` (default: the file ACTSTORE_TLS_CA names, else plaintext)
    makes it TLS. Both are kept for the connections of torch DataLoader workers."""

    def __init__(self, address: str, token: str | None = None, root_certificates: bytes | None = None) -> None:
        token = token or os.environ.get("ACTSTORE_TOKEN")
        if token and not (token.isascii() and token.isprintable()):  # gRPC refuses it as "Invalid metadata"
            raise InvalidArgument("the token is not printable ASCII, as every actstore token is: check --token / "
                                  "ACTSTORE_TOKEN (an admin makes one with `actstore token create`)")
        if root_certificates is None and os.environ.get("ACTSTORE_TLS_CA"):
            root_certificates = read_ca(os.environ["ACTSTORE_TLS_CA"])
        options = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
        if root_certificates is not None:
            self._channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates), options)
        else:
            self._channel = grpc.insecure_channel(address, options)
        self.address, self.token, self.root_certificates = address, token, root_certificates
        self._closed = threading.Event()
        metadata = [("authorization", f"Bearer {token}")] if token else []

        def stub(kind):
            return Translating(kind(self._channel), metadata, self._closed)

        self.catalog, self.capture, self.query = stub(rpc.CatalogStub), stub(rpc.CaptureStub), stub(rpc.QueryStub)
        self.tokens, self.integrity = stub(tokens_pb2_grpc.TokensStub), stub(rpc.IntegrityStub)
        self.housekeeping, self.planning = stub(rpc.HousekeepingStub), stub(planning_pb2_grpc.PlanningStub)
        self.readers, self.imports = stub(readers_pb2_grpc.ReadersStub), stub(imports_pb2_grpc.ImportsStub)
        self.diagnostics = stub(diagnostics_pb2_grpc.DiagnosticsStub)

    def close(self) -> None:
        """Close the channel: every later call raises FailedPrecondition."""
        self._closed.set()
        self._channel.close()


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
