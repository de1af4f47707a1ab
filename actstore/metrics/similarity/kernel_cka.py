"""RBF-kernel CKA (Kornblith, Norouzi, Lee & Hinton 2019, "Similarity of Neural Network
Representations Revisited", sec. 3 and their notebook `gram_rbf` / `cka`).

`K_ij = exp(-||x_i - x_j||^2 / (2 sigma^2))` with the bandwidth a fraction of the median distance,
`sigma^2 = fraction^2 * median_ij ||x_i - x_j||^2` (the median over the whole n x n matrix of
squared distances, its zero diagonal included, as the notebook takes it); then
- biased (Gretton et al. 2005 HSIC): `CKA = <HKH, HLH>_F / (||HKH||_F ||HLH||_F)`, H the centring
  matrix, identifier `cka-kernel=(rbf-sigma={sigma})-hsic=gretton-score`;
- debiased: `HSIC_u(K, L) / sqrt(HSIC_u(K, K) HSIC_u(L, L))` with the unbiased HSIC of Song et al.
  2007 (`cka.hsic_unbiased_gram`), identifier `cka-kernel=(rbf-sigma={sigma})-hsic=song-score`.
The identifier's sigma is per layer here (a fraction of each layer's median distance; `rbf_gram`
returns it): a query records the fraction. Memory O(n^2). Invariant to orthogonal maps,
translation and isotropic scaling (the bandwidth scales with the data); not to general linear maps.
"""

from __future__ import annotations

import numpy as np

from .._numerics import as_float64_matrix, column_centered
from .cka import hsic_unbiased_gram, normalised
from .inputs import paired, require_hsic_samples


def rbf_gram(x: np.ndarray, sigma_fraction: float = 1.0) -> tuple[np.ndarray, float]:
    """The n x n RBF Gram of the rows and its sigma (`fraction * sqrt(median squared distance)`).
    A layer whose rows are all equal has median 0: every entry is then 1 (a constant kernel)."""
    if not sigma_fraction > 0:
        raise ValueError(f"sigma_fraction must be > 0, got {sigma_fraction}")
    centred = column_centered(as_float64_matrix(x, "x"))
    gram = centred @ centred.T
    squares = np.diag(gram)
    distances = np.maximum(squares[:, None] + squares[None, :] - 2.0 * gram, 0.0)
    sigma_sq = sigma_fraction**2 * float(np.median(distances))
    if sigma_sq <= 0:
        return np.ones_like(distances), 0.0
    return np.exp(-distances / (2.0 * sigma_sq)), float(np.sqrt(sigma_sq))


def centred_unit_gram(gram: np.ndarray) -> np.ndarray:
    """`HKH / ||HKH||_F` (NaN when HKH is 0, e.g. a constant kernel)."""
    centred = gram - gram.mean(axis=0) - gram.mean(axis=1)[:, None] + gram.mean()
    norm = np.linalg.norm(centred)
    return centred / norm if norm > 0 else np.full_like(centred, np.nan)


def rbf_cka(x: np.ndarray, y: np.ndarray, sigma_fraction: float = 1.0, debiased: bool = False) -> float:
    """RBF-kernel CKA between two representations of the same samples (module docstring)."""
    xs, ys = paired(x, y)
    k, _ = rbf_gram(xs, sigma_fraction)
    l_, _ = rbf_gram(ys, sigma_fraction)
    if not debiased:
        return float(np.vdot(centred_unit_gram(k), centred_unit_gram(l_)))
    require_hsic_samples(len(xs))
    return debiased_from_grams(k, l_)


def debiased_from_grams(k: np.ndarray, l_: np.ndarray) -> float:
    """`HSIC_u(K, L) / sqrt(HSIC_u(K, K) HSIC_u(L, L))`, NaN where the denominator is not positive."""
    return float(normalised(hsic_unbiased_gram(k, l_), hsic_unbiased_gram(k, k), hsic_unbiased_gram(l_, l_)))
