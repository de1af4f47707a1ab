"""Measure queries: any registered measure (`actstore.measures`) between the layers of two runs.

What a measure needs decides the plan. MOMENTS measures (Procrustes, the shape metric, CCA, SVCCA,
PWCCA, NBS, linear-regression R^2 ...) map `MomentMeasures` over the shards, tiled like
feature-space CKA to `max_accumulator_bytes`, and finalize the measure for every layer pair. ROWS
measures (RSA, RBF CKA, the kNN family) run in tasks that prepare each layer (its RDM, kernel or
rows) and compare every pair, B's layers in groups whose prepared forms fit `max_accumulator_bytes`
(A's layers are prepared again per group); refused with RESOURCE_EXHAUSTED when not even two
prepared layers fit. The result is named by the measure's filled identifier and its definition
version, its options record the layers and the measure's options (`MeasureQuery.result_options`).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from actstore.measures import MOMENTS
from actstore.metrics import similarity as sim
from actstore.metrics.similarity import in_memory_measures as in_memory
from actstore.server.planners import Family, Planner, register_family
from actstore.server.requests import MeasureQuery
from actstore.server.results import MetricResult
from actstore.server.tiling import chunks, fill_tiles, row_itemsize


class MeasurePlanner(Planner):
    def measure(self, query: MeasureQuery) -> MetricResult:
        """The len(layers_a) x len(layers_b) matrix of the query's measure."""
        # a ROWS measure checks its memory before the cache is asked, as before
        compute = partial(self._streamed, query) if query.measure.needs == MOMENTS else self._in_memory(query)
        return self.parts.results.cached_or_compute(query.identifier, query.measure.version, query.result_options,
                                                    query.run_keys, query.refresh, compute)

    def _streamed(self, query: MeasureQuery):
        a, b, la, lb = query.a, query.b, query.layers_a, query.layers_b
        measure = query.measure.build(query.options)
        tiles = self.parts.sizing.pair_tiles(a, b, la, lb, "feature", row_itemsize(a, b))

        def tile(sources, ia, ib):
            widths = [a.width if run == a.run_key else b.width for run, layers in sources for _ in layers]
            total = self.parts.executor.map_reduce(a.rows, sources, sim.MomentMeasures(widths))
            return {"values": total.finalize(measure, ia, ib)}

        values = fill_tiles(a, b, la, lb, tiles, ("values",), tile)["values"]
        notes = [f"{query.identifier} from streamed second moments over {a.rows} rows in {len(tiles)} tile(s)"]
        if np.isnan(values).any():
            notes.append("NaN where a layer is constant over the samples (the measure is undefined)")
        if query.measure.whitens(query.options) and a.rows - 1 <= max(a.width, b.width):
            # centred rows span at most n - 1 dimensions: a layer that wide can match any direction
            # of the other exactly, so every canonical correlation (every fit) is 1 by construction
            notes.append(f"only {a.rows} samples for layers {max(a.width, b.width)} wide: {query.identifier} fits a "
                         "linear map of the whole space (whitening or regression), which is 1 by construction when "
                         "n - 1 <= width; capture more samples than the width or compare with CKA or Procrustes")
        return {"values": values}, {"n": float(a.rows)}, notes

    def _in_memory(self, query: MeasureQuery):
        """The computation of a ROWS measure, after checking that two prepared layers fit."""
        a, b, la, lb = query.a, query.b, query.layers_a, query.layers_b
        pairwise = query.measure.build(query.options)
        width = max(a.width, b.width)
        per_layer = in_memory.nbytes_per_layer(pairwise, a.rows, width)
        working = in_memory.nbytes_working(pairwise, a.rows, width)
        self.parts.checks.check_memory(2 * per_layer + working,
                                       f"{query.measure.identifier} over two prepared layers of n={a.rows}",
                                       "use fewer samples, or a streamed measure")
        # B's layers are prepared once per group and held while A's layers go by: as many as fit
        group = max(1, min(len(lb), (self.parts.sizing.limit - working) // per_layer - 1))

        def compute():
            values = np.hstack([self.parts.executor.evaluate_pairs(a.run_key, la, b.run_key, part, pairwise.compare,
                                                                   pairwise.prepare) for part in chunks(lb, group)])
            notes = [f"{query.identifier} over all {a.rows} samples in memory, B's layers in groups of {group}"]
            if np.isnan(values).any():
                notes.append("NaN where a layer's dissimilarities or kernel are constant (undefined)")
            return {"values": values}, {"n": float(a.rows)}, notes

        return compute


register_family(Family("measure", MeasureQuery, MeasurePlanner, "measure"))
