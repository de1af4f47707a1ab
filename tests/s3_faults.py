"""A fault-injecting HTTP proxy in front of the loopback S3 server (tests only).

It forwards each request to the upstream server and, for a share of them, does instead what a
flaky object store or network does: answers 503 SlowDown, resets the connection before the request
body is read (while the client is still sending it), halfway through the response body, or after the
upstream server has done the request but before its answer is sent, or delays the answer. Which
request gets which fault is decided by a seeded hash of the request (its method, path and query, and
how many times that same request came before), so a run is the same whatever the order in which
concurrent requests arrive, and a request sent again gets a fresh draw (a retry can pass).

    with FaultProxy(upstream, seed=1, rates={"503": 0.05, "reset-response": 0.05}) as proxy:
        proxy.endpoint  # point AWS_ENDPOINT_URL here
        proxy.injected  # Counter of the faults injected, by kind
        proxy.outage = True  # every request fails (503) until set back
"""

from __future__ import annotations

import hashlib
import http.client
import socket
import struct
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

KINDS = ("503", "reset-request", "reset-response", "reset-after", "delay")
SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


class _Reset(Exception):
    """The connection was reset on purpose."""


class FaultProxy:
    def __init__(self, upstream: str, seed: int = 0, rates: dict[str, float] | None = None,
                 max_delay: float = 0.3, methods: tuple[str, ...] | None = None) -> None:
        self.upstream = urlparse(upstream)
        self.seed, self.rates, self.max_delay = seed, dict(rates or {}), max_delay
        self.methods = methods  # None: every method may get a fault
        unknown = set(self.rates) - set(KINDS)
        assert not unknown, unknown
        self.injected: Counter = Counter()
        self.requests: Counter = Counter()  # by method
        self.outage = False
        self._seen: Counter = Counter()
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def handle_one_request(self) -> None:
                try:
                    super().handle_one_request()
                except _Reset:
                    self.close_connection = True
                except (ConnectionError, BrokenPipeError, TimeoutError):
                    self.close_connection = True

            def finish(self) -> None:
                try:
                    super().finish()
                except OSError:  # the connection was reset on purpose
                    pass

            def _serve(self) -> None:
                proxy._serve(self)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _serve

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3-fault-proxy", daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _fault(self, method: str, target: str) -> str | None:
        """The fault for this request (None: forwarded as it is), by a seeded hash."""
        with self._lock:
            self.requests[method] += 1
            nth = self._seen[(method, target)]
            self._seen[(method, target)] += 1
        if self.methods is not None and method not in self.methods:
            return None
        digest = hashlib.sha256(f"{self.seed}|{method}|{target}|{nth}".encode()).digest()
        draw = int.from_bytes(digest[:8], "big") / 2**64
        for kind in KINDS:
            rate = self.rates.get(kind, 0.0)
            if draw < rate:
                with self._lock:
                    self.injected[kind] += 1
                return kind
            draw -= rate
        return None

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        method, target = handler.command, handler.path
        fault = "503" if self.outage else self._fault(method, target)
        if fault == "reset-request":  # the client is still sending its body, if it has one
            _reset(handler)
        body = _request_body(handler)
        if fault == "503":
            _answer(handler, 503, [("Content-Type", "application/xml")], SLOW_DOWN)
            return
        if fault == "delay":
            digest = hashlib.sha256(f"{self.seed}|delay|{target}".encode()).digest()
            time.sleep(self.max_delay * digest[0] / 255)
        connection = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=60)
        try:
            headers = {name: value for name, value in handler.headers.items() if name.lower() not in HOP_BY_HOP}
            headers["Content-Length"] = str(len(body))
            connection.request(method, target, body=body, headers=headers)
            response = connection.getresponse()
            data = response.read()
            reply = [(n, v) for n, v in response.getheaders() if n.lower() not in HOP_BY_HOP | {"content-length"}]
            status = response.status
        finally:
            connection.close()
        if fault == "reset-after":  # the upstream server did it; the client never hears
            _reset(handler)
        length = int(dict((n.lower(), v) for n, v in response.getheaders()).get("content-length", len(data))) \
            if method == "HEAD" else len(data)
        head = [f"HTTP/1.1 {status} {response.reason}\r\n".encode()]
        head += [f"{name}: {value}\r\n".encode() for name, value in reply]
        head.append(f"Content-Length: {length}\r\n\r\n".encode())
        raw = b"".join(head) + (b"" if method == "HEAD" else data)
        if fault == "reset-response":  # halfway through the answer (its body, or its head if it has none)
            handler.wfile.write(raw[: len(b"".join(head)) + len(data) // 2] if data and method != "HEAD"
                                else raw[: len(raw) // 2])
            handler.wfile.flush()
            _reset(handler)
        handler.wfile.write(raw)
        handler.wfile.flush()


def _request_body(handler: BaseHTTPRequestHandler) -> bytes:
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        parts = []
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip(), 16)
            if size == 0:
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(parts)
            parts.append(handler.rfile.read(size))
            handler.rfile.readline()
    length = int(handler.headers.get("Content-Length") or 0)
    return handler.rfile.read(length) if length else b""


def _answer(handler: BaseHTTPRequestHandler, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
    handler.send_response(status)
    for name, value in headers:
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)
    handler.wfile.flush()


def _reset(handler: BaseHTTPRequestHandler) -> None:
    """Close the connection with a TCP reset (SO_LINGER 0), as a dropped connection looks."""
    try:
        handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        handler.connection.close()
    finally:
        raise _Reset()
