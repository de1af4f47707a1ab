"""Linear CKA, biased and debiased, and the unbiased HSIC estimator behind the debiased one.

- Biased linear CKA (Kornblith et al. 2019, "Similarity of Neural Network Representations
  Revisited"; eq. 3 of "Tracing Representation Progression", Jiang et al. 2024):
  `CKA = ||Yc^T Xc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F)`, in feature space (d x d products) when
  n > d and in Gram space (n x n) otherwise.
- Unbiased HSIC (Song et al. 2007, "Supervised feature selection via dependence estimation"),
  n >= 4, K = X X^T, L = Y Y^T and K~, L~ the same with a zero diagonal:
  `HSIC_u = [tr(K~ L~) + (1^T K~ 1)(1^T L~ 1)/((n-1)(n-2)) - 2/(n-2) 1^T K~ L~ 1] / (n(n-3))`,
  and its feature-space form with r_i = ||xc_i||^2, s = sum_i r_i:
  `n(n-3) HSIC_u = ||Xc^T Yc||_F^2 - n/(n-2) r_x^T r_y + s_x s_y / ((n-1)(n-2))`.
- Debiased linear CKA: `HSIC_u(K, L) / sqrt(HSIC_u(K, K) HSIC_u(L, L))`, as used in
  "Understanding the Inner Workings of Language Models Through Representation Dissimilarity"
  (Brown et al. 2023). It can be negative; a non-positive denominator gives NaN.

The formula helpers (`normalised`, `cka_matrix`, `hsic_u_from_moments`, `hsic_u_from_grams`,
`debiased_cka_terms`) broadcast, and also serve the minibatch and streaming CKA modules.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from .._numerics import as_float64_matrix, column_centered
from .inputs import paired, require_hsic_samples


def _squared_frobenius(matrix: np.ndarray) -> float:
    return float(np.vdot(matrix, matrix))


def normalised(
    cross: float | np.ndarray, self_a: float | np.ndarray, self_b: float | np.ndarray
) -> np.ndarray:
    """`cross / sqrt(self_a * self_b)`, NaN where the product is not positive (broadcasts).

    The normalisation of every CKA variant (Kornblith et al. 2019): a non-positive denominator
    (e.g. a constant representation) gives NaN instead of a crash or a warning.
    """
    denominator = np.asarray(self_a, dtype=np.float64) * np.asarray(self_b, dtype=np.float64)
    defined = denominator > 0
    ratio = np.asarray(cross, dtype=np.float64) / np.sqrt(np.where(defined, denominator, 1.0))
    return np.where(defined, ratio, np.nan)


def cka_matrix(pairwise: np.ndarray) -> np.ndarray:
    """CKA of every block pair from a B x B matrix of (biased or unbiased) HSIC values.

    `CKA[b, b'] = M[b, b'] / sqrt(M[b, b] M[b', b'])` (Kornblith et al. 2019), NaN where undefined.
    """
    diagonal = np.diag(pairwise)
    cka = normalised(pairwise, diagonal[:, None], diagonal[None, :])
    # Blockwise sums run in a different order for (b, b') and (b', b), and sqrt(d)^2 != d in
    # floating point: restore the exact symmetry and unit diagonal the definition guarantees.
    cka = (cka + cka.T) / 2
    cka[np.diag_indices_from(cka)] = np.where(diagonal > 0, 1.0, np.nan)
    return cka


def hsic_u_from_moments(
    cross_sq: float | np.ndarray,
    norm_dot: float | np.ndarray,
    norm_sum_a: float | np.ndarray,
    norm_sum_b: float | np.ndarray,
    n: int,
) -> float | np.ndarray:
    """Unbiased HSIC from centred feature-space moments (METRICS.md, Song et al. 2007).

    `n(n-3) HSIC_u = ||Xc^T Yc||_F^2 - n/(n-2) r_x^T r_y + s_x s_y / ((n-1)(n-2))` with
    `r_i = ||xc_i||^2` and `s = sum_i r_i`; arguments broadcast, so this serves scalars and
    B x B matrices alike.
    """
    scaled = cross_sq - n / (n - 2) * norm_dot + norm_sum_a * norm_sum_b / ((n - 1) * (n - 2))
    return scaled / (n * (n - 3))


def hsic_u_from_grams(
    trace_kl: float | np.ndarray,
    total_k: float | np.ndarray,
    total_l: float | np.ndarray,
    row_sum_dot: float | np.ndarray,
    n: int,
) -> float | np.ndarray:
    """Unbiased HSIC from zero-diagonal Gram statistics (Song et al. 2007, as in METRICS.md).

    `HSIC_u = [tr(K~ L~) + (1^T K~ 1)(1^T L~ 1)/((n-1)(n-2)) - 2/(n-2) 1^T K~ L~ 1] / (n(n-3))`;
    arguments broadcast.
    """
    scaled = trace_kl + total_k * total_l / ((n - 1) * (n - 2)) - 2 / (n - 2) * row_sum_dot
    return scaled / (n * (n - 3))


def _centred_hsic_u(xc: np.ndarray, yc: np.ndarray) -> float:
    """Feature-space unbiased HSIC of two column-centred matrices (no n x n matrix)."""
    norms_x = np.einsum("ij,ij->i", xc, xc)
    norms_y = np.einsum("ij,ij->i", yc, yc)
    return hsic_u_from_moments(
        _squared_frobenius(xc.T @ yc), norms_x @ norms_y, norms_x.sum(), norms_y.sum(), len(xc)
    )


def debiased_cka_terms(xc: np.ndarray, yc: np.ndarray) -> tuple[float, float, float]:
    """`(HSIC_u(K, L), HSIC_u(K, K), HSIC_u(L, L))` of two column-centred matrices."""
    return _centred_hsic_u(xc, yc), _centred_hsic_u(xc, xc), _centred_hsic_u(yc, yc)


def linear_cka(
    x: np.ndarray, y: np.ndarray, space: Literal["auto", "feature", "gram"] = "auto"
) -> float:
    """Biased linear CKA (Kornblith et al. 2019; eq. 3 of "Tracing Representation Progression").

    `CKA = ||Yc^T Xc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F)`, equivalently `<K, L>_F / (||K||_F
    ||L||_F)` with the centred Grams `K = Xc Xc^T`, `L = Yc Yc^T`. `space="feature"` forms d x d
    products, `"gram"` n x n ones, `"auto"` the feature space when n > max(dx, dy) (METRICS.md).
    NaN when either side is constant.
    """
    xs, ys = paired(x, y)
    if space not in ("auto", "feature", "gram"):
        raise ValueError(f"space must be 'auto', 'feature' or 'gram', got {space!r}")
    xc, yc = column_centered(xs), column_centered(ys)
    if space == "feature" or (space == "auto" and len(xc) > max(xc.shape[1], yc.shape[1])):
        return float(
            normalised(
                _squared_frobenius(yc.T @ xc),
                _squared_frobenius(xc.T @ xc),
                _squared_frobenius(yc.T @ yc),
            )
        )
    gram_x, gram_y = xc @ xc.T, yc @ yc.T
    return float(
        normalised(np.vdot(gram_x, gram_y), np.vdot(gram_x, gram_x), np.vdot(gram_y, gram_y))
    )


def hsic_unbiased(x: np.ndarray, y: np.ndarray) -> float:
    """Unbiased HSIC of K = X X^T and L = Y Y^T in feature space (Song et al. 2007; METRICS.md).

    `n(n-3) HSIC_u = ||Xc^T Yc||_F^2 - n/(n-2) r_x^T r_y + s_x s_y / ((n-1)(n-2))`, with
    `r_i = ||xc_i||^2` and `s = sum_i r_i`. Needs n >= 4; forms no n x n matrix.
    """
    xs, ys = paired(x, y)
    require_hsic_samples(len(xs))
    return float(_centred_hsic_u(column_centered(xs), column_centered(ys)))


def hsic_unbiased_gram(gram_k: np.ndarray, gram_l: np.ndarray) -> float:
    """Unbiased HSIC from two n x n Gram matrices (Song et al. 2007, as in METRICS.md).

    With K~, L~ the Grams with a zero diagonal:
    `HSIC_u = [tr(K~ L~) + (1^T K~ 1)(1^T L~ 1)/((n-1)(n-2)) - 2/(n-2) 1^T K~ L~ 1] / (n(n-3))`.
    Invariant to centring the Grams. Needs n >= 4.
    """
    k_tilde, l_tilde = as_float64_matrix(gram_k, "K").copy(), as_float64_matrix(gram_l, "L").copy()
    if k_tilde.shape != l_tilde.shape or k_tilde.shape[0] != k_tilde.shape[1]:
        raise ValueError(
            f"K and L must be square and of equal shape, got {k_tilde.shape} and {l_tilde.shape}"
        )
    n = len(k_tilde)
    require_hsic_samples(n)
    np.fill_diagonal(k_tilde, 0.0)
    np.fill_diagonal(l_tilde, 0.0)
    return float(
        hsic_u_from_grams(
            np.vdot(k_tilde, l_tilde.T),
            k_tilde.sum(),
            l_tilde.sum(),
            k_tilde.sum(axis=0) @ l_tilde.sum(axis=1),
            n,
        )
    )


def linear_cka_debiased(x: np.ndarray, y: np.ndarray) -> float:
    """Debiased linear CKA: `HSIC_u(K, L) / sqrt(HSIC_u(K, K) HSIC_u(L, L))` (METRICS.md).

    The CKA with the unbiased HSIC_1 estimator of Song et al. 2007, as used in "Understanding the
    Inner Workings of Language Models Through Representation Dissimilarity". It can be negative;
    a non-positive denominator gives NaN. Needs n >= 4.
    """
    xs, ys = paired(x, y)
    require_hsic_samples(len(xs))
    return float(normalised(*debiased_cka_terms(column_centered(xs), column_centered(ys))))
