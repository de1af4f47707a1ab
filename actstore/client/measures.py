"""Client methods for any registered metric (`actstore.measures`; `actstore measures` lists them,
definitions in docs/metrics.md), by its identifier, through the one generic `Measure` RPC: a
metric registered on the server needs no new client code.

    c.measure("procrustes-distance=angular", run_a, run_b)           # MatrixResult, layers_a x layers_b
    c.measure("shape_metric-alpha={alpha}-distance=angular", run, alpha=0.5)
    c.measure("nbs-score", run_a, run_b)
    c.measure_matrix([run_1, run_2], "linear_regression-r2")        # every layer of every run, one job
    c.metric("cka", run_a, run_b, align="words")                    # any metric: its QueryAnswer
    c.metric("dataset_entropy", run, layers_a=[0, 3], alpha=2.0)
    c.metric("stitch", run_a, run_b, layers_a=[2], layers_b=[3], tune_steps=50)

The options are checked here, once, against the metric's spec (types, bounds; the server fills
the defaults and applies its limits); a measure's result has `provenance.metric`, the identifier
with its parameters filled in.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from actstore import measures
from actstore._proto.actstore.v1 import actstore_pb2 as pb
from actstore.client import plots
from actstore.client.display import Shown, Summary, bounds_text, metric_bounds, value_range
from actstore.client.results import JobInfo, MatrixResult, Provenance, QueryAnswer
from actstore.options import SIMILARITY

LEGACY = ("alpha", "sigma_fraction", "k")  # keywords every measure method took: ignored by a measure without them


def measure_options(measure: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """`given` checked against the measure's options (defaults filled); a legacy keyword the
    measure does not take is dropped, as it always was, any other unknown option is refused."""
    spec = measures.get(measure, query="measure")
    legacy = spec.taken({name: value for name, value in given.items() if name in LEGACY})
    own = {name: value for name, value in given.items() if name not in LEGACY and value is not None}
    return spec.resolve({**own, **legacy})


@dataclass(frozen=True, repr=False)
class MeasureMatrixResult(Shown):
    """A measure over every layer of several runs: block i is layer block_layer[i] of run
    runs[block_run[i]]; `values[i, j]` compares block i (as A) with block j (as B)."""

    matrix = True

    values: np.ndarray
    block_run: np.ndarray
    block_layer: np.ndarray
    runs: list[str]
    provenance: Provenance
    notes: list[str]

    @property
    def identifier(self) -> str:
        return self.provenance.metric

    def block(self, run_a: int, run_b: int) -> np.ndarray:
        """The (L_a+1) x (L_b+1) sub-matrix between two of the runs (by position)."""
        return self.values[np.ix_(self.block_run == run_a, self.block_run == run_b)]

    def plot(self, ax=None, **style):
        """Draw the measure between every layer of every run as one heatmap on `ax` (a new figure's
        when None): ticks model:layer, lines between the runs' blocks, the colour scale the
        measure's registered bounds where it has them (else the values' range). Returns the Axes."""
        low, high = metric_bounds(self.identifier)
        return plots.block_matrix(ax, self.values, self.block_run, self.block_layer, self.provenance,
                                  self.identifier, vmin=low, vmax=high, **style)

    def summary(self) -> Summary:
        return Summary(f"{self.identifier} matrix, {len(self.block_run)} layers of {len(self.runs)} runs",
                       self.provenance, [("values", value_range(self.values)),
                                         ("bounds", bounds_text(metric_bounds(self.identifier)))], self.notes,
                       pairwise=False)


class MeasuresMixin:
    """`Client`'s measure queries (needs its `_query` stub, `_matrix`, `wait` and `result`)."""

    def metric(self, metric: str, run_a: str, run_b: str | None = None, *,
               layers_a: Sequence[int] | None = None, layers_b: Sequence[int] | None = None,
               refresh: bool = False, **options: Any) -> QueryAnswer:
        """Any registered metric (`actstore measures` lists them: measures, cka, cos, the entropy
        family, residual_norm, nc1, lens, stitch) over run A's layers, or between run A's (rows)
        and run B's (columns; default A) for a metric of two runs; `options` are the metric's own.
        The answer is the metric's arrays and scalars as its own method returns them, with
        provenance and notes (`c.cka(...)` and `c.metric("cka", ...)` share one cached result)."""
        spec = measures.get(metric)
        request = pb.MeasureRequest(measure=metric, run_a=run_a, run_b=run_b or "", layers_a=list(layers_a or []),
                                    layers_b=list(layers_b or []), refresh=refresh,
                                    options_json=json.dumps(spec.check(options)))
        return QueryAnswer.from_proto(self._query.Measure(request))

    def measure(self, measure: str, run_a: str, run_b: str | None = None, *,
                layers_a: Sequence[int] | None = None, layers_b: Sequence[int] | None = None,
                refresh: bool = False, require_bound: bool = SIMILARITY.require_bound.default,
                **options: Any) -> MatrixResult:
        """`measure` (a registered identifier, e.g. procrustes-distance=angular, cca-squared_score,
        nbs-score, linear_regression-r2) between layers of run A (rows) and run B (columns; default
        A). `options`: the measure's own (`actstore measures` lists them), e.g. alpha (the shape
        metric's whitening), sigma_fraction (RBF CKA's bandwidth), k (the kNN measures' neighbours).
        Not bounded over a lossy run: its answer says so (`require_bound`: refused instead)."""
        request = pb.MeasureRequest(measure=measure, run_a=run_a, run_b=run_b or "", layers_a=list(layers_a or []),
                                    layers_b=list(layers_b or []), refresh=refresh, require_bound=require_bound,
                                    options_json=json.dumps(measure_options(measure, options)))
        return self._matrix(QueryAnswer.from_proto(self._query.Measure(request)))

    def submit_measure_matrix(self, runs: Sequence[str], measure: str, *, refresh: bool = False,
                              **options: Any) -> JobInfo:
        request = pb.CKAMatrixRequest(runs=list(runs), refresh=refresh, measure=measure,
                                      options_json=json.dumps(measure_options(measure, options)))
        return JobInfo.from_proto(self._query.SubmitCKAMatrix(request))

    def measure_matrix(self, runs: Sequence[str], measure: str, *, refresh: bool = False, progress: bool = False,
                       **options: Any) -> MeasureMatrixResult:
        """A streamed measure over every layer of every run (same samples) as one job that reads
        the data once, like `cka_matrix`; resumable if cancelled or interrupted."""
        job = self.submit_measure_matrix(runs, measure, refresh=refresh, **options)
        if not job.finished:
            job = self.wait(job.job_id, progress=progress, description=measure)
        answer = self.result(job.target)
        provenance = replace(answer.provenance, cached=job.cache_hit)
        return MeasureMatrixResult(answer.arrays["values"], answer.arrays["block_run"], answer.arrays["block_layer"],
                                   provenance.run_keys, provenance, answer.notes)
