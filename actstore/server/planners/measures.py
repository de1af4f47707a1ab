"""MEASURE similarity queries: the measures beyond CKA, named by similarity-repository identifiers
(`options.MEASURES`; definitions in docs/metrics.md, formulas in `metrics.similarity`).

Streamed measures (Procrustes, the shape metric, CCA, SVCCA, PWCCA) map `MomentMeasures` over the
shards, tiled like feature-space CKA to `max_accumulator_bytes`, and finalize the named measure for
every layer pair. In-memory measures (RSA, RBF CKA, the kNN family) run in tasks that prepare each
layer (its RDM, kernel or rows) and compare every pair, B's layers in groups whose prepared forms fit
`max_accumulator_bytes` (A's layers are prepared again per group); refused with RESOURCE_EXHAUSTED
when not even two prepared layers fit. The result's provenance names the
measure by its identifier (parameters filled in), and its options record the parameters the
measure uses, so the cache keys on them.
"""

from __future__ import annotations

import numpy as np

from actstore.errors import InvalidArgument
from actstore.metrics import similarity as sim
from actstore.metrics.similarity import in_memory_measures as in_memory
from actstore.options import SIMILARITY, STREAMED_MEASURES, from_message, from_wire
from actstore.server.planners.similarity import SimilarityPlanner
from actstore.server.results import MetricResult
from actstore.server.tiling import chunks, row_itemsize
from actstore.store.catalog import RunRecord


def measure_params(request) -> dict:
    """The options of a MEASURE request (SimilarityRequest or CKAMatrixRequest), resolved through
    the SIMILARITY table: the measure is required; alpha, sigma_fraction and k are optional fields
    (alpha 0 is a value; sigma_fraction or k 0 is refused)."""
    measure = from_wire(SIMILARITY, "measure", request.measure)
    if measure is None:
        raise InvalidArgument(f"name the measure: one of {', '.join(SIMILARITY.measure.choices)}")
    alpha = from_message(SIMILARITY, "alpha", request)
    params = {"measure": measure, "alpha": alpha}
    if hasattr(request, "sigma_fraction"):
        params["sigma_fraction"] = from_message(SIMILARITY, "sigma_fraction", request)
        params["k"] = from_message(SIMILARITY, "k", request)
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
        if a.rows < sim.MIN_HSIC_SAMPLES:
            raise InvalidArgument(f"{measure} needs n >= {sim.MIN_HSIC_SAMPLES} samples, the runs hold {a.rows}")
        if measure in in_memory.IN_MEMORY_MEASURES:
            return self._in_memory(a, b, la, lb, refresh, measure, **_unused)
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
        tiles = self._tiles(a, b, la, lb, "feature", row_itemsize(a, b))
        for tile_a, tile_b in tiles:
            sources, ia, ib = self._blocks(a, b, tile_a, tile_b)
            widths = [a.width if run == a.run_key else b.width for run, layers in sources for _ in layers]
            total = self.executor.map_reduce(a.rows, sources, sim.MomentMeasures(widths))
            values[np.ix_([pos_a[x] for x in tile_a], [pos_b[x] for x in tile_b])] = total.finalize(measure, ia, ib)
        notes = [f"{measure.identifier} from streamed second moments over {a.rows} rows in {len(tiles)} tile(s)"]
        if np.isnan(values).any():
            notes.append("NaN where a layer is constant over the samples (the measure is undefined)")
        whitens = measure.identifier.startswith(("cca", "svcca", "pwcca")) or (
            measure.identifier.startswith("shape_metric") and "alpha=1-" not in measure.identifier)
        if whitens and a.rows - 1 <= max(a.width, b.width):
            # centred rows span at most n - 1 dimensions: a layer that wide can match any direction
            # of the other exactly, so every canonical correlation is 1 by construction
            notes.append(f"only {a.rows} samples for layers {max(a.width, b.width)} wide: whitening measures "
                         "(CCA, SVCCA, PWCCA, the shape metric below alpha 1) are 1 by construction when "
                         "n - 1 <= width; capture more samples than the width or compare with CKA or Procrustes")
        return {"values": values}, {"n": float(a.rows)}, notes

    def _in_memory(self, a: RunRecord, b: RunRecord, la: list[int], lb: list[int], refresh: bool, measure: str,
                   sigma_fraction: float = 1.0, k: int = 10) -> MetricResult:
        pairwise = in_memory.pairwise_measure(measure, sigma_fraction, k)
        options = {"layers_a": la, "layers_b": lb, "measure": measure, "identifier": pairwise.identifier}
        if measure in in_memory.RBF_MEASURES:
            options["sigma_fraction"] = sigma_fraction
        if measure in in_memory.KNN_MEASURES:
            options["k"] = k
            if not SIMILARITY.k.minimum <= k < a.rows:
                raise InvalidArgument(f"k={k} must be between {SIMILARITY.k.minimum} and n-1={a.rows - 1}")
        width = max(a.width, b.width)
        per_layer = in_memory.nbytes_per_layer(pairwise, a.rows, width)
        working = in_memory.nbytes_working(pairwise, a.rows, width)
        self.checks.check_memory(2 * per_layer + working, f"{measure} over two prepared layers of n={a.rows}",
                                 "use fewer samples, or a streamed measure")
        # B's layers are prepared once per group and held while A's layers go by: as many as fit
        group = max(1, min(len(lb), (self.sizing.limit - working) // per_layer - 1))

        def compute():
            values = np.hstack([self.executor.evaluate_pairs(a.run_key, la, b.run_key, part, pairwise.compare,
                                                             pairwise.prepare) for part in chunks(lb, group)])
            notes = [f"{pairwise.identifier} over all {a.rows} samples in memory, B's layers in groups of {group}"]
            if np.isnan(values).any():
                notes.append("NaN where a layer's dissimilarities or kernel are constant (undefined)")
            return {"values": values}, {"n": float(a.rows)}, notes

        return self.results.cached_or_compute(pairwise.identifier, sim.DEFINITION_VERSION, options,
                                              [a.run_key, b.run_key], refresh, compute)
