"""Per-principal request rate: one token bucket per principal.

A bucket holds up to `burst` tokens and refills at `rate` per second; each request takes one. A
request that finds the bucket empty is RESOURCE_EXHAUSTED with the time until the next token.
(A token bucket is a dozen lines; the maintained limiter libraries bring storage backends and
moving windows this in-process server does not need.)
"""

from __future__ import annotations

import threading
import time

from actstore.errors import ResourceExhausted

MAX_BUCKETS = 1024  # past this many, refilled buckets are dropped before the next is added


class RequestLimiter:
    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # principal -> (tokens, when counted)

    def admit(self, principal: str) -> None:
        now = time.monotonic()
        with self._lock:
            if len(self._buckets) >= MAX_BUCKETS:
                self._forget_full(now)
            tokens, then = self._buckets.get(principal, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - then) * self.rate)
            if tokens >= 1.0:
                self._buckets[principal] = (tokens - 1.0, now)
                return
            self._buckets[principal] = (tokens, now)
        wait = (1.0 - tokens) / self.rate
        raise ResourceExhausted(
            f"{principal} sent more than {self.rate:g} requests per second (bursts up to {self.burst}; the server's "
            f"ACTSTORE_PRINCIPAL_REQUESTS_PER_SECOND): retry in {max(wait, 0.001):.3f} s, and pace the calls")

    def _forget_full(self, now: float) -> None:
        """Drop the buckets that have refilled: a full bucket is what a principal never seen gets,
        so the table stays bounded by the principals active within `burst / rate` seconds (revoked
        tokens' buckets go too)."""
        self._buckets = {name: (tokens, then) for name, (tokens, then) in self._buckets.items()
                         if tokens + (now - then) * self.rate < self.burst}
