"""Mutual kNN alignment (Huh et al. 2024, "The Platonic Representation Hypothesis").

L2-normalise the rows of A and B (the same n samples in the same order). N_A(i) is the top-k of
row i of A A^T, excluding i itself. The score is `mean_i |N_A(i) ∩ N_B(i)| / k` (METRICS.md).
"""

from __future__ import annotations

import numpy as np

from .inputs import paired


def _nearest_neighbour_mask(matrix: np.ndarray, k: int) -> np.ndarray:
    """n x n mask of each row's k nearest rows by cosine similarity, the row itself excluded."""
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    unit_rows = matrix / np.where(norms == 0, 1.0, norms)
    similarity = unit_rows @ unit_rows.T
    np.fill_diagonal(similarity, -np.inf)
    neighbours = np.argpartition(-similarity, k - 1, axis=1)[:, :k]
    mask = np.zeros(similarity.shape, dtype=bool)
    np.put_along_axis(mask, neighbours, True, axis=1)
    return mask


def mutual_knn(x: np.ndarray, y: np.ndarray, k: int) -> float:
    """Mutual kNN alignment (Huh et al. 2024, "The Platonic Representation Hypothesis").

    L2-normalise the rows; N_A(i) is the top-k of row i of A A^T excluding i; the score is
    `mean_i |N_A(i) ∩ N_B(i)| / k`. Ties in similarity are broken arbitrarily.
    """
    xs, ys = paired(x, y)
    if not 1 <= k < len(xs):
        raise ValueError(f"k must satisfy 1 <= k < n = {len(xs)}, got k={k}")
    shared = _nearest_neighbour_mask(xs, k) & _nearest_neighbour_mask(ys, k)
    return float(shared.sum(axis=1).mean() / k)
