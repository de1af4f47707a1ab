"""What the client's measure queries (`Queries.metric`, `measure`, `measure_matrix`) share: any
registered metric (`actstore.measures`; `actstore measures` lists them, definitions in
docs/metrics.md) asked by its identifier through the one generic `Measure` RPC, so a metric
registered on the server needs no new client code; its options checked here, and the matrix
job's result.

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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from actstore import measures
from actstore.client import plots
from actstore.client.display import Shown, Summary, bounds_text, metric_bounds, value_range
from actstore.client.results import Provenance

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
