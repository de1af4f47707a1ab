"""One interceptor for every RPC: authenticate, authorise, limit, audit, and translate errors.

An `ActStoreError` becomes its gRPC status with its message; any other exception is a bug and
becomes INTERNAL: the server log keeps its traceback under a short correlation id, and the status
names only that id. Each call's `is_active` goes into `dispatch.call_active`, so the Ray tasks of a
query nobody waits for any more (deadline passed, or cancelled) are cancelled. Health and
reflection pass straight through.
"""

from __future__ import annotations

import contextvars
import logging
import uuid

import grpc

from actstore.config import Settings
from actstore.errors import ActStoreError, InvalidArgument
from actstore.server.audit import AuditLog
from actstore.server.auth import authenticate, check_role, check_server_path
from actstore.server.dispatch import call_active
from actstore.server.limits import RequestLimiter
from actstore.store import disk
from actstore.store.catalog import Catalog

log = logging.getLogger(__name__)

current_principal: contextvars.ContextVar[str | None] = contextvars.ContextVar("principal", default=None)
current_role: contextvars.ContextVar[str | None] = contextvars.ContextVar("role", default=None)

_OURS = "/actstore.v1."
MAX_MESSAGE_CHARS = 2000


def _parsing(deserialize, method: str):
    """The request as bytes on the wire, parsed inside the handler: gRPC itself answers a request
    it cannot deserialize with INTERNAL, which would say "bug" about the caller's bytes."""

    def parse(payload: bytes):
        try:
            return deserialize(payload)
        except Exception as exc:  # noqa: BLE001 - protobuf raises DecodeError, and more for odd bytes
            raise InvalidArgument(f"the {method} request could not be parsed ({type(exc).__name__}): send a "
                                  "serialized actstore.v1 request message (is the client's actstore version "
                                  "the server's?)") from None

    return parse


def _abort(context: grpc.ServicerContext, exc: BaseException, method: str) -> None:
    if not isinstance(exc, ActStoreError) and disk.full(exc):  # a write our own layers did not name
        exc = disk.no_space(exc, None)
    if isinstance(exc, ActStoreError):
        # a message that quotes a huge input must still fit gRPC's metadata limit (8 kB by default)
        message = str(exc)
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[:MAX_MESSAGE_CHARS] + f"... ({len(message) - MAX_MESSAGE_CHARS} more characters)"
        context.abort(grpc.StatusCode[exc.code], message)
    incident = uuid.uuid4().hex[:12]
    log.error("internal error, id %s, in %s", incident, method, exc_info=exc)
    context.abort(grpc.StatusCode.INTERNAL, f"internal error in {method}, id {incident}: this is a bug; "
                  "report it with the server log")


def _follow_call(context: grpc.ServicerContext) -> None:
    """Tie this thread's work to the call: `call_active` says whether it is still going."""
    call_active.set(context.is_active)


class ServiceInterceptor(grpc.ServerInterceptor):
    def __init__(self, catalog: Catalog, settings: Settings) -> None:
        self.catalog = catalog
        self.auth = settings.auth
        self.path_role = settings.register_paths_role
        self.audit = AuditLog(catalog)
        self.limiter = RequestLimiter(settings.principal_requests_per_second, settings.principal_request_burst)
        # our methods' wrapped handlers, made once each (keys: the API's methods only, so bounded)
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}

    def _admit(self, context: grpc.ServicerContext, method: str, payload: bytes, parse, caller: list):
        """The parsed request of an authenticated, authorised caller within its rate (appended to
        `caller`, so a failure after authentication is audited with the principal)."""
        current_principal.set(None)  # the handler threads are reused: nothing carries over
        current_role.set(None)
        if self.auth:
            name, role = authenticate(self.catalog, dict(context.invocation_metadata() or ()))
            caller.append(name)
            check_role(name, role, method)
            self.limiter.admit(name)
        request = parse(payload)  # after the caller is known: strangers learn nothing
        if self.auth:
            check_server_path(name, role, method, request, self.path_role)
            current_principal.set(name)
            current_role.set(role)
        return request

    def intercept_service(self, continuation, details):
        wrapped = self._wrapped.get(details.method)
        if wrapped is not None:
            return wrapped
        handler = continuation(details)
        if handler is None or not details.method.startswith(_OURS):
            return handler  # unknown methods are not remembered: callers choose those names
        wrapped = self._wrapped[details.method] = self._wrap(handler, details.method.rsplit("/", 1)[-1])
        return wrapped

    def _wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        """`handler` behind authentication, limits, audit and error translation (the request is
        parsed inside, so undecodable bytes are INVALID_ARGUMENT)."""
        parse = _parsing(handler.request_deserializer, method)

        if handler.unary_unary is not None:
            inner = handler.unary_unary

            def unary(payload, context):
                caller: list[str] = []
                request = payload
                try:
                    request = self._admit(context, method, payload, parse, caller)
                    _follow_call(context)
                    response = inner(request, context)
                except Exception as exc:  # noqa: BLE001 - every error leaves as a status
                    principal = caller[0] if caller else None
                    self.audit.record(principal, method, request, getattr(exc, "code", "INTERNAL"), context.peer)
                    _abort(context, exc, method)
                self.audit.record(caller[0] if caller else None, method, request, "OK", context.peer)
                return response

            return grpc.unary_unary_rpc_method_handler(unary, response_serializer=handler.response_serializer)

        inner_stream = handler.unary_stream

        def stream(payload, context):
            try:
                request = self._admit(context, method, payload, parse, [])
                _follow_call(context)
                yield from inner_stream(request, context)
            except Exception as exc:  # noqa: BLE001
                if getattr(exc, "code", None) == "UNAUTHENTICATED":
                    self.audit.record(None, method, None, exc.code, context.peer)
                _abort(context, exc, method)

        return grpc.unary_stream_rpc_method_handler(stream, response_serializer=handler.response_serializer)
