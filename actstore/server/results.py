"""Metric results, their provenance, and the result cache (memory in front of the catalog).

Every answer is a ``MetricResult`` with its provenance. Results are stored under their result key
(metric, definition version, options, input run keys), so a repeated query is a lookup.
NaN in an answer is cached like any value: it is what the definition gives for the input (CKA of a
constant layer, such as BERT's CLS embedding), and options that could only yield NaN (a NaN or
infinite temperature) are refused before anything runs.
"""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np
from cachetools import LRUCache

from actstore.errors import NotFound
from actstore.records import MetricAnswer, Provenance
from actstore.server.error_bounds import ErrorBounds
from actstore.store.catalog import Catalog
from actstore.store.keys import result_key

Computed = tuple[dict[str, np.ndarray], dict[str, float], list[str]]


class MetricResult(MetricAnswer):
    """A metric's answer (`records.MetricAnswer`) with the encoding the catalog stores it in."""

    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        meta = json.dumps({"scalars": self.scalars, "notes": self.notes}).encode()
        np.savez(buffer, **self.arrays, __meta__=np.frombuffer(meta, dtype=np.uint8))
        return buffer.getvalue()

    @staticmethod
    def from_bytes(payload: bytes, provenance: Provenance) -> MetricResult:
        with np.load(io.BytesIO(payload), allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files if k != "__meta__"}
            meta = json.loads(npz["__meta__"].tobytes())
        return MetricResult(arrays, meta["scalars"], provenance, meta["notes"])


class ResultCache:
    """Recent results in memory (LRU within `memory_bytes`), all of them in the catalog. With
    `bounds` (`error_bounds.ErrorBounds`), every answer leaves it with its error bound over lossy
    runs (the catalog keeps the metric's own answer)."""

    def __init__(self, catalog: Catalog, memory_bytes: int, bounds: ErrorBounds | None = None) -> None:
        self.catalog = catalog
        self._bounded = bounds.attached if bounds is not None else (lambda answer: answer)
        self._lock = threading.Lock()
        # bounded by the bytes of the arrays it holds (one 2,000 x 2,000 matrix is 32 MB): a result
        # larger than the whole budget is served from the catalog instead of being kept
        self._results: LRUCache[str, MetricResult] = LRUCache(maxsize=memory_bytes, getsizeof=_result_bytes)

    def forget(self) -> None:
        with self._lock:
            self._results.clear()

    def holds(self, result: MetricResult) -> bool:
        """Whether the memory cache still answers this very result object for its key (not
        replaced by a refresh, not evicted)."""
        with self._lock:
            return self._results.get(result.provenance.result_key) is result

    def cached_or_compute(self, metric: str, version: int, options: dict, run_keys: list[str], refresh: bool,
                          compute: Callable[[], Computed]) -> MetricResult:
        key = result_key(metric, version, options, run_keys)
        if not refresh:
            with self._lock:
                hit = self._results.get(key)
            if hit is not None:
                return hit
            stored = self.catalog.results.get(key)
            if stored is not None:
                payload, seconds = stored
                result = self._bounded(MetricResult.from_bytes(payload, Provenance(metric, version, options, run_keys,
                                                                                   True, seconds, key)))
                self._remember(key, result)
                return result
        started = time.perf_counter()
        arrays, scalars, notes = compute()
        seconds = time.perf_counter() - started
        result = MetricResult(arrays, scalars, Provenance(metric, version, options, run_keys, False, seconds, key),
                              notes)
        self.store(result, replace=refresh)
        return self._bounded(result)

    def store(self, result: MetricResult, replace: bool) -> None:
        """Put a freshly computed result into the catalog and the memory cache."""
        p = result.provenance
        self.catalog.results.put(p.result_key, p.metric, p.definition_version, p.options, p.run_keys,
                                result.to_bytes(), p.seconds, replace=replace)
        self._remember(p.result_key, self._bounded(_as_cached(result)))

    def result(self, key: str) -> MetricResult:
        stored = self.catalog.results.get_record(key)
        if stored is None:
            raise NotFound(f"no stored result {key[:16]}: it is still computing (watch its job) or "
                           "was never asked for")
        metric, version, options, run_keys, payload, seconds = stored
        return self._bounded(MetricResult.from_bytes(payload, Provenance(metric, version, options, run_keys, True,
                                                                         seconds, key)))

    def _remember(self, key: str, result: MetricResult) -> None:
        if _result_bytes(result) > self._results.maxsize:
            return
        with self._lock:
            self._results[key] = result


def _result_bytes(result: MetricResult) -> int:
    # the arrays dominate; a fixed allowance covers the provenance, scalars and notes
    return sum(a.nbytes for a in result.arrays.values()) + 4096


def _as_cached(result: MetricResult) -> MetricResult:
    return replace(result, provenance=replace(result.provenance, cached=True))
