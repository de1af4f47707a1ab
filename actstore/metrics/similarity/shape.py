"""Orthogonal Procrustes distances and the angular shape metric, from second moments only.

With the centred second moments `Cx = Xc^T Xc`, `Cy = Yc^T Yc` and `Cxy = Xc^T Yc` (sums over the n
samples, no 1/n; Xc = X minus its column means), everything below needs O(d^2) memory, never the
n x d data, so it runs on the streamed moments of `moments.FeatureMoments`:

- Orthogonal Procrustes (Schönemann 1966; Ding et al. 2021; Williams et al. 2021): over orthogonal Q
  (the narrower side zero-padded), `min_Q ||Xc Q - Yc||_F^2 = tr Cx + tr Cy - 2 ||Cxy||_*`, where
  `||.||_*` is the nuclear norm (sum of singular values). similarity-repository identifier
  `procrustes-distance=euclidean` (ReSi's "ProcrustesSizeAndShapeDistance", unnormalised).
- Angular Procrustes distance (Williams et al. 2021, "Generalized Shape Metrics on Neural
  Representations", eq. 4 with centred, Frobenius-normalised X, Y):
  `theta = arccos(||Cxy||_* / sqrt(tr Cx tr Cy))`, identifier `procrustes-distance=angular`.
- The angular shape metric with partial whitening (Williams et al. 2021, sec. 2.2; netrep's
  `LinearMetric(alpha)`): each side is mapped by `Z = V diag(alpha + (1 - alpha) lam^(-1/2)) V^T`
  with `Cx = V diag(lam) V^T`, then `theta = arccos(||Zx Cxy Zy||_* / sqrt(tr(Zx Cx Zx) tr(Zy Cy Zy)))`.
  alpha = 1 is the angular Procrustes distance, alpha = 0 whitens fully (a CCA-based metric:
  `sum_i rho_i / sqrt(rank_x rank_y)` inside the arccos). Identifier
  `shape_metric-alpha={alpha}-distance=angular`. netrep rescales Z to preserve the total variance;
  the angle does not depend on that scale, so it is left out.

Directions of Cx with eigenvalue <= `RANK_RTOL` times the largest carry no data (rank deficiency,
n <= d, a constant feature); whitening drops them instead of dividing by ~0. Invariances (ReSi,
Klabunde et al. 2023, table 1): all are invariant to translation and to orthogonal transforms of
either side; the angular Procrustes distance (alpha = 1) and alpha = 0 also to isotropic scaling,
alpha = 0 also to invertible linear maps. For 0 < alpha < 1 the whitening mixes `alpha` with
`lam^(-1/2)` of the unnormalised `Xc^T Xc`, as netrep does, so the metric depends on the scale of
the data (and on n), not only on its shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._numerics import column_centered
from .cka import normalised
from .inputs import paired

RANK_RTOL = 1e-10
"""Eigenvalues of Cx at or below this fraction of the largest count as zero (no data there)."""


@dataclass(frozen=True)
class Spectrum:
    """The kept eigen-directions of one block's centred second moment `C = Xc^T Xc`:
    `values` (descending, > RANK_RTOL * max) and `vectors` (d x r, orthonormal columns)."""

    values: np.ndarray
    vectors: np.ndarray

    @staticmethod
    def of(cov: np.ndarray) -> Spectrum:
        values, vectors = np.linalg.eigh(cov)
        values, vectors = values[::-1], vectors[:, ::-1]
        top = values[0] if len(values) else 0.0
        kept = values > RANK_RTOL * top if top > 0 else np.zeros(len(values), dtype=bool)
        return Spectrum(values[kept], np.ascontiguousarray(vectors[:, kept]))

    @property
    def rank(self) -> int:
        return len(self.values)


@dataclass(frozen=True)
class Whitened:
    """One side of the shape metric: the kept eigenbasis V of C, the scale s_i of each direction
    (`Z = V diag(s) V^T`) and `sq_norm = ||Xc Z||_F^2 = sum_i s_i^2 lam_i`."""

    vectors: np.ndarray
    scale: np.ndarray
    sq_norm: float

    @staticmethod
    def of(cov: np.ndarray, alpha: float) -> Whitened:
        spectrum = Spectrum.of(cov)
        scale = alpha + (1.0 - alpha) / np.sqrt(spectrum.values)
        return Whitened(spectrum.vectors, scale, float(np.sum(scale * scale * spectrum.values)))

    def cross(self, other: Whitened, cross: np.ndarray) -> np.ndarray:
        """`diag(s_a) V_a^T Cab V_b diag(s_b)`: `Za Cab Zb` in the two eigenbases."""
        return (self.vectors.T @ cross @ other.vectors) * self.scale[:, None] * other.scale[None, :]


def nuclear_norm(matrix: np.ndarray) -> float:
    """Sum of the singular values."""
    return float(np.linalg.svd(matrix, compute_uv=False).sum()) if matrix.size else 0.0


def angle(cosine: float | np.ndarray) -> float:
    """`arccos` of a cosine clipped to [-1, 1] (rounding can step past 1); NaN stays NaN."""
    return float(np.arccos(np.clip(cosine, -1.0, 1.0)))


def procrustes_euclidean(trace_a: float, trace_b: float, cross: np.ndarray) -> float:
    """`min_Q ||Xc Q - Yc||_F = sqrt(tr Cx + tr Cy - 2 ||Cxy||_*)` (0 where rounding goes below)."""
    return float(np.sqrt(max(trace_a + trace_b - 2.0 * nuclear_norm(cross), 0.0)))


def procrustes_angular(trace_a: float, trace_b: float, cross: np.ndarray) -> float:
    """`arccos(||Cxy||_* / sqrt(tr Cx tr Cy))`; NaN when a side is constant."""
    return angle(normalised(nuclear_norm(cross), trace_a, trace_b))


def shape_angular(side_a: Whitened, side_b: Whitened, cross: np.ndarray) -> float:
    """`arccos(||Za Cab Zb||_* / sqrt(||Xc Za||^2 ||Yc Zb||^2))`; NaN when a side is constant."""
    return angle(normalised(nuclear_norm(side_a.cross(side_b, cross)), side_a.sq_norm, side_b.sq_norm))


def centred_moments(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(Xc^T Xc, Yc^T Yc, Xc^T Yc)` of two paired matrices, in float64 (one-pass helpers)."""
    xs, ys = paired(x, y)
    xc, yc = column_centered(xs), column_centered(ys)
    return xc.T @ xc, yc.T @ yc, xc.T @ yc


def procrustes_distance(x: np.ndarray, y: np.ndarray, kind: str = "angular") -> float:
    """Orthogonal Procrustes distance between two representations of the same samples, one pass:
    `kind="angular"` (Williams et al. 2021) or `"euclidean"` (the unnormalised distance)."""
    cx, cy, cxy = centred_moments(x, y)
    if kind == "angular":
        return procrustes_angular(np.trace(cx), np.trace(cy), cxy)
    if kind == "euclidean":
        return procrustes_euclidean(np.trace(cx), np.trace(cy), cxy)
    raise ValueError(f"kind must be 'angular' or 'euclidean', got {kind!r}")


def shape_metric(x: np.ndarray, y: np.ndarray, alpha: float = 1.0) -> float:
    """The angular shape metric of Williams et al. 2021 with partial whitening `alpha` in [0, 1]."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    cx, cy, cxy = centred_moments(x, y)
    return shape_angular(Whitened.of(cx, alpha), Whitened.of(cy, alpha), cxy)
