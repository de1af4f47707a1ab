"""The audit trail: who changed what, and a bounded record of calls without a valid token.

Every mutating call (a method above reader) by a known principal is one row. Calls refused as
UNAUTHENTICATED are aggregated per source address: the first in a window is a row, and the rest of
that window become one row with their count when the window closes (the source's next refused call
after it, or server stop). A flood of strangers thus adds at most two rows per source per window.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from actstore.server.auth import METHOD_ROLES
from actstore.store.catalog import Catalog

AUDITED = {m for m, role in METHOD_ROLES.items() if role != "reader"}
WINDOW_SECONDS = 60.0
MAX_SOURCES = 10_000  # open windows kept before closed ones are written out early
REFUSED = "UNAUTHENTICATED"

log = logging.getLogger(__name__)


def _source(peer: str) -> str:
    """'ipv4:127.0.0.1:54321' -> 'ipv4:127.0.0.1' (the port changes with every connection)."""
    return peer.rsplit(":", 1)[0] if peer.count(":") > 1 else peer


class AuditLog:
    def __init__(self, catalog: Catalog, window: float = WINDOW_SECONDS) -> None:
        self.catalog = catalog
        self.window = window
        self._lock = threading.Lock()
        self._open: dict[str, tuple[float, int, str]] = {}  # source -> (window start, repeats, last method)

    def record(self, principal: str | None, method: str, request, status: str, peer: Callable[[], str]) -> None:
        """`peer` gives the caller's address; it is asked only for a refused call (the hot path of
        cached queries never pays for it)."""
        if status == REFUSED:
            self._refused(method, _source(peer() or "unknown"))
        elif method in AUDITED:
            try:
                self.catalog.audit.record(principal, method, str(request).replace("\n", " ")[:200], status)
            except Exception as exc:  # a call done (or refused) stays so: its row is what is lost, and said
                log.error("the audit row of %s by %s (%s) was not written: %s", method, principal, status, exc)

    def _refused(self, method: str, source: str) -> None:
        now = time.monotonic()
        with self._lock:
            opened = self._open.get(source)
            if opened is not None and now - opened[0] < self.window:
                self._open[source] = (opened[0], opened[1] + 1, method)
                return
            self._open[source] = (now, 0, method)
            closed = [(source, opened)] if opened is not None else []
            if len(self._open) > MAX_SOURCES:
                closed += self._take_closed(now)
        self._write(closed)
        self.catalog.audit.record(None, method, f"unauthenticated call from {source}; more in the next "
                           f"{self.window:g} s are counted in one row", REFUSED)

    def _take_closed(self, now: float) -> list[tuple[str, tuple[float, int, str]]]:
        closed = [(s, w) for s, w in self._open.items() if now - w[0] >= self.window]
        for s, _ in closed:
            del self._open[s]
        return closed

    def _write(self, closed) -> None:
        for source, (_, repeats, method) in closed:
            if repeats:
                self.catalog.audit.record(None, method, f"{repeats} more unauthenticated calls from {source} within "
                                   f"{self.window:g} s (the last to {method})", REFUSED)

    def flush(self) -> None:
        """Write out every open window's count (at server stop)."""
        with self._lock:
            closed, self._open = list(self._open.items()), {}
        self._write(closed)
