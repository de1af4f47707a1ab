"""The error bound every answer over a lossy (int8) run carries (METRICS.md, "Error bounds of lossy
storage"; the figures: `metrics.rounding`, measured at capture and stored with the run).

Each layer of a lossy run has a bound per variant (biased, debiased) on |CKA(Xhat, Y) - CKA(X, Y)|
that holds for every Y independent of its rounding draws: the statistical one of
`metrics.rounding.statistical_bound` (probability >= `SIDE_CONFIDENCE` over the draws), never above
the sure angle arccos CKA(X, Xhat). By the triangle inequality, |CKA(Xhat, Yhat) - CKA(X, Y)| <=
|CKA(Xhat, Yhat) - CKA(X, Yhat)| + |CKA(X, Yhat) - CKA(X, Y)|, and each side's draws are independent
of the other side's values, so the bound of an entry is at most bound_a[layer_a] + bound_b[layer_b],
with probability >= `CONFIDENCE` (a union over both sides); each side's bound is taken at the
entry's own CKA (`metrics.rounding.answer_bound`: a side's error shrinks as the pair's CKA nears 1,
and the exact CKA is within the bounds of the answer). A layer stored exactly adds 0; a run whose
figures predate the statistical bound (no `bound_*` columns: rounded to nearest) adds its angle,
which is sure. So every entry's bound comes from nothing but the stored figures and the answer: no
query pays for it, and every route to a CKA answer (one run, two runs, the matrix job, a cached
result) gets the same bound.

Which answers are bounded: linear CKA ("linear_cka", biased and debiased, over the runs' own rows)
and the CKA matrix job ("linear_cka_matrix"). Everything else over a lossy run (COS, minibatch
CKA, kNN, the streamed measures, entropy, probes, CKA over aligned words or with intervals, whose
rows or inner products are not the ones the angles were measured in) is "not bounded": its answer
says so and carries the runs' stored error figures instead. Answers over runs stored exactly are
left as they are (`Provenance.error_bound` None).

Attached where answers leave the result cache (`results.ResultCache`), so the stored results stay
the metric's own and a kept reply carries its bound.
"""

from __future__ import annotations

import math
import threading
from dataclasses import replace

import numpy as np
from cachetools import LRUCache

from actstore.errors import FailedPrecondition
from actstore.metrics.rounding import CONFIDENCE, answer_bound, completed
from actstore.records import MetricAnswer
from actstore.store.array_store import RunReader
from actstore.store.catalog import Catalog

BOUNDED = ("linear_cka", "linear_cka_matrix")  # metrics whose answers carry a bound (see `bounded`)
BOUND_ARRAYS = {"biased": "bound_biased", "debiased": "bound_debiased"}


def bounded(metric: str, options: dict) -> bool:
    """Whether an answer of `metric` with these options is one the angles bound: linear CKA over the
    runs' own rows (not aligned words or spans), the CKA matrix job (not a measure's matrix)."""
    if metric == "linear_cka":
        return options.get("align", "none") == "none"
    return metric == "linear_cka_matrix" and "measure" not in options


class ErrorBounds:
    """The stored error figures of runs (an LRU by run key: committed runs never change) and the
    bounds of answers over them."""

    def __init__(self, catalog: Catalog, arrays: RunReader, entries: int = 1024) -> None:
        self.catalog = catalog
        self.arrays = arrays
        self._figures: LRUCache[str, dict | None] = LRUCache(entries)
        self._lock = threading.Lock()

    def forget(self) -> None:
        with self._lock:
            self._figures.clear()

    def figures(self, run_key: str) -> dict | None:
        """A run's error figures ({name: one value per layer}); None for a run stored exactly."""
        with self._lock:
            if run_key in self._figures:
                return self._figures[run_key]
        found = self.arrays.error_figures(run_key)
        with self._lock:
            self._figures[run_key] = found
        return found

    def _sides(self, run_key: str, variant: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Each layer's (bound, gap, spread) of a run (`metrics.rounding.answer_bound`'s side; None for a
        run stored exactly; a run whose figures have no statistical bound has its angles as bounds)."""
        figures = self.figures(run_key)
        if figures is None:
            return None
        figures = completed(figures)
        return tuple(np.asarray(figures[f"{name}_{variant}"], dtype=np.float64) for name in ("bound", "gap", "spread"))

    def _statistical(self, run_keys: list[str]) -> bool:
        return any("bound_biased" in (self.figures(key) or {}) for key in run_keys)

    def require(self, identifier: str, run_keys: list[str], options: dict) -> None:
        """FailedPrecondition when a bound is asked of an answer that cannot have one (a metric
        outside the CKA family over a lossy run)."""
        lossy = [key for key in dict.fromkeys(run_keys) if self.figures(key) is not None]
        if lossy and not bounded(_metric_of(identifier), options):
            raise FailedPrecondition(
                f"{identifier} over run {lossy[0][:12]} (stored lossily) has no error bound: only linear CKA, "
                "biased and debiased, over the runs' own rows (`cka`, `cka-matrix`) carries one; ask for CKA, "
                "or capture the run with --dtype float16 or float32 for an exact answer, or leave "
                "require_bound off to get this answer with the run's stored error figures")

    def attached(self, answer: MetricAnswer) -> MetricAnswer:
        """`answer` with its bound (a bounded metric) or its runs' error figures and "not bounded"
        (any other) where one of its runs is lossy; unchanged otherwise."""
        p = answer.provenance
        lossy = [key for key in dict.fromkeys(p.run_keys) if self.figures(key) is not None]
        if not lossy:
            return answer
        if not bounded(p.metric, p.options):
            return self._not_bounded(answer, lossy)
        rows, columns = _entry_blocks(answer)  # (run, layer) of each entry's A side and B side
        same = _block_ids(rows)[:, None] == _block_ids(columns)[None, :]  # an entry of a layer against itself
        bounds = {}
        for variant, name in BOUND_ARRAYS.items():
            sides = {key: self._sides(key, variant) for key in dict.fromkeys(p.run_keys)}
            values = answer.arrays[variant]
            bound = answer_bound(values, _side_at(sides, rows, (slice(None), None)),
                                 _side_at(sides, columns, (None, slice(None))), debiased=variant == "debiased")
            # one layer of one run against itself: CKA 1 for the stored values and the exact ones alike, so
            # the answer is off by its own rounding only (a constant layer's CKA is NaN: undefined either
            # way, its bound left as its sides give it)
            bounds[name] = np.where(same & np.isfinite(values), np.abs(values - 1), bound)
        largest = max(_largest(bound) for bound in bounds.values())
        runs = f"run{'s' if len(lossy) > 1 else ''} {', '.join(key[:12] for key in lossy)} stored lossily"
        if self._statistical(lossy):
            confidence = CONFIDENCE
            how = (f"with probability >= {CONFIDENCE:.1%} for each entry, over the capture's seeded stochastic "
                   "rounding (Hoeffding; never above the sure angle arccos CKA(exact, stored))")
        else:
            confidence = 1.0
            how = "sure (the angles arccos CKA(exact, stored) measured at capture)"
        note = (f"error bound: every entry is within bound_biased / bound_debiased (largest {largest:.3g}) of the "
                f"CKA of the exact values, {how}, each lossy side's bound taken at the entry's own CKA and the two "
                f"sides added (METRICS.md): {runs}")
        scalars = {**answer.scalars, "error_bound": largest, "error_bound_confidence": confidence}
        return replace(answer, arrays={**answer.arrays, **bounds}, scalars=scalars,
                       notes=[*answer.notes, note], provenance=replace(p, error_bound=largest))

    def _not_bounded(self, answer: MetricAnswer, lossy: list[str]) -> MetricAnswer:
        rel = max(max(self.figures(key)["rel_frobenius"]) for key in lossy)
        worst = max(max(self.figures(key)["max_abs"]) for key in lossy)
        note = (f"not bounded: {answer.provenance.metric} has no error bound over lossily stored runs "
                f"({', '.join(key[:12] for key in lossy)}); their stored values are off by at most {worst:.3g} "
                f"(largest relative Frobenius error of a layer {rel:.3g}; `actstore describe RUN` has each layer's)")
        return replace(answer, scalars={**answer.scalars, "storage_rel_error": rel, "storage_max_error": worst},
                       notes=[*answer.notes, note], provenance=replace(answer.provenance, error_bound=math.nan))


def _entry_blocks(answer: MetricAnswer) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """The (run key, layer) of each row (A) and column (B) of a bounded answer's matrices."""
    p = answer.provenance
    if p.metric == "linear_cka":
        return ([(p.run_keys[0], layer) for layer in p.options["layers_a"]],
                [(p.run_keys[-1], layer) for layer in p.options["layers_b"]])
    blocks = [(p.run_keys[run], layer) for run, layer in zip(answer.arrays["block_run"], answer.arrays["block_layer"])]
    return blocks, blocks  # the matrix job: every layer of every run, block by block


def _block_ids(blocks: list[tuple[str, int]]) -> np.ndarray:
    return np.array([f"{run}:{layer}" for run, layer in blocks])


def _side_at(sides: dict, blocks: list[tuple[str, int]], axes: tuple) -> tuple:
    """(bound, gap, spread) of these blocks, shaped to broadcast along ``axes`` of the answer; a
    block of a run stored exactly adds nothing (all three 0)."""
    return tuple(np.array([0.0 if sides[run] is None else sides[run][part][layer] for run, layer in blocks])[axes]
                 for part in range(3))


def _largest(bound: np.ndarray) -> float:
    finite = bound[np.isfinite(bound)]
    return float(finite.max()) if finite.size == bound.size else math.nan


def _metric_of(identifier: str) -> str:
    """The result metric a query identifier's answer is stored under (the similarity family's names)."""
    return {"cka": "linear_cka"}.get(identifier, identifier)
