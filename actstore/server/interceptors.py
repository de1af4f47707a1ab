"""One interceptor for every RPC: authenticate, authorise, audit, and translate errors.

An `ActStoreError` becomes its gRPC status with its message; any other exception is a bug and
becomes INTERNAL: the server log keeps its traceback under a short correlation id, and the status
names only that id. Each call's end (deadline, cancel, or done) sets `dispatch.call_ended`, so the
Ray tasks of a query nobody waits for any more are cancelled. Health and reflection pass straight
through.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import uuid

import grpc

from actstore.errors import ActStoreError, InvalidArgument
from actstore.server.auth import METHOD_ROLES, authenticate, check_role
from actstore.server.dispatch import call_ended
from actstore.store.catalog import Catalog

log = logging.getLogger(__name__)

current_principal: contextvars.ContextVar[str | None] = contextvars.ContextVar("principal", default=None)

_OURS = "/actstore.v1."
MAX_MESSAGE_CHARS = 2000
_AUDITED = {m for m, role in METHOD_ROLES.items() if role != "reader"}


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
    """Tie this thread's work to the call: `call_ended` is set when the call ends for any reason."""
    ended = threading.Event()
    if not context.add_callback(ended.set):  # the call is over already
        ended.set()
    call_ended.set(ended)


class ServiceInterceptor(grpc.ServerInterceptor):
    def __init__(self, catalog: Catalog, auth: bool) -> None:
        self.catalog = catalog
        self.auth = auth

    def _caller(self, details: grpc.HandlerCallDetails) -> tuple[str, str] | None:
        return authenticate(self.catalog, dict(details.invocation_metadata or ())) if self.auth else None

    def _audit(self, principal: str | None, method: str, request, status: str) -> None:
        if method in _AUDITED:
            target = str(request).replace("\n", " ")[:200]
            self.catalog.audit(principal, method, target, status)

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None or not details.method.startswith(_OURS):
            return handler
        method = details.method.rsplit("/", 1)[-1]
        parse = _parsing(handler.request_deserializer, method)

        if handler.unary_unary is not None:
            inner = handler.unary_unary

            def unary(payload, context):
                principal = None
                request = payload
                try:
                    caller = self._caller(details)
                    if caller is not None:
                        principal = caller[0]
                        check_role(*caller, method)
                    request = parse(payload)  # after the caller is known: strangers learn nothing
                    current_principal.set(principal)
                    _follow_call(context)
                    response = inner(request, context)
                except Exception as exc:  # noqa: BLE001 - every error leaves as a status
                    self._audit(principal, method, request, getattr(exc, "code", "INTERNAL"))
                    _abort(context, exc, method)
                self._audit(principal, method, request, "OK")
                return response

            return grpc.unary_unary_rpc_method_handler(unary, response_serializer=handler.response_serializer)

        inner_stream = handler.unary_stream

        def stream(payload, context):
            try:
                caller = self._caller(details)
                if caller is not None:
                    check_role(*caller, method)
                request = parse(payload)
                current_principal.set(caller[0] if caller else None)
                _follow_call(context)
                yield from inner_stream(request, context)
            except Exception as exc:  # noqa: BLE001
                _abort(context, exc, method)

        return grpc.unary_stream_rpc_method_handler(stream, response_serializer=handler.response_serializer)
