"""Similarity between two representations of the same samples.

Implements METRICS.md, section "Similarity between two representations": linear CKA (biased and
debiased), unbiased HSIC, minibatch CKA, the streaming exact CKA of many blocks at once, sample-wise
cosine similarity and mutual kNN alignment. A "block" is one layer of one run: a matrix with one
row per sample. Every product is formed from float64, centred data.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from ._numerics import (
    SymmetricSum,
    array_ops,
    as_float64_matrix,
    column_centered,
    squared_cross_norms,
)

DEFINITION_VERSION = 1
QUANTILE_LEVELS = (0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0)
MIN_HSIC_SAMPLES = 4

_FLOAT64_BYTES = 8


# --------------------------------------------------------------------------------------------------
# Sample identity


def check_same_samples(ids_a: Sequence | np.ndarray, ids_b: Sequence | np.ndarray) -> None:
    """Raise ValueError unless both id sequences are identical and in the same order.

    METRICS.md: the sample ids of both sides must be identical and in the same order, otherwise
    the query fails naming the first mismatch; it never silently aligns or truncates. Ids are
    compared element-wise as numpy arrays.
    """
    first, second = np.asarray(ids_a), np.asarray(ids_b)
    if first.ndim != 1 or second.ndim != 1:
        raise ValueError(
            f"sample ids must be 1-D sequences, got shapes {first.shape} and {second.shape}"
        )
    common = min(len(first), len(second))
    mismatches = np.flatnonzero(first[:common] != second[:common])
    if mismatches.size:
        position = int(mismatches[0])
        raise ValueError(
            f"sample ids differ at position {position}: {first[position : position + 1].item()!r} "
            f"(first) vs {second[position : position + 1].item()!r} (second); similarity needs "
            "the same samples in the same order and never aligns them"
        )
    if len(first) != len(second):
        raise ValueError(
            f"sample id sequences differ in length: {len(first)} (first) vs {len(second)} "
            f"(second), identical over the first {common} positions; similarity never truncates"
        )


# --------------------------------------------------------------------------------------------------
# Formulas shared by the one-pass functions and the accumulators


def _paired(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both representations as float64 matrices, checked to have the same number of rows (>= 1)."""
    first, second = as_float64_matrix(x, "x"), as_float64_matrix(y, "y")
    if len(first) != len(second):
        raise ValueError(f"x has {len(first)} samples but y has {len(second)}; they must match")
    if len(first) == 0:
        raise ValueError("x and y hold no samples")
    return first, second


def _require_hsic_samples(n: int) -> None:
    if n < MIN_HSIC_SAMPLES:
        raise ValueError(
            f"unbiased HSIC needs n >= {MIN_HSIC_SAMPLES} samples (it divides by n(n-3)), got n={n}"
        )


def _require_equal_widths(width_a: int, width_b: int) -> None:
    if width_a != width_b:
        raise ValueError(
            f"sample-wise cosine needs equal widths, got {width_a} and {width_b}: COS compares "
            "layers of one model or of models of equal width"
        )


def _squared_frobenius(matrix: np.ndarray) -> float:
    return float(np.vdot(matrix, matrix))


def _normalised(
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


def _cka_matrix(pairwise: np.ndarray) -> np.ndarray:
    """CKA of every block pair from a B x B matrix of (biased or unbiased) HSIC values.

    `CKA[b, b'] = M[b, b'] / sqrt(M[b, b] M[b', b'])` (Kornblith et al. 2019), NaN where undefined.
    """
    diagonal = np.diag(pairwise)
    cka = _normalised(pairwise, diagonal[:, None], diagonal[None, :])
    # Blockwise sums run in a different order for (b, b') and (b', b), and sqrt(d)^2 != d in
    # floating point: restore the exact symmetry and unit diagonal the definition guarantees.
    cka = (cka + cka.T) / 2
    cka[np.diag_indices_from(cka)] = np.where(diagonal > 0, 1.0, np.nan)
    return cka


def _hsic_u_from_moments(
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


def _hsic_u_from_grams(
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
    return _hsic_u_from_moments(
        _squared_frobenius(xc.T @ yc), norms_x @ norms_y, norms_x.sum(), norms_y.sum(), len(xc)
    )


def _debiased_cka_terms(xc: np.ndarray, yc: np.ndarray) -> tuple[float, float, float]:
    """`(HSIC_u(K, L), HSIC_u(K, K), HSIC_u(L, L))` of two column-centred matrices."""
    return _centred_hsic_u(xc, yc), _centred_hsic_u(xc, xc), _centred_hsic_u(yc, yc)


# --------------------------------------------------------------------------------------------------
# One-pass functions


def linear_cka(
    x: np.ndarray, y: np.ndarray, space: Literal["auto", "feature", "gram"] = "auto"
) -> float:
    """Biased linear CKA (Kornblith et al. 2019; eq. 3 of "Tracing Representation Progression").

    `CKA = ||Yc^T Xc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F)`, equivalently `<K, L>_F / (||K||_F
    ||L||_F)` with the centred Grams `K = Xc Xc^T`, `L = Yc Yc^T`. `space="feature"` forms d x d
    products, `"gram"` n x n ones, `"auto"` the feature space when n > max(dx, dy) (METRICS.md).
    NaN when either side is constant.
    """
    xs, ys = _paired(x, y)
    if space not in ("auto", "feature", "gram"):
        raise ValueError(f"space must be 'auto', 'feature' or 'gram', got {space!r}")
    xc, yc = column_centered(xs), column_centered(ys)
    if space == "feature" or (space == "auto" and len(xc) > max(xc.shape[1], yc.shape[1])):
        return float(
            _normalised(
                _squared_frobenius(yc.T @ xc),
                _squared_frobenius(xc.T @ xc),
                _squared_frobenius(yc.T @ yc),
            )
        )
    gram_x, gram_y = xc @ xc.T, yc @ yc.T
    return float(
        _normalised(np.vdot(gram_x, gram_y), np.vdot(gram_x, gram_x), np.vdot(gram_y, gram_y))
    )


def hsic_unbiased(x: np.ndarray, y: np.ndarray) -> float:
    """Unbiased HSIC of K = X X^T and L = Y Y^T in feature space (Song et al. 2007; METRICS.md).

    `n(n-3) HSIC_u = ||Xc^T Yc||_F^2 - n/(n-2) r_x^T r_y + s_x s_y / ((n-1)(n-2))`, with
    `r_i = ||xc_i||^2` and `s = sum_i r_i`. Needs n >= 4; forms no n x n matrix.
    """
    xs, ys = _paired(x, y)
    _require_hsic_samples(len(xs))
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
    _require_hsic_samples(n)
    np.fill_diagonal(k_tilde, 0.0)
    np.fill_diagonal(l_tilde, 0.0)
    return float(
        _hsic_u_from_grams(
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
    xs, ys = _paired(x, y)
    _require_hsic_samples(len(xs))
    return float(_normalised(*_debiased_cka_terms(column_centered(xs), column_centered(ys))))


@dataclass(frozen=True)
class MinibatchCKA:
    """Minibatch CKA and how the rows were batched.

    `remainder` says what happened to the short final batch: "none" (n divisible by batch_size),
    "dropped" or "merged" (into the batch before it).
    """

    value: float
    n_batches: int
    batch_size: int
    remainder: Literal["none", "dropped", "merged"]


def minibatch_cka(
    x: np.ndarray,
    y: np.ndarray,
    batch_size: int,
    remainder: Literal["drop", "merge"] = "drop",
) -> MinibatchCKA:
    """Minibatch CKA (Nguyen, Raghu & Kornblith 2021) over consecutive batches of rows.

    `CKA = sum_b HSIC_u(K_b, L_b) / sqrt(sum_b HSIC_u(K_b, K_b) sum_b HSIC_u(L_b, L_b))`, each
    batch centred on its own. A short final batch is dropped or merged into the batch before it.
    With one batch of all n rows it equals `linear_cka_debiased` exactly.
    """
    xs, ys = _paired(x, y)
    if batch_size < MIN_HSIC_SAMPLES:
        raise ValueError(
            f"batch_size must be >= {MIN_HSIC_SAMPLES} (unbiased HSIC), got {batch_size}"
        )
    if remainder not in ("drop", "merge"):
        raise ValueError(f"remainder must be 'drop' or 'merge', got {remainder!r}")
    n_batches, short_rows = divmod(len(xs), batch_size)
    if n_batches == 0:
        raise ValueError(f"{len(xs)} samples do not fill one batch of {batch_size}")
    stops = [batch_size * (b + 1) for b in range(n_batches)]
    if short_rows and remainder == "merge":
        stops[-1] = len(xs)
    totals = np.zeros(3)
    for start, stop in zip([0, *stops[:-1]], stops):
        totals += _debiased_cka_terms(
            column_centered(xs[start:stop]), column_centered(ys[start:stop])
        )
    outcome = "none" if not short_rows else ("dropped" if remainder == "drop" else "merged")
    return MinibatchCKA(float(_normalised(*totals)), n_batches, batch_size, outcome)


class MinibatchCKAAccumulator:
    """Streaming minibatch CKA (Nguyen, Raghu & Kornblith 2021) for block pairs.

    Each `update` is ONE batch (the caller cuts equal batches of >= 4 rows, the last one possibly
    merged with the short remainder). Per pair it sums `HSIC_u(K_b, L_b)`, `HSIC_u(K_b, K_b)` and
    `HSIC_u(L_b, L_b)`; `finalize` gives `sum HSIC_u(K,L) / sqrt(sum HSIC_u(K,K) sum HSIC_u(L,L))`.
    Batches may arrive in any order and partial sums merge by addition.
    """

    def __init__(
        self,
        pairs: Sequence[tuple[int, int]],
        block_widths: Sequence[int],
        device: str | None = None,
    ) -> None:
        self.block_widths = _validated_widths(block_widths)
        self.pairs = tuple((int(i), int(j)) for i, j in pairs)
        self.totals = np.zeros((len(self.pairs), 3))
        self.batches = 0
        self.device = device

    def update(self, blocks: Sequence[np.ndarray]) -> None:
        """Add one batch. The `||Xc^T Yc||_F^2` products run on `device` (None: the host)."""
        matrices = _validated_blocks(blocks, self.block_widths)
        n = len(matrices[0])
        _require_hsic_samples(n)
        centred = {b: column_centered(matrices[b]) for pair in self.pairs for b in pair}
        norms = {b: np.einsum("ij,ij->i", c, c) for b, c in centred.items()}
        needed = sorted({p for i, j in self.pairs for p in ((i, j), (i, i), (j, j))})
        squares = squared_cross_norms(centred, needed, self.device)

        def hsic(i: int, j: int) -> float:
            return _hsic_u_from_moments(
                squares[i, j], norms[i] @ norms[j], norms[i].sum(), norms[j].sum(), n
            )

        for p, (i, j) in enumerate(self.pairs):
            self.totals[p] += (hsic(i, j), hsic(i, i), hsic(j, j))
        self.batches += 1

    def merge(self, other: MinibatchCKAAccumulator) -> MinibatchCKAAccumulator:
        self.totals += other.totals
        self.batches += other.batches
        return self

    def finalize(self) -> np.ndarray:
        """(P,) minibatch CKA per pair (NaN where a self-HSIC sum is not positive)."""
        return np.array([_normalised(*terms) for terms in self.totals], dtype=np.float64)


def _rowwise_cosine(hx: np.ndarray, hy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`<hx_i, hy_i> / (||hx_i|| ||hy_i||)` per row, 0 where a norm is 0; and the zero-norm mask."""
    dots = np.einsum("ij,ij->i", hx, hy)
    norm_products = np.sqrt(np.einsum("ij,ij->i", hx, hx)) * np.sqrt(np.einsum("ij,ij->i", hy, hy))
    zero_norm = norm_products == 0
    cosine = np.where(zero_norm, 0.0, dots / np.where(zero_norm, 1.0, norm_products))
    # Rounding can push |cos| a few ulps past 1.
    return np.clip(cosine, -1.0, 1.0), zero_norm


def samplewise_cosine(
    x: np.ndarray, y: np.ndarray, center: Literal["global-mean", "none"] = "global-mean"
) -> np.ndarray:
    """Sample-wise cosine similarity ("Tracing Representation Progression", sec. 2.1), shape (n,).

    `COS_i(l, l') = <h_i^l, h_i^l'> / (||h_i^l|| ||h_i^l'||)`. `center="global-mean"` (the paper's
    footnote) first subtracts each side's mean over all samples; "none" does not. A zero-norm
    row gives 0. The widths must match.
    """
    xs, ys = _paired(x, y)
    _require_equal_widths(xs.shape[1], ys.shape[1])
    if center == "global-mean":
        xs, ys = column_centered(xs), column_centered(ys)
    elif center != "none":
        raise ValueError(f"center must be 'global-mean' or 'none', got {center!r}")
    return _rowwise_cosine(xs, ys)[0]


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
    xs, ys = _paired(x, y)
    if not 1 <= k < len(xs):
        raise ValueError(f"k must satisfy 1 <= k < n = {len(xs)}, got k={k}")
    shared = _nearest_neighbour_mask(xs, k) & _nearest_neighbour_mask(ys, k)
    return float(shared.sum(axis=1).mean() / k)


# --------------------------------------------------------------------------------------------------
# Streaming CKA of many blocks


def _validated_widths(block_widths: Sequence[int]) -> tuple[int, ...]:
    widths = tuple(int(width) for width in block_widths)
    if not widths or min(widths) < 1:
        raise ValueError(f"block_widths must be a non-empty sequence of widths >= 1, got {widths}")
    return widths


_EXACT_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def _as_exact_matrix(values: np.ndarray, name: str) -> np.ndarray:
    """`values` as a 2-D float16/32/64 matrix, keeping float16 and float32 as they are (the
    caller upcasts before any product); other real dtypes become float64."""
    array = np.asarray(values)
    if array.dtype in _EXACT_FLOATS and array.ndim == 2:
        return array
    return as_float64_matrix(array, name)


def _validated_blocks(
    blocks: Sequence[np.ndarray], widths: tuple[int, ...], upcast: bool = True
) -> list[np.ndarray]:
    """One chunk's blocks as float64 matrices (or, with `upcast=False`, in their own float16/32
    dtype), checked against the widths and for equal rows."""
    if len(blocks) != len(widths):
        raise ValueError(f"expected {len(widths)} blocks, got {len(blocks)}")
    convert = as_float64_matrix if upcast else _as_exact_matrix
    matrices = [convert(block, f"blocks[{b}]") for b, block in enumerate(blocks)]
    shapes = [matrix.shape for matrix in matrices]
    expected = [(shapes[0][0], width) for width in widths]
    if shapes != expected:
        raise ValueError(
            f"block shapes {shapes} do not match the rows of block 0 and the widths {widths}"
        )
    return matrices


def _block_starts(widths: tuple[int, ...]) -> np.ndarray:
    return np.concatenate(([0], np.cumsum(widths)[:-1]))


def _block_sums(matrix: np.ndarray, widths: tuple[int, ...], axis: int) -> np.ndarray:
    """Sums of `matrix` over the column ranges of each block along `axis`."""
    return np.add.reduceat(matrix, _block_starts(widths), axis=axis)


@dataclass
class _FeatureMoments:
    """Float64 moments of the stacked rows `u_i = z_i - shift`, enough for every block pair's CKA.

    With `a_i^(b) = ||u_i^(b)||^2` (squared norm of block b's part of row i): `row_sum` S =
    sum u_i, `cross_products` G = sum u_i u_i^T, `norm_sum` A_b = sum_i a_i^(b),
    `norm_weighted_sum` AU_b = sum_i a_i^(b) u_i and
    `norm_products` AA_bb' = sum_i a_i^(b) a_i^(b').
    Memory O(D^2) with D = sum of the widths, whatever n.

    G is a `SymmetricSum`: `add_rows` adds to it on the host (BLAS syrk) or on `device`, and
    every reader of the full G (`move_shift`, hence `absorb` and `pairwise_statistics`) takes it
    home first (`SymmetricSum.matrix`).
    """

    widths: tuple[int, ...]
    n: int = 0
    shift: np.ndarray = field(init=False)
    row_sum: np.ndarray = field(init=False)
    cross_products: SymmetricSum = field(init=False)
    norm_sum: np.ndarray = field(init=False)
    norm_weighted_sum: np.ndarray = field(init=False)
    norm_products: np.ndarray = field(init=False)
    device: str | None = None

    def __post_init__(self) -> None:
        total, blocks = sum(self.widths), len(self.widths)
        self.shift = np.zeros(total)
        self.row_sum = np.zeros(total)
        self.cross_products = SymmetricSum(total)
        self.norm_sum = np.zeros(blocks)
        self.norm_weighted_sum = np.zeros((blocks, total))
        self.norm_products = np.zeros((blocks, blocks))

    @staticmethod
    def estimate_nbytes(widths: tuple[int, ...]) -> int:
        total, blocks = sum(widths), len(widths)
        return _FLOAT64_BYTES * (2 * total + total**2 + blocks + blocks * total + blocks**2)

    @property
    def nbytes(self) -> int:
        arrays = (
            self.shift,
            self.row_sum,
            self.cross_products,
            self.norm_sum,
            self.norm_weighted_sum,
            self.norm_products,
        )
        return sum(array.nbytes for array in arrays)

    def add_rows(self, rows: np.ndarray) -> None:
        if self.n == 0:
            # Any shift is exact; one near the data keeps the sums centred (METRICS.md numerics).
            self.shift = rows.mean(axis=0)
        shifted = rows - self.shift
        norms = _block_sums(shifted * shifted, self.widths, axis=1)
        self.n += len(shifted)
        self.row_sum += shifted.sum(axis=0)
        self.cross_products.add(shifted, self.device)
        self.norm_sum += norms.sum(axis=0)
        self.norm_weighted_sum += norms.T @ shifted
        self.norm_products += norms.T @ norms

    def move_shift(self, new_shift: np.ndarray) -> None:
        """Re-express the moments relative to `new_shift`, exactly, in place.

        With `δ = new_shift - shift`, `u' = u - δ`, `p_i^(b) = u_i^(b)·δ^(b)` and
        `e_b = ||δ^(b)||^2`: `a' = a - 2p + e`, so
        `S' = S - nδ`, `G' = G - Sδ^T - δS^T + nδδ^T`,
        `A' = A - 2P + n e` (P = sum p), `AU' = AU - 2 sum_i p_i u_i^T + e S^T - A' δ^T`,
        `AA' = AA - 2(AP + AP^T) + 4 PP + (A - 2P) e^T + e (A - 2P)^T + n e e^T`
        with `AP_bb' = sum a^(b) p^(b')` and `PP_bb' = sum p^(b) p^(b')`.
        """
        gram = self.cross_products.matrix()
        delta = new_shift - self.shift
        block_of_column = np.repeat(np.arange(len(self.widths)), self.widths)
        # Column b of delta_blocks holds δ^(b) in block b's rows and zeros elsewhere, so that
        # u_i @ delta_blocks = p_i for all blocks at once.
        delta_blocks = np.zeros((len(delta), len(self.widths)))
        delta_blocks[np.arange(len(delta)), block_of_column] = delta
        projection_weighted_sum = (gram @ delta_blocks).T
        projection_sum = self.row_sum @ delta_blocks
        projection_products = delta_blocks.T @ projection_weighted_sum.T
        norm_projection_products = self.norm_weighted_sum @ delta_blocks
        delta_norms = _block_sums(delta * delta, self.widths, axis=0)

        partial_norm_sum = self.norm_sum - 2 * projection_sum
        new_norm_sum = partial_norm_sum + self.n * delta_norms
        self.norm_products += (
            -2 * (norm_projection_products + norm_projection_products.T)
            + 4 * projection_products
            + np.outer(partial_norm_sum, delta_norms)
            + np.outer(delta_norms, partial_norm_sum)
            + self.n * np.outer(delta_norms, delta_norms)
        )
        self.norm_weighted_sum += (
            -2 * projection_weighted_sum
            + np.outer(delta_norms, self.row_sum)
            - np.outer(new_norm_sum, delta)
        )
        self.norm_sum = new_norm_sum
        # G - Sδ^T - δS^T + nδδ^T = G + wδ^T + δw^T with w = nδ/2 - S: two rank-1 updates in
        # place, so the only D x D temporary is one outer product.
        half_correction = self.n / 2 * delta - self.row_sum
        gram += np.outer(half_correction, delta)
        gram += np.outer(delta, half_correction)
        self.row_sum -= self.n * delta
        self.shift = self.shift + delta

    def absorb(self, other: _FeatureMoments) -> None:
        """Add another accumulator's rows: move this one to the other's shift, then add moments.
        `other` is only read (it may be a read-only buffer from Ray's object store)."""
        self.move_shift(other.shift)
        self.n += other.n
        self.row_sum += other.row_sum
        self.cross_products.merge(other.cross_products)
        self.norm_sum += other.norm_sum
        self.norm_weighted_sum += other.norm_weighted_sum
        self.norm_products += other.norm_products

    def pairwise_statistics(self, with_hsic: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """`(||Xc_b^T Xc_b'||_F^2, HSIC_u(K_b, K_b') or None)` for all block pairs (B x B each).

        Works on a copy moved to the exact mean, so the blocks of G are `Xc_b^T Xc_b'`, `A` holds
        `s_b` and `AA` holds `r_b^T r_b'` (METRICS.md feature-space form).
        """
        centred = copy.deepcopy(self)
        centred.move_shift(self.shift + self.row_sum / self.n)
        squares = centred.cross_products.matrix()
        squares *= squares
        cross_sq = _block_sums(_block_sums(squares, self.widths, axis=0), self.widths, axis=1)
        if not with_hsic:
            return cross_sq, None
        hsic = _hsic_u_from_moments(
            cross_sq,
            centred.norm_products,
            centred.norm_sum[:, None],
            centred.norm_sum[None, :],
            self.n,
        )
        return cross_sq, hsic


GRAM_STRIP_BYTES = 128 << 20
"""Default memory for one strip of the Grams in a gram-mode `finalize` (see `_StoredRows`)."""


def _gram_strip_rows(n: int, blocks: int, strip_bytes: int) -> int:
    """Rows of the n x n Grams computed at once in gram mode: as many as `strip_bytes` holds for
    all B blocks (at least 1, at most n)."""
    return int(min(max(n, 1), max(1, strip_bytes // (_FLOAT64_BYTES * blocks * max(n, 1)))))


def gram_strips(n: int, blocks: int, strip_bytes: int = GRAM_STRIP_BYTES) -> list[tuple[int, int]]:
    """The row strips [first, last) that a gram-mode finalize walks."""
    height = _gram_strip_rows(n, blocks, strip_bytes)
    return [(first, min(first + height, n)) for first in range(0, n, height)]


def gram_strip_products(
    rows: np.ndarray,
    means: np.ndarray,
    widths: Sequence[int],
    strips: Sequence[tuple[int, int]],
    device: str | None = None,
) -> np.ndarray:
    """`sum over strips of 2 <K_b[r, first:], K_b'[r, first:]>_F - <K_b[r, r], K_b'[r, r]>_F`
    (B x B) for the centred Grams `K_b = Xc_b Xc_b^T`, r = rows [first, last) of a strip.

    Over strips that tile 0..n this is `<K_b, K_b'>_F` (each Gram is symmetric: a strip holds
    its diagonal square once and the part right of it, which stands for its mirror too). `rows`
    is (n, D) in any float dtype; each block's rows from `first` on are upcast to float64 and
    centred with `means` (float64, D) before any product. Memory: one strip of the B Grams plus
    one block's rows. Pure, so strips can be dealt to parallel tasks and the results added.
    With a torch `device` the rows go there once, as stored, and every product runs there.
    """
    widths = _validated_widths(widths)
    n, blocks = len(rows), len(widths)
    total = np.zeros((blocks, blocks))
    if not strips:
        return total
    ops = array_ops(device)
    rows, means = ops.upload(rows), ops.upload(np.asarray(means, dtype=np.float64))
    height = max(last - first for first, last in strips)
    buffer = ops.empty(blocks * height * n)
    for first, last in strips:
        strip, cols = last - first, n - first
        grams = buffer[: blocks * strip * cols].reshape(blocks, strip, cols)
        for block, (start, width) in enumerate(zip(_block_starts(widths), widths)):
            tail = ops.float64_copy(rows[first:, start : start + width])
            tail -= means[start : start + width]
            ops.matmul(tail[:strip], tail.T, out=grams[block])
        flat = grams.reshape(blocks, strip * cols)
        square = grams[:, :, :strip].reshape(blocks, strip * strip)
        total += ops.download(2.0 * (flat @ flat.T) - square @ square.T)
    return total


@dataclass
class _StoredRows:
    """All rows kept as they came (float16/32 stay, others are float64): the Gram-space state.

    `finalize` never holds the B n x n Grams: `gram_strip_products` walks their upper triangle in
    strips of rows (`strip_bytes` for all B blocks at once) and adds up the pairwise Frobenius
    products of each strip, centring (in float64) the rows each strip needs as it goes; a caller
    may deal the strips to parallel tasks (`strip_map`). Peak: the rows twice (kept +
    concatenated) plus a strip and one block's float64 rows per running strip task.
    """

    widths: tuple[int, ...]
    chunks: list[np.ndarray] = field(default_factory=list)
    strip_bytes: int = GRAM_STRIP_BYTES
    device: str | None = None

    @staticmethod
    def estimate_nbytes(widths: tuple[int, ...], n: int, itemsize: int = _FLOAT64_BYTES) -> int:
        return itemsize * n * sum(widths)

    @staticmethod
    def estimate_task_nbytes(widths: tuple[int, ...], n: int, strip_bytes: int) -> int:
        """What one strip computation allocates: the strip of the B Grams, its diagonal square,
        one block's rows in float64 (and its upcast), a B x B result."""
        blocks = len(widths)
        height = _gram_strip_rows(n, blocks, strip_bytes)
        return _FLOAT64_BYTES * (
            blocks * height * n + blocks * height * height + 2 * n * max(widths) + 4 * blocks**2
        )

    @staticmethod
    def estimate_finalize_nbytes(
        widths: tuple[int, ...], n: int, strip_bytes: int, itemsize: int = _FLOAT64_BYTES,
        strip_tasks: int = 0,
    ) -> int:
        """Bytes `pairwise_statistics` allocates on top of the held rows: their concatenation,
        the HSIC vectors (O(B n)) and one block's centred rows, plus one strip computation in
        process (`strip_tasks=0`), or `strip_tasks` concurrent ones elsewhere reading one more
        copy of the rows (Ray's object store)."""
        rows = itemsize * n * sum(widths)
        own = rows + _FLOAT64_BYTES * (4 * len(widths) * n + 2 * n * max(widths))
        task = _StoredRows.estimate_task_nbytes(widths, n, strip_bytes)
        return own + (task if strip_tasks == 0 else rows + strip_tasks * task)

    @property
    def n(self) -> int:
        return sum(len(chunk) for chunk in self.chunks)

    @property
    def nbytes(self) -> int:
        return sum(chunk.nbytes for chunk in self.chunks)

    def add_rows(self, rows: np.ndarray) -> None:
        self.chunks.append(rows)

    def absorb(self, other: _StoredRows) -> None:
        # Chunks are never modified in place, so sharing them with `other` is safe.
        self.chunks.extend(other.chunks)

    def pairwise_statistics(
        self, with_hsic: bool, strip_map=None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """`(<K_b, K_b'>_F, HSIC_u(K_b, K_b') or None)` from the centred Grams K_b = Xc_b Xc_b^T.

        `<K_b, K_b'>` from `gram_strip_products` over all strips, in process or through
        `strip_map(rows, means, widths, strips) -> list of partial B x B sums`. The unbiased HSIC
        uses the Gram form of Song et al. 2007 on the zero-diagonal Grams K~ = K - diag(K),
        whose terms follow without forming K~: `<K~, L~> = <K, L> - diag(K)^T diag(L)` and
        `K~ 1 = Xc (Xc^T 1) - diag(K)`.
        """
        rows = np.concatenate(self.chunks)
        n, blocks = len(rows), len(self.widths)
        means = rows.mean(axis=0, dtype=np.float64)
        strips = gram_strips(n, blocks, self.strip_bytes)
        if strip_map is None:
            cross_sq = gram_strip_products(rows, means, self.widths, strips, self.device)
        else:
            cross_sq = np.sum(strip_map(rows, means, self.widths, strips), axis=0)
        if not with_hsic:
            return cross_sq, None
        diagonals, row_sums, totals = np.empty((blocks, n)), np.empty((blocks, n)), np.empty(blocks)
        for block, (start, width) in enumerate(zip(_block_starts(self.widths), self.widths)):
            part = rows[:, start : start + width].astype(np.float64)
            part -= means[start : start + width]
            diagonals[block] = np.einsum("ij,ij->i", part, part)  # K_b[i, i]
            column_sum = part.sum(axis=0)
            row_sums[block] = part @ column_sum - diagonals[block]
            totals[block] = column_sum @ column_sum - diagonals[block].sum()
        hsic = _hsic_u_from_grams(
            cross_sq - diagonals @ diagonals.T,
            totals[:, None],
            totals[None, :],
            row_sums @ row_sums.T,
            n,
        )
        return cross_sq, hsic


def cka_mode_costs(block_widths: Sequence[int], n: int) -> dict[str, float]:
    """Multiply-adds of the streaming CKA of B blocks (total width D) over n rows, per mode.

    feature: one syrk of every chunk into the D x D moments, `n D^2 / 2` (plus O(n B D)).
    gram: the upper triangle of one n x n Gram per block, `n^2 D / 2`, plus the pairwise
    Frobenius products of the B Grams, `n^2 B^2 / 2`.
    """
    widths = _validated_widths(block_widths)
    total, blocks = sum(widths), len(widths)
    return {
        "feature": n * total * total / 2 + n * blocks * total,
        "gram": n * n * total / 2 + n * n * blocks * blocks / 2,
    }


def choose_cka_mode(
    block_widths: Sequence[int],
    n: int,
    memory_limit: int,
    strip_bytes: int = GRAM_STRIP_BYTES,
    itemsize: int = _FLOAT64_BYTES,
    strip_tasks: int = 0,
) -> Literal["feature", "gram"]:
    """The cheaper mode (`cka_mode_costs`) for the streaming CKA of these blocks over n rows,
    gram only if its whole peak, finalize included (`estimate_peak_nbytes` with the rows'
    `itemsize` and `strip_tasks`), fits `memory_limit`. Feature mode is the fallback: its state
    does not grow with n, and a caller tiles the blocks when even that exceeds the limit."""
    costs = cka_mode_costs(block_widths, n)
    if costs["gram"] < costs["feature"]:
        peak = SimilarityAccumulator.estimate_peak_nbytes(
            block_widths, "gram", n, strip_bytes, itemsize=itemsize, strip_tasks=strip_tasks
        )
        if peak <= memory_limit:
            return "gram"
    return "feature"


@dataclass(frozen=True)
class CKAMatrices:
    """Biased and debiased linear CKA of every block pair over `n` samples.

    Both B x B float64 and symmetric with a unit diagonal; `debiased` is NaN where its
    denominator is not positive (e.g. a constant block) or n < 4, and it can be negative.
    """

    biased: np.ndarray
    debiased: np.ndarray
    n: int


class SimilarityAccumulator:
    """Streaming exact linear CKA (biased and debiased) of every pair of B blocks (METRICS.md).

    Feed row chunks with `update`, combine partial accumulators with `merge` (any chunk order, any
    merge tree), then `finalize`. The result equals the one-pass value to 1e-9.

    `mode="feature"` keeps the moments of the stacked rows `z_i = concat_b(block_b[i])` relative
    to a shift (the first chunk's column mean), in float64, O(D^2) memory with D = sum of widths,
    never O(n); `finalize` moves them exactly to the global mean and applies the centred
    feature-space formulas. `mode="gram"` keeps the rows (O(n D), float16/float32 chunks as they
    come, since they upcast exactly) and finalizes with the n x n Gram of every block, computed
    in strips of rows (`gram_strip_bytes` for all B blocks at once), never all B Grams at once:
    the cheaper choice when n is small against D (`choose_cka_mode`).

    Memory: `nbytes` / `estimate_nbytes` count the state held between calls. On top of it,
    feature mode transiently needs up to 2 D^2 float64 during `finalize` (one during `merge`);
    gram mode needs the concatenated rows and one strip (per strip task) during `finalize`.
    `estimate_peak_nbytes` counts both.
    """

    def __init__(
        self,
        block_widths: Sequence[int],
        mode: Literal["feature", "gram"] = "feature",
        gram_strip_bytes: int = GRAM_STRIP_BYTES,
        device: str | None = None,
    ) -> None:
        self.block_widths = _validated_widths(block_widths)
        if mode not in ("feature", "gram"):
            raise ValueError(f"mode must be 'feature' or 'gram', got {mode!r}")
        self.mode = mode
        if mode == "feature":
            self._state = _FeatureMoments(self.block_widths, device=device)
        else:
            self._state = _StoredRows(
                self.block_widths, strip_bytes=int(gram_strip_bytes), device=device
            )

    @staticmethod
    def estimate_nbytes(
        block_widths: Sequence[int],
        mode: Literal["feature", "gram"],
        n: int,
        itemsize: int = _FLOAT64_BYTES,
    ) -> int:
        """Bytes the accumulator will hold after `n` rows (feature mode: independent of n; gram
        mode: the rows, fed as `itemsize`-byte floats)."""
        widths = _validated_widths(block_widths)
        if mode == "feature":
            return _FeatureMoments.estimate_nbytes(widths)
        if mode == "gram":
            return _StoredRows.estimate_nbytes(widths, n, itemsize)
        raise ValueError(f"mode must be 'feature' or 'gram', got {mode!r}")

    @staticmethod
    def estimate_peak_nbytes(
        block_widths: Sequence[int],
        mode: Literal["feature", "gram"],
        n: int,
        gram_strip_bytes: int = GRAM_STRIP_BYTES,
        itemsize: int = _FLOAT64_BYTES,
        strip_tasks: int = 0,
    ) -> int:
        """Bytes held at the peak of `finalize` after `n` rows: the state plus what `finalize`
        allocates (feature: 2 D^2 float64; gram: the concatenated rows, the HSIC vectors and the
        Gram strips, `_StoredRows.estimate_finalize_nbytes`; `strip_tasks` > 0 when they run in
        that many parallel tasks through `finalize(strip_map=...)`)."""
        widths = _validated_widths(block_widths)
        held = SimilarityAccumulator.estimate_nbytes(widths, mode, n, itemsize)
        if mode == "feature":
            return held + 2 * _FLOAT64_BYTES * sum(widths) ** 2
        return held + _StoredRows.estimate_finalize_nbytes(
            widths, n, int(gram_strip_bytes), itemsize, strip_tasks
        )

    @property
    def device(self) -> str | None:
        """Where the O(n D^2) (feature) or O(n^2 D) (gram) products run: None for numpy on the
        host, else a torch device name ("cuda", or "cpu" for the same code path on the host).
        Set it in the task that feeds the chunks; merged and pickled states are always host
        arrays, and both paths agree to rounding."""
        return self._state.device

    @device.setter
    def device(self, device: str | None) -> None:
        self._state.device = device

    @property
    def nbytes(self) -> int:
        """Bytes of the state currently held."""
        return self._state.nbytes

    @property
    def n(self) -> int:
        """Rows seen so far."""
        return self._state.n

    def update(self, blocks: Sequence[np.ndarray]) -> None:
        """Add one chunk: `blocks[b]` has shape (rows, block_widths[b]), rows = the same samples."""
        # Gram mode keeps float16/float32 rows as they are (exact; upcast before any product).
        matrices = _validated_blocks(blocks, self.block_widths, upcast=self.mode == "feature")
        if len(matrices[0]):
            self._state.add_rows(np.concatenate(matrices, axis=1))

    def merge(self, other: SimilarityAccumulator) -> SimilarityAccumulator:
        """Add `other`'s rows to this accumulator in place (`other` is unchanged); return self."""
        if other.block_widths != self.block_widths or other.mode != self.mode:
            raise ValueError(
                f"cannot merge a {other.mode} accumulator of widths {other.block_widths} into a "
                f"{self.mode} accumulator of widths {self.block_widths}"
            )
        self._state.absorb(other._state)
        return self

    def finalize(self, strip_map=None) -> CKAMatrices:
        """Biased and debiased CKA matrices over all rows seen; the state is left unchanged.

        Gram mode only: `strip_map(rows, means, widths, strips)` may compute the Gram strips
        elsewhere (e.g. in parallel tasks), returning a list of `gram_strip_products` results
        over groups of the strips that together cover each strip once."""
        n = self._state.n
        if n == 0:
            raise ValueError("no rows were added; CKA needs at least one sample")
        with_hsic = n >= MIN_HSIC_SAMPLES
        if self.mode == "gram":
            cross_sq, hsic = self._state.pairwise_statistics(with_hsic, strip_map)
        else:
            cross_sq, hsic = self._state.pairwise_statistics(with_hsic)
        blocks = len(self.block_widths)
        debiased = np.full((blocks, blocks), np.nan) if hsic is None else _cka_matrix(hsic)
        return CKAMatrices(biased=_cka_matrix(cross_sq), debiased=debiased, n=n)


# --------------------------------------------------------------------------------------------------
# Streaming sample-wise cosine


@dataclass(frozen=True)
class CosineStats:
    """Sample-wise cosine per block pair: `mean` (P,), `quantiles` (P, len(QUANTILE_LEVELS)).

    `zero_norm` (P,) counts the samples where either side had norm 0 (their cosine counts as 0).
    """

    mean: np.ndarray
    quantiles: np.ndarray
    n: int
    zero_norm: np.ndarray


def histogram_quantiles(
    counts: np.ndarray, lowest: np.ndarray, highest: np.ndarray, n: int, bins: int,
    low: float = -1.0, high: float = 1.0,
) -> np.ndarray:
    """Quantiles at QUANTILE_LEVELS from per-pair histograms over [low, high], shape (P, levels).

    Follows np.quantile's linear rule: the value at position `q (n-1)` of the sorted sample,
    interpolated between the two ranks around it. A rank's value is placed inside its bin,
    the bin's c elements spread evenly (the j-th at the centre of the j-th of c equal slots), so
    it is within one bin width (high-low)/bins of the exact value; ranks 0 and n-1 are the exact
    min and max.
    """
    positions = np.asarray(QUANTILE_LEVELS) * (n - 1)
    ranks = np.stack([np.floor(positions), np.ceil(positions)]).astype(np.int64)  # (2, levels)
    cumulative = np.cumsum(counts, axis=1)
    bin_of_rank = np.stack(
        [np.searchsorted(pair_cumulative, ranks, side="right") for pair_cumulative in cumulative]
    )  # (P, 2, levels): the first bin whose inclusive cumulative count exceeds the rank
    flat_bins = bin_of_rank.reshape(len(counts), -1)
    in_bin = np.take_along_axis(counts, flat_bins, axis=1).reshape(bin_of_rank.shape)
    through_bin = np.take_along_axis(cumulative, flat_bins, axis=1).reshape(bin_of_rank.shape)
    before_bin = through_bin - in_bin
    values = low + ((high - low) / bins) * (bin_of_rank + (ranks - before_bin + 0.5) / in_bin)
    lowest, highest = lowest[:, None, None], highest[:, None, None]
    values = np.clip(values, lowest, highest)
    values = np.where(ranks == 0, lowest, np.where(ranks == n - 1, highest, values))
    fraction = positions - ranks[0]
    return values[:, 0] + fraction * (values[:, 1] - values[:, 0])


class CosineAccumulator:
    """Streaming sample-wise cosine ("Tracing Representation Progression", sec. 2.1) per block pair.

    `COS_i(l, l') = <h_i^l, h_i^l'> / (||h_i^l|| ||h_i^l'||)` for each pair (i, j) of blocks of
    equal width. `centers[b]` is block b's global mean, subtracted first ("global-mean"
    centering, METRICS.md's default, which the caller computes beforehand) or None ("none");
    `centers=None` means no centering for any block. Memory is independent of n: a histogram of
    `bins` bins over [-1, 1] per pair plus exact sum, min and max, so the quantiles are within
    2/bins of np.quantile's and the min and max are exact.
    """

    def __init__(
        self,
        pairs: Sequence[tuple[int, int]],
        block_widths: Sequence[int],
        centers: Sequence[np.ndarray | None] | None = None,
        bins: int = 4000,
    ) -> None:
        self.block_widths = _validated_widths(block_widths)
        self.pairs = tuple((int(first), int(second)) for first, second in pairs)
        if not self.pairs:
            raise ValueError("pairs must name at least one (block, block) pair")
        for first, second in self.pairs:
            if not (0 <= first < len(self.block_widths) and 0 <= second < len(self.block_widths)):
                raise ValueError(
                    f"pair ({first}, {second}) names a block outside "
                    f"0..{len(self.block_widths) - 1}"
                )
            _require_equal_widths(self.block_widths[first], self.block_widths[second])
        self.centers = self._validated_centers(centers)
        if bins < 1:
            raise ValueError(f"bins must be >= 1, got {bins}")
        self.bins = int(bins)
        n_pairs = len(self.pairs)
        self._n = 0
        self._counts = np.zeros((n_pairs, self.bins), dtype=np.int64)
        self._sum = np.zeros(n_pairs)
        self._min = np.full(n_pairs, np.inf)
        self._max = np.full(n_pairs, -np.inf)
        self._zero_norm = np.zeros(n_pairs, dtype=np.int64)

    def _validated_centers(
        self, centers: Sequence[np.ndarray | None] | None
    ) -> tuple[np.ndarray | None, ...]:
        if centers is None:
            return (None,) * len(self.block_widths)
        if len(centers) != len(self.block_widths):
            raise ValueError(f"expected {len(self.block_widths)} centers, got {len(centers)}")
        validated = []
        for block, (center, width) in enumerate(zip(centers, self.block_widths)):
            if center is not None:
                center = np.asarray(center, dtype=np.float64)
                if center.shape != (width,):
                    raise ValueError(
                        f"centers[{block}] has shape {center.shape}, expected ({width},)"
                    )
            validated.append(center)
        return tuple(validated)

    @property
    def n(self) -> int:
        """Rows seen so far."""
        return self._n

    def update(self, blocks: Sequence[np.ndarray]) -> None:
        """Add one chunk: `blocks[b]` has shape (rows, block_widths[b]), rows = the same samples."""
        matrices = _validated_blocks(blocks, self.block_widths)
        if not len(matrices[0]):
            return
        used = {block for pair in self.pairs for block in pair}
        centred = {
            block: matrices[block] - (0.0 if self.centers[block] is None else self.centers[block])
            for block in used
        }
        per_pair = [_rowwise_cosine(centred[i], centred[j]) for i, j in self.pairs]
        cosine = np.stack([pair_cosine for pair_cosine, _ in per_pair])  # (P, rows)
        bin_index = np.clip(np.floor((cosine + 1.0) * (self.bins / 2)), 0, self.bins - 1)
        flat_index = bin_index.astype(np.int64) + self.bins * np.arange(len(self.pairs))[:, None]
        self._counts += np.bincount(flat_index.ravel(), minlength=self._counts.size).reshape(
            self._counts.shape
        )
        self._sum += cosine.sum(axis=1)
        self._min = np.minimum(self._min, cosine.min(axis=1))
        self._max = np.maximum(self._max, cosine.max(axis=1))
        self._zero_norm += np.stack([zero_norm for _, zero_norm in per_pair]).sum(axis=1)
        self._n += cosine.shape[1]

    def merge(self, other: CosineAccumulator) -> CosineAccumulator:
        """Add `other`'s samples (in place; `other` is unchanged) and return self."""
        same_centers = all(
            (mine is None and theirs is None)
            or (mine is not None and theirs is not None and np.array_equal(mine, theirs))
            for mine, theirs in zip(self.centers, other.centers)
        )
        if (
            other.pairs != self.pairs
            or other.block_widths != self.block_widths
            or other.bins != self.bins
            or not same_centers
        ):
            raise ValueError(
                "cannot merge cosine accumulators of different pairs, widths, bins or centers"
            )
        self._n += other._n
        self._counts += other._counts
        self._sum += other._sum
        self._min = np.minimum(self._min, other._min)
        self._max = np.maximum(self._max, other._max)
        self._zero_norm += other._zero_norm
        return self

    def finalize(self) -> CosineStats:
        """Mean and quantiles (at QUANTILE_LEVELS) of the cosine of each pair over all samples."""
        if self._n == 0:
            raise ValueError("no rows were added; cosine statistics need at least one sample")
        return CosineStats(
            mean=self._sum / self._n,
            quantiles=histogram_quantiles(self._counts, self._min, self._max, self._n, self.bins),
            n=self._n,
            zero_norm=self._zero_norm.copy(),
        )
