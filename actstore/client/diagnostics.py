"""The client's diagnostics (`Client.diagnostics`): CKA and COS with bootstrap intervals, CKA's permutation null and
calibrated score, feature options (standardise, exclude dimensions), and the outlier report.

    with Client.embedded("./actstore-data") as c:
        r = c.cka_stats(run_a, run_b, layers_a=[3], layers_b=[5], bootstrap=200, null=100)
        r.biased, r.biased_ci[..., 0], r.biased_ci[..., 1], r.biased_null.calibrated
        c.outliers(run).severity                 # ||mean|| / ||std|| per layer
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from actstore._proto.actstore.v1 import actstore_pb2 as pb
from actstore._proto.actstore.v1 import diagnostics_pb2
from actstore.client import plots
from actstore.client.arguments import checking_arguments, options
from actstore.client.display import Shown, Summary, layer_span, value_range
from actstore.client.results import Provenance, QueryAnswer
from actstore.client.transport import Connection
from actstore.options import SIMILARITY, UNCERTAINTY

U = UNCERTAINTY


@dataclass(frozen=True)
class NullStats:
    """The permutation null of one CKA variant, per layer pair: its mean, quantiles (at the
    result's quantile_levels), the calibrated score (CKA - mean) / (1 - mean) and the p-value."""

    mean: np.ndarray
    quantiles: np.ndarray
    calibrated: np.ndarray
    p_value: np.ndarray


def interval_facts(provenance: Provenance, interval: np.ndarray | None, name: str) -> list[tuple[str, str]]:
    """The interval of an answer's values as a summary's facts: its level, replicates and method."""
    if interval is None:
        return []
    options = provenance.options
    method = f", {options['bootstrap_method']}" if options.get("bootstrap_method") else ""
    return [(f"{name} interval", f"{options.get('ci', 0.95):.0%} percentile bootstrap, {options.get('bootstrap')} "
                                 f"replicates{method}: lows {value_range(interval[..., 0])}, highs "
                                 f"{value_range(interval[..., 1])}")]


@dataclass(frozen=True, repr=False)
class CKAStatsResult(Shown):
    """Linear CKA between layers_a (rows) and layers_b (columns) with what was asked: percentile
    intervals `*_ci` (La, Lb, 2) and bootstrap standard errors `*_se`, the null per variant, and
    the (layer, dimension) rows left out of each side. Unasked parts are None."""

    biased: np.ndarray
    debiased: np.ndarray
    layers_a: list[int]
    layers_b: list[int]
    n: int
    biased_ci: np.ndarray | None
    debiased_ci: np.ndarray | None
    biased_se: np.ndarray | None
    debiased_se: np.ndarray | None
    biased_null: NullStats | None
    debiased_null: NullStats | None
    quantile_levels: np.ndarray | None
    excluded_a: np.ndarray
    excluded_b: np.ndarray
    provenance: Provenance
    notes: list[str]

    matrix = True

    def plot(self, ax=None, *, debiased: bool = False, **style):
        """Draw CKA (biased, or `debiased`) on `ax` (a new figure's when None); returns the Axes.
        With bootstrap intervals: one line per layer of A over B's layers, a bar from each
        interval's low to its high, and with a null the 5%-95% band of its first layer of A;
        without: the heatmap (rows A's layers, columns B's)."""
        variant = "debiased" if debiased else "biased"
        null = getattr(self, f"{variant}_null")
        band = None
        if null is not None and self.quantile_levels is not None:
            levels = [round(float(q), 6) for q in self.quantile_levels]
            if 0.05 in levels and 0.95 in levels:
                band = (null.quantiles[0, :, levels.index(0.05)], null.quantiles[0, :, levels.index(0.95)])
        return plots.intervals(ax, getattr(self, variant), getattr(self, f"{variant}_ci"), self.provenance,
                               self.layers_a, self.layers_b, f"CKA ({variant})", null_band=band, **style)

    def summary(self) -> Summary:
        facts = [("n", str(self.n)), ("biased", value_range(self.biased))]
        facts += interval_facts(self.provenance, self.biased_ci, "biased")
        if self.biased_null is not None:
            null = self.biased_null
            facts.append(("null", f"{self.provenance.options.get('null')} permutations: calibrated "
                                  f"{value_range(null.calibrated)}, p {value_range(null.p_value)}"))
        excluded = len(self.excluded_a) + len(self.excluded_b)
        if excluded:
            facts.append(("excluded", f"{excluded} (layer, dimension) rows"))
        return Summary(f"linear CKA, {len(self.layers_a)} x {len(self.layers_b)} layers", self.provenance, facts,
                       self.notes)

    @staticmethod
    def from_answer(answer: QueryAnswer) -> CKAStatsResult:
        a, options = answer.arrays, answer.provenance.options

        def null(variant: str) -> NullStats | None:
            if f"{variant}_null_mean" not in a:
                return None
            return NullStats(*(a[f"{variant}_{part}"] for part in ("null_mean", "null_quantiles", "calibrated",
                                                                    "p_value")))

        return CKAStatsResult(a["biased"], a["debiased"], options["layers_a"], options["layers_b"],
                              int(answer.scalars["n"]), a.get("biased_ci"), a.get("debiased_ci"), a.get("biased_se"),
                              a.get("debiased_se"), null("biased"), null("debiased"), a.get("quantile_levels"),
                              a["excluded_a"], a["excluded_b"], answer.provenance, answer.notes)


@dataclass(frozen=True, repr=False)
class COSStatsResult(Shown):
    """Sample-wise cosine (mean and quantiles) with the bootstrap interval of the mean, `mean_ci`
    (La, Lb, 2), and its standard error `mean_se` (None without bootstrap)."""

    mean: np.ndarray
    quantiles: np.ndarray
    quantile_levels: np.ndarray
    layers_a: list[int]
    layers_b: list[int]
    n: int
    mean_ci: np.ndarray | None
    mean_se: np.ndarray | None
    excluded_a: np.ndarray
    excluded_b: np.ndarray
    provenance: Provenance
    notes: list[str]

    matrix = True

    def plot(self, ax=None, **style):
        """Draw the mean cosine on `ax` (a new figure's when None); returns the Axes. With bootstrap
        intervals: one line per layer of A over B's layers, a bar from each interval's low to its
        high; without: the heatmap (rows A's layers, columns B's)."""
        return plots.intervals(ax, self.mean, self.mean_ci, self.provenance, self.layers_a, self.layers_b,
                               "mean COS", **style)

    def summary(self) -> Summary:
        return Summary(f"sample-wise cosine, {len(self.layers_a)} x {len(self.layers_b)} layers", self.provenance,
                       [("n", str(self.n)), ("mean", value_range(self.mean)),
                        *interval_facts(self.provenance, self.mean_ci, "mean")], self.notes)


@dataclass(frozen=True, repr=False)
class OutlierReport(Shown):
    """Per layer: severity ||mean|| / ||std||, the top-k dimensions by |mean| / std (`top_dims`,
    with `top_ratio`, `top_mean`, `top_std`; -1 / NaN pads layers with fewer varying dimensions),
    excess kurtosis max and mean over dimensions, and the outlier dimensions as (layer, dimension)
    rows."""

    layers: list[int]
    severity: np.ndarray
    top_dims: np.ndarray
    top_ratio: np.ndarray
    top_mean: np.ndarray
    top_std: np.ndarray
    kurtosis_max: np.ndarray
    kurtosis_mean: np.ndarray
    outlier_dims: np.ndarray
    n: int
    provenance: Provenance
    notes: list[str]

    def outliers_of(self, layer: int) -> list[int]:
        """The outlier dimensions of one layer."""
        return [int(d) for l_, d in self.outlier_dims if l_ == layer]

    def plot(self, ax=None, *, show: str = "severity", **style):
        """Draw on `ax` (a new figure's when None) and return the Axes. show="severity": the
        severity ||mean|| / ||std|| and the largest excess kurtosis per layer (log scale);
        "dimensions": per layer the top dimensions' |mean| / std by rank, the first three
        labelled with their dimension."""
        return plots.outliers(ax, self, plots.choose(show, ("severity", "dimensions")), **style)

    def summary(self) -> Summary:
        return Summary(f"outlier diagnosis over layers {layer_span(self.layers)}", self.provenance,
                       [("n", str(self.n)), ("severity", value_range(self.severity)),
                        ("outlier dimensions", f"{len(self.outlier_dims)} (layer, dimension) pairs")], self.notes)


@checking_arguments
@dataclass(eq=False)
class Diagnostics:
    """CKA and cosine with bootstrap intervals and permutation nulls, and the outlier report (the
    Diagnostics service)."""

    connection: Connection

    def _stats(self, metric, run_a, run_b, layers_a, layers_b, center, refresh, bootstrap, ci, seed, null,
               standardize, exclude_dims, exclude_outliers, outlier_sigmas, bootstrap_method="",
               bootstrap_groups=None) -> QueryAnswer:
        query = pb.SimilarityRequest(metric=metric, run_a=run_a, run_b=run_b or "", layers_a=list(layers_a or []),
                                     layers_b=list(layers_b or []), center=center, refresh=refresh)
        features = diagnostics_pb2.FeatureOptions(standardize=standardize, exclude_dims=list(exclude_dims or []),
                                                  exclude_outliers=exclude_outliers, outlier_sigmas=outlier_sigmas)
        request = diagnostics_pb2.SimilarityStatsRequest(query=query, bootstrap=bootstrap, ci=ci, seed=seed,
                                                         null_permutations=null, features=features,
                                                         bootstrap_method=bootstrap_method,
                                                         bootstrap_groups=bootstrap_groups)
        return QueryAnswer.from_proto(self.connection.diagnostics.SimilarityStats(request))

    @options(UNCERTAINTY)
    def cka_stats(self, run_a: str, run_b: str | None = None, *, layers_a: Sequence[int] | None = None,
                  layers_b: Sequence[int] | None = None, bootstrap: int = U.bootstrap.default,
                  ci: float = U.ci.default, seed: int = U.seed.default, null: int = U.null.default,
                  standardize: bool = U.standardize.default, exclude_dims: Sequence[int] | None = None,
                  exclude_outliers: bool = U.exclude_outliers.default,
                  outlier_sigmas: float = U.outlier_sigmas.default, refresh: bool = False,
                  bootstrap_method: str = U.bootstrap_method.default,
                  bootstrap_groups: int = U.bootstrap_groups.default) -> CKAStatsResult:
        """Linear CKA (biased and debiased) with `bootstrap` Poisson-bootstrap replicates (percentile
        intervals at `ci`), `null` permutations of B's rows (null mean, quantiles, calibrated score,
        p-value), optionally on standardised features or without some dimensions.
        `bootstrap_method`: exact (every sample its own Poisson weight; holds the rows, cost ~ n^2),
        grouped (`bootstrap_groups` random groups of samples share a weight; D^2 per group, cost
        independent of n) or auto (exact while cheap); the provenance's options record which ran.
        The null holds the rows in memory (n x width per layer), so ask it for chosen pairs."""
        return CKAStatsResult.from_answer(self._stats(
            pb.SimilarityRequest.CKA, run_a, run_b, layers_a, layers_b, "", refresh, bootstrap, ci, seed, null,
            standardize, exclude_dims, exclude_outliers, outlier_sigmas, bootstrap_method, bootstrap_groups))

    @options(UNCERTAINTY, SIMILARITY)
    def cos_stats(self, run_a: str, run_b: str | None = None, *, layers_a: Sequence[int] | None = None,
                  layers_b: Sequence[int] | None = None, center: str = SIMILARITY.center.default,
                  bootstrap: int = U.bootstrap.default, ci: float = U.ci.default, seed: int = U.seed.default,
                  standardize: bool = U.standardize.default, exclude_dims: Sequence[int] | None = None,
                  exclude_outliers: bool = U.exclude_outliers.default,
                  outlier_sigmas: float = U.outlier_sigmas.default, refresh: bool = False) -> COSStatsResult:
        """Sample-wise cosine with a Poisson-bootstrap interval of its mean (streamed), optionally on
        standardised features or without some dimensions (the same ones on both sides)."""
        answer = self._stats(pb.SimilarityRequest.COS, run_a, run_b, layers_a, layers_b, center, refresh, bootstrap,
                             ci, seed, 0, standardize, exclude_dims, exclude_outliers, outlier_sigmas)
        a, options = answer.arrays, answer.provenance.options
        return COSStatsResult(a["mean"], a["quantiles"], a["quantile_levels"], options["layers_a"],
                              options["layers_b"], int(answer.scalars["n"]), a.get("mean_ci"), a.get("mean_se"),
                              a["excluded_a"], a["excluded_b"], answer.provenance, answer.notes)

    @options(UNCERTAINTY)
    def outliers(self, run: str, *, layers: Sequence[int] | None = None, top_k: int = U.top_k.default,
                 outlier_sigmas: float = U.outlier_sigmas.default, refresh: bool = False) -> OutlierReport:
        """Outlier and massive-activation diagnosis per layer (docs/metrics.md, "Outlier diagnostics")."""
        answer = QueryAnswer.from_proto(self.connection.diagnostics.Outliers(diagnostics_pb2.OutliersRequest(
            run=run, layers=list(layers or []), top_k=top_k, outlier_sigmas=outlier_sigmas, refresh=refresh)))
        a = answer.arrays
        return OutlierReport(answer.provenance.options["layers"], a["severity"], a["top_dims"], a["top_ratio"],
                             a["top_mean"], a["top_std"], a["kurtosis_max"], a["kurtosis_mean"], a["outlier_dims"],
                             int(answer.scalars["n"]), answer.provenance, answer.notes)
