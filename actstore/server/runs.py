"""Checks every query makes of its input runs, with what committed runs let us remember.

Committed runs are immutable, so their records, chunk health and the pairs already checked for
matching samples are kept in memory (each in an LRU of `run_cache_entries`) until a run is deleted
(``forget``).
"""

from __future__ import annotations

import threading

import numpy as np
from cachetools import LRUCache

from actstore.config import Settings
from actstore.errors import DataLoss, FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from actstore.metrics import similarity as sim
from actstore.store.array_store import ITEMSIZE, RunReader
from actstore.store.catalog import Catalog, ChunkHealth, RunRecord

SIMILAR_RUNS = 5  # committed runs the compression is measured on


def stored_ratio(catalog: Catalog, arrays: RunReader, model_digest: str, dtype: str) -> tuple[float, int, int] | None:
    """Stored / raw bytes of the activations of up to SIMILAR_RUNS committed runs of `dtype`, the
    model's own first: (ratio, runs measured, of them the model's own); None where there is none."""
    similar = [r for r in catalog.runs.all(status="committed") if r.dtype == dtype]
    similar.sort(key=lambda r: r.model_digest != model_digest)
    stored = raw = 0
    measured: list[RunRecord] = []
    for run in similar:
        if len(measured) == SIMILAR_RUNS:
            break
        try:
            stored += arrays.nbytes_stored(run.run_key)
        except (DataLoss, NotFound):  # a damaged or vanished run says nothing of the others: `verify` reports it
            continue
        raw += run.rows * (run.num_layers + 1) * run.width * ITEMSIZE[dtype]
        measured.append(run)
    if not raw:
        return None
    return stored / raw, len(measured), sum(r.model_digest == model_digest for r in measured)


def byte_size(n: int) -> str:
    """`12.5 KiB`, `3.20 GiB`: a size a person reads at a glance."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


class RunChecks:
    def __init__(self, catalog: Catalog, arrays: RunReader, settings: Settings) -> None:
        self.catalog = catalog
        self.arrays = arrays
        self.settings = settings
        self._lock = threading.Lock()
        entries = settings.run_cache_entries
        self._runs: LRUCache[str, RunRecord] = LRUCache(entries)  # by the name a query gave
        self._health: LRUCache[str, ChunkHealth] = LRUCache(entries)
        self._same_samples: LRUCache[tuple[str, str], bool] = LRUCache(entries)

    def forget(self) -> None:
        """Drop what is remembered (a run was deleted)."""
        with self._lock:
            self._runs.clear()
            self._health.clear()
            self._same_samples.clear()

    def committed_run(self, name: str) -> RunRecord:
        with self._lock:
            record = self._runs.get(name)
        if record is None:
            record = self.catalog.runs.get_committed(name)
            with self._lock:
                self._runs[name] = record
        return record

    def aligned_pair(self, run_a: str, run_b: str, layers_a: list[int], layers_b: list[int]
                     ) -> tuple[RunRecord, RunRecord, list[int], list[int]]:
        """Both runs (B defaults to A) and their layers for an aligned query (two tokenizations of
        the same texts, whose rows differ): committed, layers in range, the matrix within limits."""
        a = self.committed_run(run_a)
        b = self.committed_run(run_b) if run_b else a
        la = self.check_layers(a, layers_a, "layer")
        lb = self.check_layers(b, layers_b, "layer")
        self.check_matrix(len(la), len(lb))
        return a, b, la, lb

    def pair(self, run_a: str, run_b: str, layers_a: list[int], layers_b: list[int]
             ) -> tuple[RunRecord, RunRecord, list[int], list[int]]:
        """Both runs (B defaults to A) and their layer lists, checked: committed, layers in range,
        the matrix within limits (`aligned_pair`), the same samples, no NaN/Inf in the layers."""
        a, b, la, lb = self.aligned_pair(run_a, run_b, layers_a, layers_b)
        self.check_same_samples(a, b)
        self.check_finite(a, la)
        self.check_finite(b, lb)
        return a, b, la, lb

    @staticmethod
    def check_layers(run: RunRecord, layers: list[int], what: str) -> list[int]:
        chosen = list(layers) if layers else list(range(run.num_layers + 1))
        bad = [layer for layer in chosen if not 0 <= layer <= run.num_layers]
        if bad:
            raise InvalidArgument(f"{what} {bad[0]} is out of range: run {run.run_key[:12]} has layers "
                                  f"0..{run.num_layers} (0 = embeddings, {run.num_layers} = last block)")
        return RunChecks.distinct(chosen, what)

    @staticmethod
    def distinct(layers: list[int], what: str) -> list[int]:
        """A layer list names each layer once: a repeat asks for the same work again (and a list
        of thousands of repeats for unbounded work), so it is refused, not computed."""
        seen: set[int] = set()
        for layer in layers:
            if layer in seen:
                raise InvalidArgument(f"{what} {layer} is listed twice: name each layer once")
            seen.add(layer)
        return layers

    def check_same_samples(self, a: RunRecord, b: RunRecord) -> None:
        if a.run_key == b.run_key:
            return
        with self._lock:
            if self._same_samples.get((a.run_key, b.run_key)):
                return
        try:
            sim.check_same_samples(self.arrays.sample_ids(a.run_key), self.arrays.sample_ids(b.run_key))
        except ValueError as exc:
            raise InvalidArgument(f"runs {a.run_key[:12]} and {b.run_key[:12]} do not hold the same samples "
                                  f"in the same order: {exc}. Capture both models on the same dataset") from None
        if (a.pooling == "tokens") != (b.pooling == "tokens"):
            pooled, tokens = (b, a) if a.pooling == "tokens" else (a, b)
            raise InvalidArgument(f"run {pooled.run_key[:12]} is pooled '{pooled.pooling}' (one row per sample) "
                                  f"and run {tokens.run_key[:12]} is per token (one row per token): compare runs of "
                                  f"the same pooling, e.g. capture run {tokens.run_key[:12]}'s model with --pooling "
                                  f"{pooled.pooling}, or run {pooled.run_key[:12]}'s with --pooling tokens")
        if a.pooling == "tokens" and not np.array_equal(self.arrays.offsets(a.run_key), self.arrays.offsets(b.run_key)):
            raise InvalidArgument("token-level comparison needs both runs tokenised identically "
                                  "(same offsets): compare pooled runs instead")
        with self._lock:
            self._same_samples[a.run_key, b.run_key] = self._same_samples[b.run_key, a.run_key] = True

    def check_finite(self, run: RunRecord, layers: list[int]) -> None:
        with self._lock:
            health = self._health.get(run.run_key)
        if health is None:
            health = self.catalog.chunks.health(run.run_key, run.num_layers)
            with self._lock:
                self._health[run.run_key] = health
        for layer in layers:
            if health.nan_count[layer] or health.inf_count[layer]:
                raise FailedPrecondition(
                    f"run {run.run_key[:12]} layer {layer} holds {health.nan_count[layer]} NaN and "
                    f"{health.inf_count[layer]} Inf values (see `actstore describe {run.run_key[:12]}`); "
                    "they are not averaged away. Exclude the layer, or capture with --dtype float32 "
                    "if float16 overflowed")

    def check_matrix(self, rows: int, cols: int) -> None:
        if rows * cols > self.settings.max_matrix_cells:
            raise ResourceExhausted(f"a {rows} x {cols} result exceeds the limit of "
                                    f"{self.settings.max_matrix_cells} cells (ACTSTORE_MAX_MATRIX_CELLS): "
                                    "ask for fewer layers")

    def check_memory(self, need: int, what: str, remedy: str = "use fewer samples") -> None:
        if need > self.settings.max_accumulator_bytes:
            raise ResourceExhausted(
                f"{what} would hold {byte_size(need)} in memory, over the "
                f"{byte_size(self.settings.max_accumulator_bytes)} limit (ACTSTORE_MAX_ACCUMULATOR_BYTES): "
                f"{remedy}")

    def check_in_memory(self, run: RunRecord, layers: int, square: bool) -> None:
        """Refuse an in-memory metric whose rows (and n x n matrix) would exceed the limit."""
        self.check_memory(8 * run.rows * run.width * layers + (8 * run.rows**2 if square else 0),
                          f"this metric (whole layers{' and an n x n matrix' if square else ''}, n={run.rows})")

    def labels(self, run: RunRecord) -> np.ndarray:
        labels = self.arrays.labels(run.run_key)
        if labels is None:
            raise FailedPrecondition(f"run {run.run_key[:12]}'s dataset has no labels: register it with a label "
                                     "column (or use a labelled builtin)")
        return labels
