"""Independent float64 reference formulas that server tests check answers against: METRICS.md
written out (an explicit centring matrix, the zero-diagonal Gram form of the unbiased HSIC),
never actstore's own metric functions."""

from __future__ import annotations

import numpy as np


def cka_numpy(x: np.ndarray, y: np.ndarray) -> float:
    """Biased linear CKA in Gram space with an explicit centering matrix (float64)."""
    x, y = x.astype(np.float64), y.astype(np.float64)
    h = np.eye(len(x)) - 1.0 / len(x)
    k, l_ = h @ x @ x.T @ h, h @ y @ y.T @ h
    return float(np.sum(k * l_) / np.sqrt(np.sum(k * k) * np.sum(l_ * l_)))


def hsic_u_numpy(k: np.ndarray, l_: np.ndarray) -> float:
    """Unbiased HSIC (Song et al. 2007) from the explicit zero-diagonal Gram formula."""
    n = len(k)
    k, l_ = k - np.diag(np.diag(k)), l_ - np.diag(np.diag(l_))
    one = np.ones(n)
    return float((np.trace(k @ l_) + (one @ k @ one) * (one @ l_ @ one) / ((n - 1) * (n - 2))
                  - 2 / (n - 2) * one @ k @ l_ @ one) / (n * (n - 3)))


def debiased_numpy(x: np.ndarray, y: np.ndarray) -> float:
    """Debiased linear CKA from Gram-space unbiased HSIC (which centring leaves unchanged)."""
    x, y = x.astype(np.float64), y.astype(np.float64)
    k, l_ = x @ x.T, y @ y.T
    return hsic_u_numpy(k, l_) / np.sqrt(hsic_u_numpy(k, k) * hsic_u_numpy(l_, l_))


def debiased_resampled_numpy(x: np.ndarray, y: np.ndarray, counts: np.ndarray) -> float:
    """Debiased CKA of a bootstrap resample (row i drawn counts[i] times) in which no row pairs
    with a copy of itself: the rows, centred at the sample's mean, repeated, and every entry
    between two copies of one row zeroed in both Grams before the zero-diagonal HSIC formula."""
    x, y = x.astype(np.float64), y.astype(np.float64)
    x, y = np.repeat(x - x.mean(0), counts, axis=0), np.repeat(y - y.mean(0), counts, axis=0)
    owner = np.repeat(np.arange(len(counts)), counts)
    copies = owner[:, None] == owner[None, :]
    k, l_ = np.where(copies, 0.0, x @ x.T), np.where(copies, 0.0, y @ y.T)
    return hsic_u_numpy(k, l_) / np.sqrt(hsic_u_numpy(k, k) * hsic_u_numpy(l_, l_))
