"""MEASURE similarity queries: the measures beyond CKA, named by similarity-repository identifiers
(`options.MEASURES`; definitions in docs/metrics.md, formulas in `metrics.similarity`).

Streamed measures (Procrustes, the shape metric, CCA, SVCCA, PWCCA) map `MomentMeasures` over the
shards, tiled like feature-space CKA to `max_accumulator_bytes`, and finalize the named measure for
every layer pair. The result's provenance names the measure by its identifier (parameters filled
in), and its options record them, so the cache keys on them.
"""

from __future__ import annotations

import numpy as np

from actstore.errors import InvalidArgument
from actstore.metrics import similarity as sim
from actstore.options import SIMILARITY, STREAMED_MEASURES, from_wire, resolve
from actstore.server.planners.similarity import SimilarityPlanner
from actstore.server.results import MetricResult
from actstore.store.catalog import RunRecord


def measure_params(request) -> dict:
    """The options of a MEASURE request (SimilarityRequest or CKAMatrixRequest), resolved through
    the SIMILARITY table: the measure is required; alpha is an optional field (0 is a value)."""
    measure = from_wire(SIMILARITY, "measure", request.measure)
    if measure is None:
        raise InvalidArgument(f"name the measure: one of {', '.join(SIMILARITY.measure.choices)}")
    alpha = resolve(SIMILARITY, "alpha", request.alpha if request.HasField("alpha") else None)
    params = {"measure": measure, "alpha": alpha}
    if hasattr(request, "sigma_fraction"):
        params["sigma_fraction"] = from_wire(SIMILARITY, "sigma_fraction", request.sigma_fraction)
        params["k"] = from_wire(SIMILARITY, "k", request.k)
    return params


def streamed_options(measure: str, alpha: float) -> dict:
    """What names a streamed measure's result: the measure, its filled identifier and the
    parameters it uses (alpha only for the shape metric, so other measures share one cache)."""
    options = {"measure": measure, "identifier": sim.identifier(measure, alpha)}
    if "{alpha}" in measure:
        options["alpha"] = alpha
    return options


class MeasurePlanner(SimilarityPlanner):
    def measure(self, run_a: str, run_b: str, layers_a: list[int], layers_b: list[int], refresh: bool,
                measure: str, alpha: float = 1.0, **_unused) -> MetricResult:
        """The len(la) x len(lb) matrix of `measure` between layers of run A and run B (default A)."""
        a, b, la, lb = self.checked_pair(run_a, run_b, layers_a, layers_b)
        if measure not in STREAMED_MEASURES:
            raise InvalidArgument(f"measure {measure!r} is not one of {', '.join(SIMILARITY.measure.choices)}")
        options = {"layers_a": la, "layers_b": lb, **streamed_options(measure, alpha)}
        return self.results.cached_or_compute(options["identifier"], sim.DEFINITION_VERSION, options,
                                              [a.run_key, b.run_key], refresh,
                                              lambda: self._streamed(a, b, la, lb, sim.moment_measure(measure, alpha)))

    def _streamed(self, a: RunRecord, b: RunRecord, la: list[int], lb: list[int], measure: sim.MomentMeasure):
        values = np.empty((len(la), len(lb)))
        pos_a = {layer: i for i, layer in enumerate(la)}
        pos_b = {layer: j for j, layer in enumerate(lb)}
        tiles = self._tiles(a, b, la, lb, "feature")
        for tile_a, tile_b in tiles:
            sources, ia, ib = self._blocks(a, b, tile_a, tile_b)
            widths = [a.width if run == a.run_key else b.width for run, layers in sources for _ in layers]
            total = self.executor.map_reduce(a.rows, sources, sim.MomentMeasures(widths))
            values[np.ix_([pos_a[x] for x in tile_a], [pos_b[x] for x in tile_b])] = total.finalize(measure, ia, ib)
        notes = [f"{measure.identifier} from streamed second moments over {a.rows} rows in {len(tiles)} tile(s)"]
        if np.isnan(values).any():
            notes.append("NaN where a layer is constant over the samples (the measure is undefined)")
        return {"values": values}, {"n": float(a.rows)}, notes
