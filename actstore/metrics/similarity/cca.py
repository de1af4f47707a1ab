"""CCA, SVCCA and PWCCA from second moments only (O(d^2) memory, streamable).

With `Cx = Xc^T Xc = Vx diag(lx) Vx^T` (kept directions, `shape.Spectrum`), `Cy` likewise and
`Cxy = Xc^T Yc`, the canonical correlations rho_1 >= ... >= rho_k (k = min(rank_x, rank_y)) are the
singular values of the whitened cross moment
`M = diag(lx^-1/2) Vx^T Cxy Vy diag(ly^-1/2) = U diag(rho) W^T` (Hotelling 1936; the SVD form of
Raghu et al. 2017, google/svcca `cca_core.py`).

- CCA, mean squared canonical correlation (Yanai's R^2_CCA, Kornblith et al. 2019 table 1):
  `sum_i rho_i^2 / k`, similarity-repository identifier `cca-squared_score`; the mean correlation
  `sum_i rho_i / k` is `cca-score`.
- SVCCA (Raghu et al. 2017) as ReSi computes it: keep each side's top principal directions that
  explain 99% of its variance (the fewest eigenvalues of Cx whose sum reaches 0.99 tr Cx), then the
  mean canonical correlation of the projections `Xc Vx[:, :kx]`, whose moments are `diag(lx[:kx])`
  and `Vx[:, :kx]^T Cxy Vy[:, :ky]`. Identifier `svcca-var=0.99-score`.
- PWCCA (Morcos, Raghu & Bengio 2018, "Insights on representational similarity in neural networks
  with canonical correlation", sec. 2.2): `sum_i a_i rho_i / sum_i a_i` with
  `a_i = sum_j |<h_i, x_j>|`, h_i the i-th canonical variate (unit norm) and x_j the j-th neuron
  (column of Xc), on the side with fewer non-null directions (A on a tie). From the moments:
  `h_i = Xc Vx diag(lx^-1/2) u_i`, so `<h_i, x_j> = (Cx Vx diag(lx^-1/2) u_i)_j
  = (Vx diag(lx^1/2) u_i)_j` and `a_i = ||Vx diag(lx^1/2) u_i||_1`. Identifier `pwcca-score`.
  google/svcca's `pwcca.py` orthonormalises `u_i^T Xc + mean` (no whitening, the means added
  back) instead of using h_i; this module follows the paper's definition, which is translation
  invariant.

Invariances (Klabunde et al. 2023, ReSi table 1): CCA to invertible linear maps of either side (so
orthogonal, isotropic scaling) and translation; SVCCA to orthogonal maps, isotropic scaling and
translation; PWCCA to isotropic scaling and translation only (its weights use the neuron basis),
and it is not symmetric. Rank deficient sides (n <= d, constant features) lose their null
directions (`shape.RANK_RTOL`); a constant side gives NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .shape import Spectrum, centred_moments

SVCCA_VARIANCE = 0.99


@dataclass(frozen=True)
class Whitening:
    """One side of CCA: the kept eigen-directions and their variances (`Spectrum`), optionally cut
    to the top directions that explain `variance` of the total (SVCCA)."""

    spectrum: Spectrum

    @staticmethod
    def of(cov: np.ndarray, variance: float | None = None) -> Whitening:
        spectrum = Spectrum.of(cov)
        if variance is not None and spectrum.rank:
            explained = np.cumsum(spectrum.values) / spectrum.values.sum()
            keep = int(np.searchsorted(explained, variance - 1e-12)) + 1
            spectrum = Spectrum(spectrum.values[:keep], spectrum.vectors[:, :keep])
        return Whitening(spectrum)

    @property
    def rank(self) -> int:
        return self.spectrum.rank

    def whitened_cross(self, other: Whitening, cross: np.ndarray) -> np.ndarray:
        """`diag(la^-1/2) Va^T Cab Vb diag(lb^-1/2)`, whose singular values are the correlations."""
        a, b = self.spectrum, other.spectrum
        return (a.vectors.T @ cross @ b.vectors) / np.sqrt(a.values)[:, None] / np.sqrt(b.values)[None, :]


def canonical_correlations(side_a: Whitening, side_b: Whitening, cross: np.ndarray) -> np.ndarray:
    """rho_1 >= ... >= rho_k, k = min(rank_a, rank_b), clipped to [0, 1] against rounding."""
    if not side_a.rank or not side_b.rank:
        return np.empty(0)
    return np.clip(np.linalg.svd(side_a.whitened_cross(side_b, cross), compute_uv=False), 0.0, 1.0)


def _mean_or_nan(values: np.ndarray) -> float:
    return float(values.mean()) if len(values) else float("nan")


def cca_squared(side_a: Whitening, side_b: Whitening, cross: np.ndarray) -> float:
    """Mean squared canonical correlation `sum rho_i^2 / k` (NaN when a side is constant)."""
    return _mean_or_nan(canonical_correlations(side_a, side_b, cross) ** 2)


def cca_mean(side_a: Whitening, side_b: Whitening, cross: np.ndarray) -> float:
    """Mean canonical correlation `sum rho_i / k` (also SVCCA's score on truncated sides)."""
    return _mean_or_nan(canonical_correlations(side_a, side_b, cross))


def pwcca(side_a: Whitening, side_b: Whitening, cross: np.ndarray) -> float:
    """Projection-weighted CCA (Morcos et al. 2018): `sum a_i rho_i / sum a_i`, the weights
    `a_i = ||V diag(l^1/2) u_i||_1` from the side with fewer directions (module docstring)."""
    if not side_a.rank or not side_b.rank:
        return float("nan")
    u, rho, wt = np.linalg.svd(side_a.whitened_cross(side_b, cross), full_matrices=False)
    rho = np.clip(rho, 0.0, 1.0)
    side, directions = (side_a, u) if side_a.rank <= side_b.rank else (side_b, wt.T)
    spectrum = side.spectrum
    weights = np.abs((spectrum.vectors * np.sqrt(spectrum.values)) @ directions).sum(axis=0)
    return float(weights @ rho / weights.sum())


def cca_similarity(x: np.ndarray, y: np.ndarray, kind: str = "cca-squared_score") -> float:
    """One-pass CCA family score between two representations of the same samples: `kind` is
    `cca-squared_score`, `cca-score`, `svcca-var=0.99-score` or `pwcca-score`."""
    cx, cy, cxy = centred_moments(x, y)
    variance = SVCCA_VARIANCE if kind == "svcca-var=0.99-score" else None
    score = {"cca-squared_score": cca_squared, "cca-score": cca_mean, "svcca-var=0.99-score": cca_mean,
             "pwcca-score": pwcca}.get(kind)
    if score is None:
        raise ValueError(f"kind {kind!r} is not a CCA-family identifier")
    return score(Whitening.of(cx, variance), Whitening.of(cy, variance), cxy)
