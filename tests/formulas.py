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


def biased_grouped_numpy(x: np.ndarray, y: np.ndarray, counts: np.ndarray) -> float:
    """Biased CKA of a grouped-bootstrap replicate: the rows centred at the sample's mean, row i
    weighted w_i = counts_i n / sum(counts), and (as in the zero-diagonal HSIC) copies of one row
    never pair with each other, each only with itself: explicit n x n Grams K~_ij = w_i w_j K_ij
    (i != j), K~_ii = w_i K_ii (a row's w_i copies each pair with itself), and the biased HSIC
    numerator of the multiset of total weight n: `sum_ij K~_ij L_ij - 2/n sum_i w_i
    (sum_j~ K)_i (sum_j~ L)_i + (1'K~1)(1'L~1)/n^2`, where a row's sum over the multiset is
    `(K w)_i - (w_i - 1) K_ii`."""
    x, y = x.astype(np.float64), y.astype(np.float64)
    n = len(counts)
    w = counts * n / counts.sum()
    xc, yc = x - x.mean(0), y - y.mean(0)

    def hsic(k: np.ndarray, l_: np.ndarray) -> float:
        pairs_k, pairs_l = np.outer(w, w) * k, np.outer(w, w) * l_
        np.fill_diagonal(pairs_k, w * np.diag(k))
        np.fill_diagonal(pairs_l, w * np.diag(l_))
        trace = np.sum(pairs_k * l_)
        row_k = k @ w - (w - 1) * np.diag(k)
        row_l = l_ @ w - (w - 1) * np.diag(l_)
        return trace - 2 / n * np.sum(w * row_k * row_l) + pairs_k.sum() * pairs_l.sum() / n**2

    k, l_ = xc @ xc.T, yc @ yc.T
    return hsic(k, l_) / np.sqrt(hsic(k, k) * hsic(l_, l_))
