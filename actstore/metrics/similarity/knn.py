"""Nearest-neighbour alignment (Huh, Cheung, Wang & Isola 2024, "The Platonic Representation
Hypothesis", and their code, platonic-rep `metrics.py`).

L2-normalise the rows of A and B (the same n samples in the same order), as platonic-rep's pipeline
does before measuring. N_A(i) is the top-k of row i of A A^T, excluding i itself (ties broken
arbitrarily). similarity-repository identifiers in brackets:
- mutual kNN (`mutual_knn-topk={topk}`; METRICS.md): `mean_i |N_A(i) ∩ N_B(i)| / k`.
- cycle kNN (`cycle_knn-topk={topk}`): the fraction of samples i that are among the A-neighbours
  of one of their B-neighbours, `mean_i [i ∈ ∪_{j ∈ N_B(i)} N_A(j)]`.
- CKNNA (`cknna-topk={topk}`, Huh et al. 2024 eq. 4, their `cknna` with unbiased=True): with
  K = A A^T, L = B B^T and the mask M_ij = [j ∈ N_A(i) and j ∈ N_B(i)], the CKA of the masked
  kernels `HSIC_u(M∘K, M∘L) / sqrt(HSIC_u(M_K∘K, M_K∘K) HSIC_u(M_L∘L, M_L∘L))` (M_K: A's kNN mask
  alone), with Song et al.'s unbiased HSIC. platonic-rep adds 1e-6 to the denominator; actstore
  does not (NaN where it is not positive).
Invariant to orthogonal maps and isotropic scaling (cosine neighbourhoods), not to translation.
Memory O(n^2).
"""

from __future__ import annotations

import numpy as np

from .cka import hsic_unbiased_gram, normalised
from .inputs import paired, require_hsic_samples


def unit_rows(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms == 0, 1.0, norms)


def _neighbours(kernel: np.ndarray, k: int) -> np.ndarray:
    """n x k indices of each row's k largest entries of `kernel`, the row itself excluded."""
    similarity = kernel.copy()
    np.fill_diagonal(similarity, -np.inf)
    return np.argpartition(-similarity, k - 1, axis=1)[:, :k]


def _mask(neighbours: np.ndarray, n: int) -> np.ndarray:
    mask = np.zeros((n, n), dtype=bool)
    np.put_along_axis(mask, neighbours, True, axis=1)
    return mask


def _checked(x: np.ndarray, y: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = paired(x, y)
    if not 1 <= k < len(xs):
        raise ValueError(f"k must satisfy 1 <= k < n = {len(xs)}, got k={k}")
    return unit_rows(xs), unit_rows(ys)


def mutual_knn(x: np.ndarray, y: np.ndarray, k: int) -> float:
    """Mutual kNN alignment: `mean_i |N_A(i) ∩ N_B(i)| / k` (module docstring)."""
    a, b = _checked(x, y, k)
    n = len(a)
    shared = _mask(_neighbours(a @ a.T, k), n) & _mask(_neighbours(b @ b.T, k), n)
    return float(shared.sum(axis=1).mean() / k)


def cycle_knn(x: np.ndarray, y: np.ndarray, k: int) -> float:
    """Cycle kNN: the fraction of samples reached back through B's then A's neighbours."""
    a, b = _checked(x, y, k)
    knn_a, knn_b = _neighbours(a @ a.T, k), _neighbours(b @ b.T, k)
    returned = knn_a[knn_b]  # (n, k, k): the A-neighbours of each B-neighbour of i
    return float((returned == np.arange(len(a))[:, None, None]).any(axis=(1, 2)).mean())


def cknna(x: np.ndarray, y: np.ndarray, k: int) -> float:
    """CKNNA (Huh et al. 2024): CKA of the kernels restricted to mutual k-nearest neighbours."""
    a, b = _checked(x, y, k)
    n = len(a)
    require_hsic_samples(n)
    kernel_a, kernel_b = a @ a.T, b @ b.T
    mask_a, mask_b = _mask(_neighbours(kernel_a, k), n), _mask(_neighbours(kernel_b, k), n)
    both = mask_a & mask_b
    return float(normalised(hsic_unbiased_gram(both * kernel_a, both * kernel_b),
                            hsic_unbiased_gram(mask_a * kernel_a, mask_a * kernel_a),
                            hsic_unbiased_gram(mask_b * kernel_b, mask_b * kernel_b)))
