"""Outlier dimensions and massive activations, per layer, from streamed per-dimension moments.

A few residual-stream dimensions with huge, nearly constant values ("massive activations", Sun
et al. 2024; the outlier dimensions of Kovaleva et al. 2021 and Puccetti et al. 2022) dominate
linear CKA and cosine. Per layer, with the per-dimension mean mu_k and (population) std sigma_k over
the n samples:

- outlier severity `||mu|| / ||sigma||`: the norm of the mean vector over the norm of the std
  vector; about 0 for centred features, >> 1 when a common offset dominates every sample;
- the top-k dimensions by `|mu_k| / sigma_k` (dimensions with sigma_k = 0 are left out);
- excess kurtosis per dimension `n M4_k / M2_k^2 - 3` (0 for a Gaussian), reported as its maximum
  and mean over the dimensions with sigma_k > 0;
- outlier dimensions (the rule behind `exclude_outliers`): the dimensions whose root mean square
  `sqrt(mu_k^2 + sigma_k^2)` exceeds the mean RMS over the layer's other dimensions by more than
  `sigmas` standard deviations of those RMS (default 3: the 3-sigma rule of Kovaleva et al. 2021
  applied to the dimensions' magnitudes), with iterative sigma clipping: flagged dimensions leave
  the mean and std and the test repeats until nothing new is flagged; a flagged dimension must
  also reach `MIN_RMS_RATIO` (2) times the median RMS, so that the spread of ordinary
  heavy-tailed dimensions is never called an outlier.

`DimensionMoments` keeps, per dimension, n, the mean and the central sums M2, M3, M4 in float64:
the information of the power sums of x, x^2, x^3, x^4, in the form that does not cancel
catastrophically when |mu| >> sigma. Chunks and partial states combine in any order with the
pairwise formulas of Chan, Golub & LeVeque 1979 and Pebay 2008 (eq. 2.1, 3.1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

OUTLIER_SIGMAS = 3.0
MIN_RMS_RATIO = 2.0


@dataclass(frozen=True)
class DimensionStats:
    """One block's per-dimension mean, population std and excess kurtosis (NaN where std = 0)."""

    n: int
    mean: np.ndarray
    std: np.ndarray
    excess_kurtosis: np.ndarray


class DimensionMoments:
    """Streaming per-dimension mean and central moments (orders 2-4) of every block, float64."""

    def __init__(self, block_widths: Sequence[int]) -> None:
        self.block_widths = tuple(int(w) for w in block_widths)
        if not self.block_widths or min(self.block_widths) < 1:
            raise ValueError(f"block_widths must be widths >= 1, got {self.block_widths}")
        total = sum(self.block_widths)
        self.n = 0
        self._moments = np.zeros((4, total))  # mean, M2, M3, M4 of the stacked columns

    def update(self, blocks: Sequence[np.ndarray]) -> None:
        """Add one chunk: `blocks[b]` has shape (rows, block_widths[b])."""
        if len(blocks) != len(self.block_widths):
            raise ValueError(f"expected {len(self.block_widths)} blocks, got {len(blocks)}")
        rows = np.concatenate([np.asarray(b, dtype=np.float64) for b in blocks], axis=1)
        if rows.shape[1] != self._moments.shape[1]:
            raise ValueError(f"blocks have widths {[np.shape(b)[1] for b in blocks]}, expected {self.block_widths}")
        if not len(rows):
            return
        mean = rows.mean(axis=0)
        deviation = rows - mean
        squared = deviation * deviation
        chunk = np.stack([mean, squared.sum(axis=0), (squared * deviation).sum(axis=0),
                          (squared * squared).sum(axis=0)])
        self._combine(len(rows), chunk)

    def merge(self, other: DimensionMoments) -> DimensionMoments:
        """Add `other`'s rows (in place; `other` is unchanged) and return self."""
        if other.block_widths != self.block_widths:
            raise ValueError(f"cannot merge moments of widths {other.block_widths} into {self.block_widths}")
        if other.n:
            self._combine(other.n, other._moments)
        return self

    def _combine(self, count: int, moments: np.ndarray) -> None:
        """Pebay 2008's pairwise update of (n, mean, M2, M3, M4) with another set's."""
        na, nb = self.n, count
        n = na + nb
        mean_a, m2a, m3a, m4a = self._moments
        mean_b, m2b, m3b, m4b = moments
        delta = mean_b - mean_a
        m4 = (m4a + m4b + delta**4 * na * nb * (na * na - na * nb + nb * nb) / n**3
              + 6 * delta**2 * (na * na * m2b + nb * nb * m2a) / n**2 + 4 * delta * (na * m3b - nb * m3a) / n)
        m3 = m3a + m3b + delta**3 * na * nb * (na - nb) / n**2 + 3 * delta * (na * m2b - nb * m2a) / n
        m2 = m2a + m2b + delta**2 * na * nb / n
        self._moments = np.stack([mean_a + delta * nb / n, m2, m3, m4])
        self.n = n

    def finalize(self) -> list[DimensionStats]:
        """Per block: mean, population std, excess kurtosis per dimension."""
        if self.n == 0:
            raise ValueError("no rows were added; moments need at least one sample")
        mean, m2, _, m4 = self._moments
        with np.errstate(invalid="ignore", divide="ignore"):
            kurtosis = np.where(m2 > 0, self.n * m4 / (m2 * m2) - 3.0, np.nan)
        std = np.sqrt(m2 / self.n)
        edges = np.cumsum((0, *self.block_widths))
        return [DimensionStats(self.n, mean[a:b].copy(), std[a:b].copy(), kurtosis[a:b].copy())
                for a, b in zip(edges[:-1], edges[1:])]


@dataclass(frozen=True)
class OutlierSummary:
    """One layer's diagnosis (see the module docstring for each definition)."""

    severity: float
    top_dims: np.ndarray  # (k,) int, largest |mean|/std first
    top_ratio: np.ndarray  # (k,) |mean|/std of those dimensions
    top_mean: np.ndarray
    top_std: np.ndarray
    kurtosis_max: float
    kurtosis_mean: float
    outlier_dims: np.ndarray  # int, ascending


def outlier_dimensions(stats: DimensionStats, sigmas: float = OUTLIER_SIGMAS, rounds: int = 10) -> np.ndarray:
    """Dimensions whose RMS exceeds the mean RMS of the other dimensions by more than `sigmas` of
    their std, clipping iteratively (at most `rounds` times) so that one massive dimension's
    weight in the mean and std does not hide a smaller one; and whose RMS is at least
    `MIN_RMS_RATIO` times the median RMS over all dimensions."""
    rms = np.sqrt(stats.mean**2 + stats.std**2)
    flagged = np.zeros(len(rms), dtype=bool)
    for _ in range(rounds):
        rest = rms[~flagged]
        if len(rest) < 2 or rest.std() == 0:
            break
        now = rms > rest.mean() + sigmas * rest.std()
        if np.array_equal(now | flagged, flagged):
            break
        flagged |= now
    # a fluctuation of an ordinary dimension (heavy-tailed features spread the RMS) is no outlier
    return np.flatnonzero(flagged & (rms >= MIN_RMS_RATIO * np.median(rms))).astype(np.int64)


def summarise(stats: DimensionStats, top_k: int, sigmas: float = OUTLIER_SIGMAS) -> OutlierSummary:
    """Severity, top-k dimensions by |mean|/std, kurtosis max/mean and outlier dimensions. Fewer
    than k dimensions with std > 0 leave the rest of the top-k as -1 / NaN."""
    std_norm = float(np.linalg.norm(stats.std))
    severity = float(np.linalg.norm(stats.mean)) / std_norm if std_norm > 0 else float("nan")
    varying = stats.std > 0
    ratio = np.full(len(stats.mean), -np.inf)
    ratio[varying] = np.abs(stats.mean[varying]) / stats.std[varying]
    order = np.argsort(-ratio, kind="stable")[:top_k]
    order = order[np.isfinite(ratio[order])]
    pad = top_k - len(order)
    top_dims = np.concatenate([order, np.full(pad, -1)]).astype(np.int64)

    def padded(values: np.ndarray) -> np.ndarray:
        return np.concatenate([values[order], np.full(pad, np.nan)])

    kurtosis = stats.excess_kurtosis[varying]
    return OutlierSummary(
        severity=severity, top_dims=top_dims, top_ratio=padded(ratio), top_mean=padded(stats.mean),
        top_std=padded(stats.std),
        kurtosis_max=float(kurtosis.max()) if kurtosis.size else float("nan"),
        kurtosis_mean=float(kurtosis.mean()) if kurtosis.size else float("nan"),
        outlier_dims=outlier_dimensions(stats, sigmas))
