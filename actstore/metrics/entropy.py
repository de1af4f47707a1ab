"""Matrix entropy family: prompt and dataset entropy, effective rank, curvature, InfoNCE, DiME,
LiDAR.

Source: "Layer by Layer: Uncovering Hidden Representations in Language Models" (Skean et al.
2025) and its reference code; METRICS.md, "Matrix entropy family". Z is (n, d), one row per
sample or token. Every product, trace and eigen-decomposition is in float64; fp16 input is
upcast before any product. Logarithms are natural.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Literal, NamedTuple, Self

import numpy as np
from scipy.special import logsumexp

from ._numerics import SymmetricSum, as_float64_matrix
from .lens import NC1Accumulator

# 2: Renyi entropy finite for a large alpha (results cached under 1 gave Infinity there)
DEFINITION_VERSION = 2

Normalization = Literal["raw", "maxEntropy", "logN", "logD"]


def _unit_rows(x: np.ndarray, mean: np.ndarray | float) -> np.ndarray:
    """Rows `(x_i - mean) / ||x_i - mean||`; a row at the mean becomes 0."""
    centred = x - mean
    norms = np.linalg.norm(centred, axis=1, keepdims=True)
    # A row within sqrt(eps) of the mean, relative to their norms, is the mean up to rounding
    # (below float32 resolution, the finest storage of activations): normalising it would blow
    # the mean's rounding error up to a unit vector, so it counts as exactly at the mean.
    floor = np.sqrt(np.finfo(np.float64).eps) * (
        np.linalg.norm(x, axis=1, keepdims=True) + np.linalg.norm(mean)
    )
    return np.divide(centred, norms, out=np.zeros_like(centred), where=norms > floor)


def normalize_rows(z: np.ndarray) -> np.ndarray:
    """`normalize(Z)`: subtract the mean over the set (the rows), then L2-normalise each row.

    A row at the mean (up to rounding, see `_unit_rows`) stays zero. Source: METRICS.md
    preprocessing, as the reference code's `normalize` (Diff-eRank convention).
    """
    x = as_float64_matrix(z, "z")
    return _unit_rows(x, x.mean(axis=0))


def entropy_from_eigenvalues(eigs: np.ndarray, alpha: float = 1.0) -> float:
    """Renyi entropy of order alpha of the spectrum `eigs`, normalised to a distribution.

    p = the positive eigenvalues / their sum; `S_1 = -sum p log p`,
    `S_alpha = log(sum p^alpha) / (1 - alpha)` otherwise (Skean et al. 2025, eq. 1; Giraldo et
    al. 2015), computed as `-log p_max - log(sum p (p / p_max)^(alpha-1)) / (alpha - 1)`, which
    stays finite for any finite alpha and tends to the min-entropy `-log p_max` as alpha grows.
    An all-zero spectrum (every row equal to the mean) has entropy 0.
    """
    if not (np.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha must be finite and > 0, got {alpha}")
    lam = np.asarray(eigs, dtype=np.float64).ravel()
    if lam.size == 0 or lam.max() <= 0:
        return 0.0
    # eigenvalues below the eigensolver's noise floor (size * eps * largest) are zeros of the
    # exact spectrum, like numpy.linalg.matrix_rank's tolerance
    p = lam[lam > lam.max() * lam.size * np.finfo(np.float64).eps]
    p = p / p.sum()
    if alpha == 1:
        return float(-np.sum(p * np.log(p)))
    # log sum p^alpha with p_max^(alpha-1) factored out: p^alpha underflows to 0 for a large alpha
    # (log 0 = -inf) where sum_i p_i (p_i / p_max)^(alpha-1) >= p_max stays finite. That sum is
    # 1 + sum_i p_i expm1(.), taken by log1p: near alpha = 1 its log is ~(alpha - 1) S_1, which
    # log(sum) would bury under the rounding of the sum (1e-16 / |alpha - 1|).
    order = alpha - 1.0
    with np.errstate(over="ignore"):  # order * log(ratio) -> -inf for a huge alpha; expm1(-inf) = -1
        powers = np.expm1(order * np.log(p / p.max()))
    return float(-np.log(p.max()) - np.log1p(np.sum(p * powers)) / order)


def gram_entropy(k: np.ndarray, alpha: float = 1.0) -> float:
    """Matrix Renyi entropy of a symmetric matrix: `entropy_from_eigenvalues(eigvalsh(K))`.

    For a PSD K this is `S_alpha(K / tr K)`; for a matrix with negative eigenvalues (a clamped
    Gram) only the positive ones count, as in the reference code.
    """
    matrix = as_float64_matrix(k, "K")
    if matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"K must be square, got {matrix.shape}")
    return entropy_from_eigenvalues(np.linalg.eigvalsh(matrix), alpha)


def _normalized(entropy: float, normalization: Normalization, n: int, d: int) -> float:
    divisors = {"raw": 1.0, "maxEntropy": np.log(min(n, d)), "logN": np.log(n), "logD": np.log(d)}
    if normalization not in divisors:
        raise ValueError(f"normalization must be one of {sorted(divisors)}, got {normalization!r}")
    if divisors[normalization] == 0:
        raise ValueError(f"normalization {normalization!r} is undefined for n={n}, d={d}")
    return entropy / float(divisors[normalization])


def _product_entropy(
    k: np.ndarray, n: int, d: int, alpha: float, normalization: Normalization, clamp: bool
) -> float:
    """Entropy of `K = Z Z^T` (n <= d) or `Z^T Z` (n > d), clamped elementwise at 0 if asked."""
    return _normalized(gram_entropy(np.maximum(k, 0.0) if clamp else k, alpha), normalization, n, d)


def matrix_entropy(
    z: np.ndarray,
    alpha: float = 1.0,
    normalization: Normalization = "raw",
    clamp: bool = False,
    preprocess: bool = True,
) -> float:
    """Matrix Renyi entropy S_alpha(Z) (Skean et al. 2025, sec. 3; METRICS.md).

    With Z = normalize(z) (or z as is if preprocess=False), K = Z Z^T (n x n) when n <= d, else
    the d x d Z^T Z (same non-zero spectrum); `S_alpha = entropy_from_eigenvalues(eig K, alpha)`.
    normalization divides by: "raw" 1, "maxEntropy" log min(n, d), "logN" log n, "logD" log d.

    clamp=True sets the negative entries of that matrix to 0 before the eigen-decomposition, as
    the reference code does; like the reference it clamps the matrix it forms, so for n > d it
    clamps Z^T Z, not Z Z^T (the two clamped spectra differ). It changes the value; clamp=True
    reproduces the paper's numbers, the default follows the formula.
    """
    x = normalize_rows(z) if preprocess else as_float64_matrix(z, "z")
    n, d = x.shape
    return _product_entropy(x.T @ x if n > d else x @ x.T, n, d, alpha, normalization, clamp)


class _PromptMean:
    """Sum and count of a per-prompt value; prompts shorter than `min_tokens` are skipped.

    A chunk is `tokens` (T, d), all token rows of whole prompts, with `offsets` (P+1,) such that
    prompt i is `tokens[offsets[i]:offsets[i+1]]` (offsets[0] = 0, offsets[-1] = T). Chunks may
    arrive in any order; accumulators with the same options merge.
    """

    min_tokens: int

    def __init__(self, *options: object) -> None:
        self.options = options
        self.total = 0.0
        self.count = 0
        self.skipped = 0

    def _value(self, tokens: np.ndarray) -> float:
        raise NotImplementedError

    def update(self, tokens: np.ndarray, offsets: np.ndarray) -> Self:
        rows = np.asarray(tokens)
        bounds = np.asarray(offsets)
        if (
            rows.ndim != 2
            or bounds.ndim != 1
            or bounds.size < 1
            or bounds.dtype.kind not in "iu"
            or bounds[0] != 0
            or bounds[-1] != rows.shape[0]
            or np.any(np.diff(bounds) < 0)
        ):
            raise ValueError(
                "tokens must be (T, d) and offsets a non-decreasing integer array from 0 to T, "
                f"got tokens {rows.shape} and offsets {bounds[:8].tolist()}..."
            )
        for start, stop in pairwise(bounds):
            if stop - start < self.min_tokens:
                self.skipped += 1
            else:
                self.total += self._value(rows[start:stop])
                self.count += 1
        return self

    def merge(self, other: Self) -> Self:
        if type(other) is not type(self) or other.options != self.options:
            raise ValueError("can only merge accumulators of the same metric and options")
        self.total += other.total
        self.count += other.count
        self.skipped += other.skipped
        return self

    def finalize(self) -> float:
        """Mean over the prompts with at least `min_tokens` tokens (see `count`, `skipped`)."""
        if self.count == 0:
            raise ValueError(f"no prompt has at least {self.min_tokens} tokens")
        return self.total / self.count


class PromptEntropyAccumulator(_PromptMean):
    """Streaming prompt entropy: sum and count of per-prompt `matrix_entropy`; prompts with < 2
    tokens are skipped and counted."""

    min_tokens = 2

    def __init__(
        self, alpha: float = 1.0, normalization: Normalization = "raw", clamp: bool = False
    ) -> None:
        super().__init__(alpha, normalization, clamp)

    def _value(self, tokens: np.ndarray) -> float:
        return matrix_entropy(tokens, *self.options)


def prompt_entropy(
    tokens: np.ndarray,
    offsets: np.ndarray,
    alpha: float = 1.0,
    normalization: Normalization = "raw",
    clamp: bool = False,
) -> float:
    """Prompt entropy (Skean et al. 2025, sec. 3.1): the mean over prompts of
    `matrix_entropy(prompt tokens)`, each prompt normalised over its own (non-pad) tokens and
    normalization applied per prompt (n = its token count). Prompts with < 2 tokens are skipped;
    `PromptEntropyAccumulator` streams the same sum and reports the skipped count.
    """
    accumulator = PromptEntropyAccumulator(alpha, normalization, clamp)
    return accumulator.update(tokens, offsets).finalize()


def dataset_entropy(
    pooled: np.ndarray,
    alpha: float = 1.0,
    normalization: Normalization = "raw",
    clamp: bool = False,
) -> float:
    """Dataset entropy (Skean et al. 2025, sec. 3.1): `matrix_entropy` of the (n, d) matrix of
    mean-pooled prompt vectors, normalised over the whole set (never per batch). The reference
    code skips that set-level normalisation (it normalises each prompt's tokens before pooling);
    METRICS.md's definition is the one implemented."""
    return matrix_entropy(pooled, alpha, normalization, clamp)


class DatasetEntropyAccumulator:
    """Streaming dataset entropy: `sum_i u_i u_i^T` (d x d, float64) with
    `u_i = (x_i - mean) / ||x_i - mean||`, which is `normalize(Z)^T normalize(Z)`.

    normalize needs the global mean before the rows are L2-normalised, so this is a two-pass job:
    pass 1 computes the float64 mean of all pooled vectors, pass 2 feeds the chunks here, in any
    order. Accumulators merge only when built on the same mean.
    """

    def __init__(self, mean: np.ndarray, device: str | None = None) -> None:
        self.mean = np.asarray(mean, dtype=np.float64)
        if self.mean.ndim != 1:
            raise ValueError(f"mean must be a (d,) vector, got shape {self.mean.shape}")
        self.n = 0
        self._scatter = SymmetricSum(self.mean.size)
        self.device = device  # where `u^T u` runs: None for the host, else a torch device

    @property
    def scatter(self) -> np.ndarray:
        """`normalize(Z)^T normalize(Z)` of the rows so far (d x d, float64, on the host)."""
        return self._scatter.matrix()

    def update(self, pooled: np.ndarray) -> Self:
        x = as_float64_matrix(pooled, "pooled")
        if x.shape[1] != self.mean.size:
            raise ValueError(f"pooled has {x.shape[1]} features, the mean has {self.mean.size}")
        self._scatter.add(_unit_rows(x, self.mean), self.device)
        self.n += x.shape[0]
        return self

    def merge(self, other: DatasetEntropyAccumulator) -> Self:
        if not np.array_equal(other.mean, self.mean):
            raise ValueError("can only merge dataset-entropy accumulators built on the same mean")
        self._scatter.merge(other._scatter)
        self.n += other.n
        return self

    def finalize(
        self, alpha: float = 1.0, normalization: Normalization = "raw", clamp: bool = False
    ) -> float:
        """`dataset_entropy` of all accumulated rows. clamp needs n > d: for n <= d the clamped
        matrix is the n x n Gram, which a d x d accumulator cannot give."""
        d = self.mean.size
        if clamp and self.n <= d:
            raise ValueError(
                f"clamp with n={self.n} <= d={d} needs the n x n Gram: use dataset_entropy"
            )
        return _product_entropy(self.scatter, self.n, d, alpha, normalization, clamp)

    def effective_rank(self, convention: Literal["diff-erank", "roy-vetterli"] = "diff-erank") -> float:
        """`effective_rank` of all accumulated rows: the scatter's eigenvalues are sigma^2."""
        squared = np.clip(np.linalg.eigvalsh(self.scatter), 0.0, None)
        return _effective_rank_from_squared(squared, convention)


def effective_rank(
    z: np.ndarray, convention: Literal["diff-erank", "roy-vetterli"] = "diff-erank"
) -> float:
    """Effective rank `exp(S_1(p))` over the singular values sigma of normalize(Z).

    "diff-erank" (default; Diff-eRank, as in Skean et al. 2025): `p = sigma^2 / sum sigma^2`, which
    equals `exp(matrix_entropy(z))`. "roy-vetterli" (Roy & Vetterli 2007): `p = sigma / sum sigma`.
    All rows at the mean give exp(0) = 1, following the zero entropy of an all-zero spectrum.
    """
    sigma = np.linalg.svd(normalize_rows(z), compute_uv=False)
    return _effective_rank_from_squared(sigma**2, convention)


def _effective_rank_from_squared(squared: np.ndarray, convention: str) -> float:
    weights = {"diff-erank": squared, "roy-vetterli": np.sqrt(squared)}
    if convention not in weights:
        raise ValueError(f"convention must be one of {sorted(weights)}, got {convention!r}")
    return float(np.exp(entropy_from_eigenvalues(weights[convention])))


def _prompt_curvature(tokens: np.ndarray, abs_cos: bool, preprocess: bool) -> float:
    x = normalize_rows(tokens) if preprocess else as_float64_matrix(tokens, "tokens")
    steps = np.diff(x, axis=0)
    lengths = np.linalg.norm(steps, axis=1)
    dots = np.einsum("ij,ij->i", steps[1:], steps[:-1])
    scale = lengths[1:] * lengths[:-1]
    cos = np.divide(dots, scale, out=np.ones_like(dots), where=scale > 0)
    # rounding can push |cos| a hair past 1, where arccos is nan
    return float(np.mean(np.arccos(np.clip(np.abs(cos) if abs_cos else cos, -1.0, 1.0))))


class CurvatureAccumulator(_PromptMean):
    """Streaming curvature: sum and count of per-prompt mean angles; prompts with < 3 tokens are
    skipped and counted."""

    min_tokens = 3

    def __init__(self, abs_cos: bool = False, preprocess: bool = False) -> None:
        super().__init__(abs_cos, preprocess)

    def _value(self, tokens: np.ndarray) -> float:
        return _prompt_curvature(tokens, *self.options)


def curvature(
    tokens: np.ndarray, offsets: np.ndarray, abs_cos: bool = False, preprocess: bool = False
) -> float:
    """Average curvature (Skean et al. 2025, sec. 3.2; Hosseini & Fedorenko 2023).

    Within a prompt, `v_k = z_k - z_{k-1}`; its curvature is the mean over k of
    `arccos(<v_{k+1}, v_k> / (||v_{k+1}|| ||v_k||))`; the result is the mean over prompts with at
    least 3 tokens (shorter ones are skipped; `CurvatureAccumulator` reports how many).
    abs_cos=True takes |.| inside the arccos (the reference code). preprocess=True first applies
    normalize to each prompt's tokens, as the reference code does. A pair with a zero-length step
    has angle 0, as in the reference code.
    """
    return CurvatureAccumulator(abs_cos, preprocess).update(tokens, offsets).finalize()


class InfoNCE(NamedTuple):
    """The InfoNCE loss L and its score `1 - L / log n`."""

    loss: float
    score: float


def _paired_views(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    xa, xb = as_float64_matrix(a, "a"), as_float64_matrix(b, "b")
    if xa.shape != xb.shape or xa.shape[0] < 2:
        raise ValueError(f"a {xa.shape} and b {xb.shape} must be equal (n, d) with n >= 2")
    return xa, xb


def infonce(a: np.ndarray, b: np.ndarray, temperature: float = 0.1) -> InfoNCE:
    """InfoNCE between two augmentations of each prompt (Skean et al. 2025, sec. 3.3; Oord et al.
    2018).

    a, b: (n, d) mean-pooled views, row i of both from prompt i. Rows are L2-normalised (not
    centred); logits `A B^T / temperature`; loss L = cross-entropy with the diagonal as labels,
    `mean_i [logsumexp_j logits_ij - logits_ii]`; score `1 - L / log n`. This is METRICS.md's
    one-directional form; the reference code uses the symmetric 2n-view SimCLR loss instead.
    """
    xa, xb = _paired_views(a, b)
    logits = _unit_rows(xa, 0.0) @ _unit_rows(xb, 0.0).T / temperature
    loss = float(np.mean(logsumexp(logits, axis=1) - np.diag(logits)))
    return InfoNCE(loss, float(1.0 - loss / np.log(xa.shape[0])))


def dime(
    a: np.ndarray, b: np.ndarray, alpha: float = 1.0, n_permutations: int = 10, seed: int = 0
) -> float:
    """DiME (Skean et al. 2025, sec. 3.3; Skean et al. 2023):
    `mean_P S_alpha(K_a ∘ P K_b P^T) - S_alpha(K_a ∘ K_b)`.

    K_a, K_b: n x n Grams of normalize(a), normalize(b) (two augmentations, row i of both from
    prompt i); ∘ the Hadamard product; S_alpha = `gram_entropy`; P: n_permutations random
    permutations from `numpy.random.default_rng(seed)`.
    """
    if n_permutations < 1:
        raise ValueError(f"n_permutations must be >= 1, got {n_permutations}")
    xa, xb = _paired_views(a, b)
    za, zb = normalize_rows(xa), normalize_rows(xb)
    ka, kb = za @ za.T, zb @ zb.T
    rng = np.random.default_rng(seed)
    shuffled = [
        gram_entropy(ka * kb[np.ix_(p, p)], alpha)
        for p in (rng.permutation(xa.shape[0]) for _ in range(n_permutations))
    ]
    return float(np.mean(shuffled)) - gram_entropy(ka * kb, alpha)


def lidar(
    z: np.ndarray, groups: np.ndarray, alpha: float = 1.0, delta: float = 1e-4, exp: bool = False
) -> float:
    """LiDAR (Thilak et al. 2024, as in Skean et al. 2025, sec. 3.3).

    groups[i] is the prompt (augmentation group) of row i. With mu_g the group means and mu their
    unweighted mean: `Sigma_b = (1/G) sum_g (mu_g - mu)(mu_g - mu)^T`,
    `Sigma_w = (1/N) sum_i (z_i - mu_g(i))(z_i - mu_g(i))^T + delta I` (NC1's Sigma_B and
    Sigma_W, hence `NC1Accumulator`), and the result is `S_alpha` of the eigenvalues of
    `Sigma_w^{-1/2} Sigma_b Sigma_w^{-1/2}` (exp(S) if exp=True, as Thilak et al. report).
    Features are used as given (no normalisation).
    """
    sigma_w, sigma_b = NC1Accumulator().update(z, groups).scatter_matrices()
    eigenvalues, eigenvectors = np.linalg.eigh(sigma_w + delta * np.eye(sigma_w.shape[0]))
    inverse_root = (eigenvectors / np.sqrt(eigenvalues)) @ eigenvectors.T
    entropy = gram_entropy(inverse_root @ sigma_b @ inverse_root, alpha)
    return float(np.exp(entropy)) if exp else entropy
