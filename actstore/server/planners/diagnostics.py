"""Is a similarity meaningful? CKA and COS with bootstrap intervals, CKA's permutation null and
calibrated score, feature options (standardise, exclude dimensions), and the per-layer outlier
report. Formulas: `metrics.similarity.uncertain_cka`, `uncertain_cos`, `features`, `resampling`
and `metrics.outliers`; definitions in docs/metrics.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from actstore.errors import InvalidArgument
from actstore.metrics import outliers as out
from actstore.metrics import similarity as sim
from actstore.metrics.similarity.features import FeatureTransform, TransformedAccumulator, feature_transform
from actstore.metrics.similarity.resampling import calibrated_score, percentile_interval, permutation_p_value
from actstore.metrics.similarity.uncertain_cos import ResampledCosine
from actstore.server.planners import Planner
from actstore.server.planners.cka_bootstrap import BootstrapPlan, plan_bootstrap, resampled_cka
from actstore.server.planners.similarity import SimilarityPlanner
from actstore.server.results import MetricResult
from actstore.server.tiling import pair_blocks, row_itemsize
from actstore.store.catalog import RunRecord

STATS_VERSION = 2  # 2: the outlier rule has no clipping; debiased replicates never pair copies


@dataclass(frozen=True)
class StatsOptions:
    """A SimilarityStats request's resolved options (tables: options.UNCERTAINTY)."""

    bootstrap: int
    ci: float
    seed: int
    null: int
    standardize: bool
    exclude_dims: list[int]
    exclude_outliers: bool
    outlier_sigmas: float
    bootstrap_method: str
    bootstrap_groups: int

    def key(self) -> dict:
        """What the result key records: every option that changes the numbers."""
        chosen = {"bootstrap": self.bootstrap, "ci": self.ci, "seed": self.seed, "null": self.null,
                  "standardize": self.standardize, "exclude_dims": sorted(self.exclude_dims),
                  "exclude_outliers": self.exclude_outliers}
        if self.exclude_outliers:
            chosen["outlier_sigmas"] = self.outlier_sigmas
        return chosen

    @property
    def transforms(self) -> bool:
        return self.standardize or self.exclude_outliers or bool(self.exclude_dims)


def _interval(replicates: np.ndarray, ci: float, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """The percentile interval (La, Lb, 2) and the bootstrap standard error (La, Lb) of (R, P) replicates."""
    interval = np.moveaxis(percentile_interval(replicates, ci), 0, -1).reshape(*shape, 2)
    return interval, np.nanstd(replicates, axis=0, ddof=1).reshape(shape)


class DiagnosticsPlanner(Planner):

    def outliers(self, run: str, layers: list[int], top_k: int, sigmas: float, refresh: bool) -> MetricResult:
        record = self.parts.checks.committed_run(run)
        chosen = self.parts.checks.check_layers(record, layers, "layer")
        self.parts.checks.check_finite(record, chosen)
        top_k = min(top_k, record.width)
        options = {"layers": chosen, "top_k": top_k, "outlier_sigmas": sigmas}

        def compute():
            stats = self._moments([(record.run_key, chosen)], record.rows, [record.width] * len(chosen))
            summaries = [out.summarise(s, top_k, sigmas) for s in stats]
            flagged = [(layer, dim) for layer, s in zip(chosen, summaries) for dim in s.outlier_dims]
            arrays = {
                "severity": np.array([s.severity for s in summaries]),
                "top_dims": np.stack([s.top_dims for s in summaries]),
                "top_ratio": np.stack([s.top_ratio for s in summaries]),
                "top_mean": np.stack([s.top_mean for s in summaries]),
                "top_std": np.stack([s.top_std for s in summaries]),
                "kurtosis_max": np.array([s.kurtosis_max for s in summaries]),
                "kurtosis_mean": np.array([s.kurtosis_mean for s in summaries]),
                "outlier_dims": np.array(flagged, dtype=np.int64).reshape(-1, 2),  # (layer, dimension) rows
            }
            return arrays, {"n": float(record.rows)}, [f"{len(flagged)} outlier dimension(s) over {len(chosen)} "
                                                        f"layer(s) by the {sigmas}-sigma RMS rule"]

        return self.parts.results.cached_or_compute("outliers", STATS_VERSION, options, [record.run_key], refresh,
                                                    compute)

    def similarity_stats(self, metric: str, run_a: str, run_b: str, layers_a: list[int], layers_b: list[int],
                         center: str, refresh: bool, opts: StatsOptions) -> MetricResult:
        a, b, la, lb = self.parts.checks.pair(run_a, run_b, layers_a, layers_b)
        too_wide = [d for d in opts.exclude_dims if d >= min(a.width, b.width)]
        if too_wide:
            raise InvalidArgument(f"exclude_dims {too_wide[0]} is out of range: the layers have "
                                  f"{min(a.width, b.width)} dimensions (0..{min(a.width, b.width) - 1})")
        run_keys = [a.run_key, b.run_key]
        if metric == "cka":
            plan = self._bootstrap_plan(a, b, la, lb, opts) if opts.bootstrap else None
            options = {"layers_a": la, "layers_b": lb, **opts.key(), **(plan.key() if plan else {})}
            return self.parts.results.cached_or_compute("linear_cka_stats", STATS_VERSION, options, run_keys, refresh,
                                                        lambda: self._cka_stats(a, b, la, lb, opts, plan))
        if metric == "cos":
            if a.width != b.width:
                raise InvalidArgument(f"COS needs equal widths ({a.width} != {b.width}): use CKA across widths")
            if opts.null:
                raise InvalidArgument("the permutation null is defined for CKA only: ask COS without null")
            if opts.bootstrap_method == "grouped":
                raise InvalidArgument("the grouped bootstrap is for CKA: COS's exact bootstrap is already streamed "
                                      "(ask COS with bootstrap_method auto or exact)")
            options = {"layers_a": la, "layers_b": lb, "center": center, **opts.key()}
            return self.parts.results.cached_or_compute("samplewise_cosine_stats", STATS_VERSION, options, run_keys,
                                                        refresh, lambda: self._cos_stats(a, b, la, lb, center, opts))
        raise InvalidArgument(f"similarity stats are for cka and cos, not {metric!r}")

    # ---- feature options ---------------------------------------------------------------------------
    def _moments(self, sources, rows: int, widths: list[int]) -> list[out.DimensionStats]:
        """Per-dimension moments of every block of `sources` (one pass)."""
        return self.parts.executor.map_reduce(rows, sources, out.DimensionMoments(widths)).finalize()

    def _transforms(self, sources, rows: int, widths: list[int], opts: StatsOptions, shared: bool
                    ) -> tuple[list[FeatureTransform] | None, list[np.ndarray]]:
        """One transform per block (None when nothing is asked) and each block's excluded dimensions.
        `shared`: every block excludes the union of all blocks' outlier dimensions (COS compares
        coordinates one to one, so both sides must keep the same ones)."""
        if not opts.transforms:
            return None, [np.zeros(0, dtype=np.int64)] * len(widths)
        stats = self._moments(sources, rows, widths) if opts.standardize or opts.exclude_outliers else None
        excluded = [set(opts.exclude_dims) for _ in widths]
        if opts.exclude_outliers:
            flagged = [set(out.outlier_dimensions(s, opts.outlier_sigmas).tolist()) for s in stats]
            union = set().union(*flagged)
            excluded = [e | (union if shared else f) for e, f in zip(excluded, flagged)]
        dropped = [np.array(sorted(e), dtype=np.int64) for e in excluded]
        try:
            transforms = [feature_transform(w, d, *((s.mean, s.std) if opts.standardize else ()))
                          for w, d, s in zip(widths, dropped, stats or [None] * len(widths))]
        except ValueError as exc:
            raise InvalidArgument(f"{exc}: exclude fewer dimensions") from None
        return transforms, dropped

    @staticmethod
    def _excluded_rows(layers: list[int], dropped: list[np.ndarray]) -> np.ndarray:
        """(layer, dimension) rows of what was left out of the given layers."""
        pairs = [(layer, int(dim)) for layer, dims in zip(layers, dropped) for dim in dims]
        return np.array(pairs, dtype=np.int64).reshape(-1, 2)

    def _notes(self, opts: StatsOptions, dropped_a: np.ndarray, dropped_b: np.ndarray) -> list[str]:
        notes = []
        if opts.standardize:
            notes.append("features z-scored per dimension (mean and std over all samples, a first pass)")
        if len(dropped_a) or len(dropped_b):
            notes.append(f"left out {len(dropped_a)} (A) and {len(dropped_b)} (B) layer-dimension(s): arrays "
                         "excluded_a / excluded_b list them as (layer, dimension)")
        if opts.bootstrap:
            notes.append(f"{opts.bootstrap} Poisson-bootstrap replicates (seed {opts.seed}), percentile intervals "
                         f"at {opts.ci}")
        return notes

    # ---- CKA -----------------------------------------------------------------------------------
    def _bootstrap_plan(self, a: RunRecord, b: RunRecord, la: list[int], lb: list[int], opts: StatsOptions
                        ) -> BootstrapPlan:
        """Exact or grouped bootstrap (`cka_bootstrap.plan_bootstrap`) for the requested pairs."""
        sources, ia, ib = pair_blocks(a, b, la, lb)
        widths = [a.width if run == a.run_key else b.width for run, layers in sources for _ in layers]
        return plan_bootstrap(opts.bootstrap_method, opts.bootstrap_groups, widths, [(i, j) for i in ia for j in ib],
                              a.rows, opts.bootstrap, self.parts.executor.settings.max_accumulator_bytes,
                              self.parts.executor.parts)

    def _cka_stats(self, a: RunRecord, b: RunRecord, la: list[int], lb: list[int], opts: StatsOptions,
                   plan: BootstrapPlan | None):
        sources, ia, ib = pair_blocks(a, b, la, lb)
        layer_of = [layer for _, layers in sources for layer in layers]
        widths = [a.width if run == a.run_key else b.width for run, layers in sources for _ in layers]
        transforms, dropped = self._transforms(sources, a.rows, widths, opts, shared=False)
        if transforms is not None:
            widths = [t.width for t in transforms]
        pairs = [(i, j) for i in ia for j in ib]
        excluded = {"excluded_a": self._excluded_rows([layer_of[i] for i in ia], [dropped[i] for i in ia]),
                    "excluded_b": self._excluded_rows([layer_of[j] for j in ib], [dropped[j] for j in ib])}
        notes = self._notes(opts, excluded["excluded_a"], excluded["excluded_b"])
        if not (opts.bootstrap or opts.null):  # the plain query's tiled path, on transformed rows
            keyed = None if transforms is None else {
                (run, layer): t for (run, layer), t in zip([(r, x) for r, ls in sources for x in ls], transforms)}
            arrays, scalars, plain_notes = SimilarityPlanner(self.parts).tiled_cka(a, b, la, lb, keyed)
            return {**arrays, **excluded}, scalars, plain_notes + notes
        itemsize = 8 if transforms is not None else row_itemsize(a, b)
        stats = resampled_cka(self.parts, a.rows, sources, widths, pairs, transforms, itemsize, opts.bootstrap,
                              opts.null, opts.seed, plan)
        shape = (len(la), len(lb))
        arrays = {"biased": stats.biased.reshape(shape), "debiased": stats.debiased.reshape(shape), **excluded}
        for variant in ("biased", "debiased"):
            if opts.bootstrap:
                replicates = getattr(stats, f"bootstrap_{variant}")
                arrays[f"{variant}_ci"], arrays[f"{variant}_se"] = _interval(replicates, opts.ci, shape)
                outside = (arrays[variant] < arrays[f"{variant}_ci"][..., 0]) | \
                    (arrays[variant] > arrays[f"{variant}_ci"][..., 1])
                if outside.any():
                    notes.append(f"{variant} CKA lies outside its own percentile interval for {int(outside.sum())} "
                                 "pair(s): a resample repeats rows, which inflates biased CKA at small n (an "
                                 "upward bias ~ width/n); prefer the debiased interval, or more samples")
            if opts.null:
                null = getattr(stats, f"null_{variant}")
                null_mean = null.mean(axis=0)
                arrays[f"{variant}_null_mean"] = null_mean.reshape(shape)
                arrays[f"{variant}_null_quantiles"] = np.moveaxis(
                    np.quantile(null, sim.QUANTILE_LEVELS, axis=0), 0, -1).reshape(*shape, -1)
                arrays[f"{variant}_calibrated"] = calibrated_score(getattr(stats, variant), null_mean).reshape(shape)
                arrays[f"{variant}_p_value"] = permutation_p_value(getattr(stats, variant), null).reshape(shape)
        if opts.null:
            arrays["quantile_levels"] = np.asarray(sim.QUANTILE_LEVELS)
            notes.append(f"null: {opts.null} permutations of B's rows (seed {opts.seed}); calibrated = "
                         "(CKA - null mean) / (1 - null mean)")
        if opts.bootstrap:
            notes.append("debiased replicates: no row pairs with a copy of itself (an approximation, docs/metrics.md)")
            notes.append(plan.note())
        scalars = {"n": float(a.rows), "bootstrap": float(opts.bootstrap), "null": float(opts.null),
                   "ci": opts.ci, "seed": float(opts.seed), "bootstrap_groups": float(plan.groups if plan else 0)}
        return arrays, scalars, notes

    # ---- COS -----------------------------------------------------------------------------------
    def _cos_stats(self, a: RunRecord, b: RunRecord, la: list[int], lb: list[int], center: str,
                   opts: StatsOptions):
        sources, ia, ib = pair_blocks(a, b, la, lb)
        layer_of = [layer for _, layers in sources for layer in layers]
        widths = [a.width] * len(layer_of)
        transforms, dropped = self._transforms(sources, a.rows, widths, opts, shared=True)
        pairs = [(i, j) for i in ia for j in ib]
        self.parts.checks.check_memory(ResampledCosine.estimate_nbytes(len(pairs), replicates=opts.bootstrap)
                                       * (self.parts.executor.parts + 1), f"the COS histograms and bootstrap sums of "
                                       f"{len(pairs)} layer pairs", "ask for fewer layer pairs or replicates")
        centers = None
        if center == "global-mean" and not opts.standardize:  # z-scored features have mean 0 already
            means = [self.parts.arrays.means(run)[layer] for run, layers in sources for layer in layers]
            centers = [m if transforms is None else m[t.keep] for m, t in zip(means, transforms or [None] * len(means))]
        if transforms is not None:
            widths = [t.width for t in transforms]
        accumulator = ResampledCosine(pairs, widths, centers, opts.bootstrap, opts.seed)
        if transforms is not None:
            accumulator = TransformedAccumulator(accumulator, transforms)
        result = self.parts.executor.map_reduce(a.rows, sources, accumulator).finalize()
        shape = (len(la), len(lb))
        arrays = {
            "mean": result.stats.mean.reshape(shape),
            "quantiles": result.stats.quantiles.reshape(*shape, -1),
            "quantile_levels": np.asarray(sim.QUANTILE_LEVELS),
            "excluded_a": self._excluded_rows([layer_of[i] for i in ia], [dropped[i] for i in ia]),
            "excluded_b": self._excluded_rows([layer_of[j] for j in ib], [dropped[j] for j in ib]),
        }
        if opts.bootstrap:
            arrays["mean_ci"], arrays["mean_se"] = _interval(result.bootstrap_mean, opts.ci, shape)
        notes = self._notes(opts, arrays["excluded_a"], arrays["excluded_b"])
        scalars = {"n": float(result.stats.n), "bootstrap": float(opts.bootstrap), "ci": opts.ci,
                   "seed": float(opts.seed)}
        return arrays, scalars, notes
