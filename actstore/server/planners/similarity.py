"""Similarity queries between two runs: linear CKA (biased and debiased), sample-wise cosine,
minibatch CKA and mutual k-NN, tiled to the memory limit (formulas: `metrics.similarity`)."""

from __future__ import annotations

from functools import partial

import numpy as np

from actstore.errors import InvalidArgument
from actstore.metrics import similarity as sim
from actstore.metrics.similarity.features import TransformedAccumulator
from actstore.options import SIMILARITY
from actstore.server.planners import Family, Planner, register_family
from actstore.server.planners.aligned import AlignedPlanner
from actstore.server.requests import SimilarityQuery
from actstore.server.results import MetricResult
from actstore.server.tiling import fill_tiles, pair_blocks, row_itemsize
from actstore.store.catalog import RunRecord


def constant_layers_note(constant: list[tuple[str, int]], n: int) -> str:
    """The note for CKA's NaN at layers constant over the samples: `constant` (run key, layer)."""
    layers: dict[str, list[int]] = {}
    for run, layer in sorted(set(constant)):
        layers.setdefault(run, []).append(layer)
    named = "; ".join(f"run {run[:12]} layer{'s' if len(found) > 1 else ''} {', '.join(map(str, found))}"
                      for run, found in layers.items())
    one = len(set(constant)) == 1
    return (f"NaN: {named} {'is' if one else 'are'} constant over the {n} samples (zero variance), so CKA with "
            f"{'it' if one else 'them'} is undefined (0/0), biased and debiased alike: leave "
            f"{'it' if one else 'them'} out of the layers")


class SimilarityPlanner(Planner):

    def similarity(self, query: SimilarityQuery) -> MetricResult:
        if query.align != "none":  # different tokenizers: rows are shared words (or spans)
            return AlignedPlanner(self.parts).similarity(query)
        answer = {"cka": self._cka, "cos": self._cos_query, "minibatch_cka": self._minibatch_query,
                  "mutual_knn": self._knn_query}
        return answer[query.metric](query)

    def _cka(self, query: SimilarityQuery) -> MetricResult:
        a, b, la, lb = query.a, query.b, query.layers_a, query.layers_b
        options = {"layers_a": la, "layers_b": lb}
        return self.parts.results.cached_or_compute("linear_cka", sim.DEFINITION_VERSION, options, query.run_keys,
                                                    query.refresh, lambda: self.tiled_cka(a, b, la, lb))

    def _cos_query(self, query: SimilarityQuery) -> MetricResult:
        a, b, la, lb, center = query.a, query.b, query.layers_a, query.layers_b, query.center
        if a.width != b.width:
            raise InvalidArgument(f"COS compares one sample's vectors directly, so the widths must match "
                                  f"({a.width} != {b.width}): COS is for layers of one model or of models "
                                  "of equal width; use CKA across widths")
        pairs = len(la) * len(lb)  # each map task holds an accumulator, and the merge one more
        self.parts.checks.check_memory(sim.CosineAccumulator.estimate_nbytes(pairs) * (self.parts.executor.parts + 1),
                                       f"the COS histograms of {pairs} layer pairs", "ask for fewer layer pairs")
        options = {"layers_a": la, "layers_b": lb, "center": center}
        return self.parts.results.cached_or_compute("samplewise_cosine", sim.DEFINITION_VERSION, options,
                                                    query.run_keys, query.refresh,
                                                    lambda: self._cos(a, b, la, lb, center))

    def _minibatch_query(self, query: SimilarityQuery) -> MetricResult:
        a, b, la, lb = query.a, query.b, query.layers_a, query.layers_b
        minimum = SIMILARITY.batch_size.minimum
        if a.rows < minimum:
            raise InvalidArgument(f"minibatch CKA needs batches of at least {minimum} "
                                  f"samples and the runs hold {a.rows}: use cka, or a run with more samples")
        batch_size, remainder = query.batch_size, query.remainder  # required: None was not given
        if batch_size is None or batch_size > a.rows:
            raise InvalidArgument(f"batch_size {batch_size or 0!r} must be an int between {minimum} and n={a.rows}")
        options = {"layers_a": la, "layers_b": lb, "batch_size": batch_size, "remainder": remainder}
        return self.parts.results.cached_or_compute("minibatch_cka", sim.DEFINITION_VERSION, options, query.run_keys,
                                                    query.refresh, lambda: self._minibatch(a, b, la, lb, batch_size,
                                                                                     remainder))

    def _knn_query(self, query: SimilarityQuery) -> MetricResult:
        a, b, la, lb, k = query.a, query.b, query.layers_a, query.layers_b, query.k
        if not SIMILARITY.k.minimum <= k < a.rows:
            raise InvalidArgument(f"k={k} must be between {SIMILARITY.k.minimum} and n-1={a.rows - 1}")
        self.parts.checks.check_in_memory(a, 2, square=True)
        options = {"layers_a": la, "layers_b": lb, "k": k}

        def knn():
            values = self.parts.executor.evaluate_pairs(a.run_key, la, b.run_key, lb, partial(sim.mutual_knn, k=k))
            return {"values": values}, {"n": float(a.rows), "k": float(k)}, []

        return self.parts.results.cached_or_compute("mutual_knn", sim.DEFINITION_VERSION, options, query.run_keys,
                                                    query.refresh, knn)

    def _minibatch(self, a: RunRecord, b: RunRecord, la: list[int], lb: list[int], batch_size: int,
                   remainder: str):
        full, short = divmod(a.rows, batch_size)
        stops = [batch_size * (i + 1) for i in range(full)]
        if short and remainder == "merge":
            stops[-1] = a.rows
        batches = list(zip([0, *stops[:-1]], stops))
        parts = max(1, min(self.parts.executor.groups, len(batches)))  # the cluster's size changes no sum
        groups = [batches[i::parts] for i in range(parts)]
        sources, ia, ib = pair_blocks(a, b, la, lb)
        widths = [a.width if run == a.run_key else b.width for run, layers in sources for _ in layers]
        pairs = [(i, j) for i in ia for j in ib]
        total = self.parts.executor.map_reduce(a.rows, sources, sim.MinibatchCKAAccumulator(pairs, widths), groups)
        outcome = "none" if not short else ("dropped" if remainder == "drop" else "merged")
        notes = [f"{len(batches)} batches of {batch_size} rows; the short final batch of {short} rows was "
                 f"{outcome}"] if short else [f"{len(batches)} batches of {batch_size} rows"]
        return ({"values": total.finalize().reshape(len(la), len(lb))},
                {"n": float(a.rows), "batches": float(len(batches)), "batch_size": float(batch_size)}, notes)

    def tiled_cka(self, a: RunRecord, b: RunRecord, la: list[int], lb: list[int], transforms: dict | None = None):
        """Biased and debiased CKA of la x lb, tiled to the memory limit. `transforms` maps (run key,
        layer) to a `features.FeatureTransform` applied to that block's rows first (float64 rows)."""
        def blocks_of(sources):
            return [(run, layer) for run, layers in sources for layer in layers]

        def widths_of(sources):
            return [transforms[run, layer].width if transforms else a.width if run == a.run_key else b.width
                    for run, layer in blocks_of(sources)]

        def accumulator(sources):
            inner = sim.SimilarityAccumulator(widths_of(sources), mode)
            if transforms is None:
                return inner
            return TransformedAccumulator(inner, [transforms[block] for block in blocks_of(sources)])

        sources, _, _ = pair_blocks(a, b, la, lb)
        itemsize = row_itemsize(a, b) if transforms is None else 8
        mode = self.parts.sizing.mode(widths_of(sources), a.rows, itemsize)
        tiles = self.parts.sizing.pair_tiles(a, b, la, lb, mode, itemsize)
        constant: set[tuple[str, int]] = set()

        def tile(sources, ia, ib):
            total = self.parts.executor.map_reduce(a.rows, sources, accumulator(sources))
            # the merged total is this query's own: its moments move to the mean in place
            matrices = total.finalize(strip_map=self.parts.executor.gram_strip_map, in_place=True)
            # a block's CKA with itself is 0/0 exactly when its centred rows are all zero
            constant.update(blocks_of(sources)[k] for k in np.flatnonzero(np.isnan(np.diag(matrices.biased))))
            return {"biased": matrices.biased[np.ix_(ia, ib)], "debiased": matrices.debiased[np.ix_(ia, ib)]}

        filled = fill_tiles(a, b, la, lb, tiles, ("biased", "debiased"), tile)
        biased, debiased = filled["biased"], filled["debiased"]
        notes = [f"computed in {mode} space over {a.rows} rows in {len(tiles)} tile(s)"]
        if constant:
            notes.append(constant_layers_note(list(constant), a.rows))
        explained = np.array([[(a.run_key, x) in constant or (b.run_key, y) in constant for y in lb] for x in la])
        if np.any(np.isnan(debiased) & ~explained):
            notes.append("debiased CKA is NaN where HSIC_u(K,K) or HSIC_u(L,L) is not positive"
                         + (f" (everywhere for n={a.rows}: the unbiased HSIC needs n >= {sim.MIN_HSIC_SAMPLES})"
                            if a.rows < sim.MIN_HSIC_SAMPLES else ""))
        return {"biased": biased, "debiased": debiased}, {"n": float(a.rows)}, notes

    def _cos(self, a: RunRecord, b: RunRecord, la: list[int], lb: list[int], center: str):
        sources, ia, ib = pair_blocks(a, b, la, lb)
        pairs = [(i, j) for i in ia for j in ib]
        centers = None
        if center == "global-mean":
            centers = [self.parts.arrays.means(run)[layer] for run, layers in sources for layer in layers]
        widths = [a.width] * sum(len(layers) for _, layers in sources)
        total = self.parts.executor.map_reduce(a.rows, sources, sim.CosineAccumulator(pairs, widths, centers))
        stats = total.finalize()
        shape = (len(la), len(lb))
        arrays = {
            "mean": stats.mean.reshape(shape),
            "quantiles": stats.quantiles.reshape(*shape, -1),
            "quantile_levels": np.asarray(sim.QUANTILE_LEVELS),
        }
        notes = []
        if stats.zero_norm.any():
            notes.append(f"{int(stats.zero_norm.max())} samples had a zero vector; their cosine counts as 0")
        return arrays, {"n": float(stats.n)}, notes


register_family(Family("similarity", SimilarityQuery, SimilarityPlanner, "similarity"))
