"""A lossy capture's error figures, gathered over its tasks (`metrics.rounding.ErrorFigures`), and
its tolerance (`max_cka_error`).

Each capture or import task measures its own shards, where their exact values are, and returns
that with their chunk rows (`workers.capture.ShardsWritten`); the job merges the tasks' figures as
they finish and stores each run's at commit, with the run (`ArrayStore.write_error_figures`).

The exact values exist only while a task holds them, so a run's figures need every shard measured
in the job that commits it: a lossy run that an earlier job left unfinished (a crash, a
cancellation, a failed task) has its stored shards dropped and captured again, in full, by the job
that resumes it. Exact dtypes resume as before, from the shards they have.

A tolerance: a layer whose bound (the larger of its biased and debiased bound, `metrics.rounding`:
the statistical one, never above the angle; NaN counts as over)
is over the run's `max_cka_error` is not committed as int8. The job's second pass computes the
shards again and writes those layers exactly, float32, into the run's `exact` array; the run's
figures then say `stored: float32` with angle 0 for them, and their means are of the exact values.
"""

from __future__ import annotations

import logging
import math
import threading

import numpy as np

from actstore.metrics.rounding import SIDE_TERMS, ErrorFigures
from actstore.store.array_store import ArrayStore, RunLayout
from actstore.store.catalog import Catalog, RunRecord
from actstore.store.format.quantised import is_one_byte

log = logging.getLogger(__name__)
EXACT_COLUMN = "exact"  # 1.0 for a layer the tolerance kept exact (float32), else 0.0


class JobFigures:
    """The figures of one job's runs (several sites: one each), merged as tasks finish."""

    def __init__(self, catalog: Catalog, arrays: ArrayStore, layout: RunLayout, records: list[RunRecord]) -> None:
        self.catalog = catalog
        self.arrays = arrays
        self.layout = layout
        self.lossy = is_one_byte(layout.dtype)
        self.records = records
        self._figures: dict[str, ErrorFigures] = {}
        self._exact_sums: dict[str, dict[int, np.ndarray]] = {}
        self._kept: dict[str, list[int]] = {}
        self._finalized: dict[str, dict[str, list]] = {}  # per run, until a task's figures change it
        self._lock = threading.Lock()

    def restart(self, recorded: list[set[int]]) -> list[set[int]]:
        """The shards each run may keep: all it has for an exact dtype; none for a lossy one, whose
        stored shards (never measured by this job) are dropped first, from the store and the catalog."""
        if not self.lossy:
            return recorded
        for record, shards in zip(self.records, recorded):
            if shards:
                log.info("run %s is int8: its %d stored shards are captured again, so that its error figures "
                         "measure every shard's exact values", record.run_key[:12], len(shards))
                self.arrays.drop_shards(record.run_key, sorted(shards))
                self.catalog.chunks.drop_shards(record.run_key, sorted(shards), "running")
        return [set() for _ in recorded]

    def add(self, written) -> None:
        """Merge what a task measured (`ShardsWritten`: its rounding per run, its exact layers' sums)."""
        with self._lock:  # a task's figures come as Ray's read-only buffers: merged into a state of ours
            for run_key, part in (written.figures or {}).items():
                self._finalized.pop(run_key, None)
                if run_key not in self._figures:
                    self._figures[run_key] = ErrorFigures(len(part.moments), part.width)
                self._figures[run_key].merge(part)
            for run_key, sums in (written.exact_sums or {}).items():
                self._exact_sums.setdefault(run_key, {}).update(sums)

    def over_tolerance(self) -> dict[str, list[int]]:
        """Per run with a `max_cka_error`, the layers whose bound is over it (kept exact from now on)."""
        if not self.lossy:
            return {}
        for record in self.records:
            tolerance = record.spec.get("max_cka_error")
            if tolerance is None:
                continue
            figures = self._final(record.run_key)
            bounds = [max(b, d) if not (math.isnan(b) or math.isnan(d)) else math.inf
                      for b, d in zip(figures["bound_biased"], figures["bound_debiased"])]
            over = [layer for layer, bound in enumerate(bounds) if bound > tolerance]
            if over:
                self._kept[record.run_key] = over
                log.info("run %s: layers %s have bounds over max_cka_error %g (%s): kept exact (float32)",
                         record.run_key[:12], over, tolerance, ", ".join(f"{bounds[layer]:.3g}" for layer in over))
        return dict(self._kept)

    def of(self, run_key: str) -> dict[str, list] | None:
        """A run's figures per layer (None for an exact dtype); a layer kept exact has no error."""
        if not self.lossy:
            return None
        figures = dict(self._final(run_key))
        kept = set(self._kept.get(run_key, ()))
        exact = {"rel_frobenius": 0.0, "max_abs": 0.0, "cka_biased": 1.0, "cka_debiased": 1.0,
                 "angle_biased": 0.0, "angle_debiased": 0.0, "bound_biased": 0.0, "bound_debiased": 0.0,
                 **{name: 0.0 for name in SIDE_TERMS}}
        for name, value in exact.items():
            figures[name] = [value if layer in kept else v for layer, v in enumerate(figures[name])]
        figures[EXACT_COLUMN] = [float(layer in kept) for layer in range(len(figures["rows"]))]
        return figures

    def _final(self, run_key: str) -> dict[str, list]:
        """A run's finalized figures, made once (the moments' (2d)^2 copies and norms per layer):
        the tolerance and the commit both read them, and a second pass adds no figures."""
        with self._lock:
            if run_key not in self._finalized:
                self._finalized[run_key] = self._figures[run_key].finalize()
            return self._finalized[run_key]

    def means(self, run_key: str) -> dict[int, np.ndarray] | None:
        """The layers kept exact: their means, of the exact values (None when there are none)."""
        kept = self._kept.get(run_key)
        if not kept:
            return None
        sums = self._exact_sums[run_key]
        total = sum(sums[shard] for shard in sorted(sums))  # in shard order: the same bits whatever the arrival
        return {layer: total[i] / self.layout.rows for i, layer in enumerate(kept)}
