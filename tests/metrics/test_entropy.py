"""Matrix entropy family against independent float64 formulas and closed forms."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
import scipy.linalg
import torch
import torch.nn.functional as F

from actstore.metrics.entropy import (
    DEFINITION_VERSION,
    CurvatureAccumulator,
    DatasetEntropyAccumulator,
    PromptEntropyAccumulator,
    curvature,
    dataset_entropy,
    dime,
    effective_rank,
    entropy_from_eigenvalues,
    gram_entropy,
    infonce,
    lidar,
    matrix_entropy,
    normalize_rows,
    prompt_entropy,
)

# ---------------------------------------------------------------- independent reference formulas


def ref_normalize(z):
    x = np.asarray(z, dtype=np.float64)
    x = x - x.mean(axis=0)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def ref_spectrum_entropy(weights, alpha):
    w = np.asarray(weights, dtype=np.float64)
    w = w[w > 1e-12 * w.max()]
    p = w / w.sum()
    if alpha == 1:
        return -np.sum(p * np.log(p))
    return np.log(np.sum(p**alpha)) / (1 - alpha)


def ref_matrix_entropy(z, alpha=1.0):
    """Via the singular values of normalize(Z): eig(Z Z^T) = sigma^2."""
    sigma = np.linalg.svd(ref_normalize(z), compute_uv=False)
    return ref_spectrum_entropy(sigma**2, alpha)


def ref_psd_entropy(k, alpha=1.0):
    """Via numpy's general (non-symmetric) eigensolver."""
    return ref_spectrum_entropy(np.linalg.eigvals(k).real, alpha)


def random_prompts(rng, lengths, d, dtype=np.float64):
    tokens = rng.standard_normal((sum(lengths), d)).astype(dtype)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return tokens, offsets


def random_prompt_chunks(rng, tokens, offsets):
    """Split whole prompts into random consecutive chunks, offsets rebased; shuffled order."""
    n_prompts = offsets.size - 1
    cuts = np.sort(
        rng.choice(np.arange(1, n_prompts), size=rng.integers(1, n_prompts), replace=False)
    )
    edges = np.concatenate([[0], cuts, [n_prompts]])
    chunks = [
        (tokens[offsets[a] : offsets[b]], offsets[a : b + 1] - offsets[a])
        for a, b in zip(edges[:-1], edges[1:])
    ]
    return [chunks[i] for i in rng.permutation(len(chunks))]


def random_row_chunks(rng, x):
    cuts = np.sort(rng.choice(np.arange(1, x.shape[0]), size=rng.integers(1, 8), replace=False))
    chunks = np.split(x, cuts)
    return [chunks[i] for i in rng.permutation(len(chunks))]


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def test_definition_version():
    assert DEFINITION_VERSION == 2


# ---------------------------------------------------------------- preprocessing and core entropy


def test_normalize_rows_centres_then_unit_norms(rng):
    z = rng.standard_normal((7, 5)) * 3 + 10
    z[3] = z[[0, 1, 2, 4, 5, 6]].mean(axis=0)  # row 3 equals the set mean, up to rounding
    out = normalize_rows(z)
    centred = z - z.mean(axis=0)
    assert np.all(out[3] == 0)
    rows = [0, 1, 2, 4, 5, 6]
    np.testing.assert_allclose(np.linalg.norm(out[rows], axis=1), 1.0, rtol=1e-14)
    np.testing.assert_allclose(
        out[rows], centred[rows] / np.linalg.norm(centred[rows], axis=1, keepdims=True), rtol=1e-13
    )


@pytest.mark.parametrize("shape", [(12, 40), (60, 8)])
@pytest.mark.parametrize("alpha", [1.0, 0.5, 2.0, 3.0])
def test_matrix_entropy_matches_svd_formula(rng, shape, alpha):
    z = rng.standard_normal(shape) @ rng.standard_normal((shape[1], shape[1]))
    assert matrix_entropy(z, alpha) == pytest.approx(ref_matrix_entropy(z, alpha), rel=1e-10)


def test_renyi_2_closed_form(rng):
    """S_2 = -log(tr(K^2) / tr(K)^2) = -log(||K||_F^2 / tr(K)^2), no eigen-decomposition."""
    z = rng.standard_normal((30, 50))
    k = ref_normalize(z) @ ref_normalize(z).T
    expected = -np.log(np.sum(k * k) / np.trace(k) ** 2)
    assert matrix_entropy(z, alpha=2.0) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("shape", [(80, 10), (10, 80)])
def test_gram_and_covariance_paths_agree(rng, shape):
    z = rng.standard_normal(shape)
    zn = ref_normalize(z)
    for alpha in (1.0, 2.0, 0.7):
        via_gram = gram_entropy(zn @ zn.T, alpha)
        via_cov = gram_entropy(zn.T @ zn, alpha)
        assert via_gram == pytest.approx(via_cov, abs=1e-10)
        assert matrix_entropy(z, alpha) == pytest.approx(via_gram, abs=1e-10)


def test_isotropic_gaussian_approaches_log_min_n_d(rng):
    """n >> d: S -> log d, so the maxEntropy-normalised value -> 1, closer as n grows."""
    d = 16
    gaps = [
        1 - matrix_entropy(rng.standard_normal((n, d)), normalization="maxEntropy")
        for n in (200, 2000, 20000)
    ]
    assert gaps[0] > gaps[1] > gaps[2] > 0
    assert gaps[2] < 1e-3


def test_isotropic_gaussian_with_few_rows_reaches_log_n_minus_1(rng):
    """n << d: centring over the set leaves rank n-1, so S -> log(n-1) (not log n)."""
    n = 8
    s = matrix_entropy(rng.standard_normal((n, 20000)))
    assert s == pytest.approx(np.log(n - 1), abs=2e-3)


@pytest.mark.parametrize("shape", [(50, 6), (6, 50)])
@pytest.mark.parametrize("normalization", ["raw", "maxEntropy", "logN", "logD"])
def test_rank_one_entropy_is_zero(rng, shape, normalization):
    n, d = shape
    z = np.outer(rng.standard_normal(n), rng.standard_normal(d)) + rng.standard_normal(d)
    for alpha in (1.0, 2.0, 0.5):
        assert matrix_entropy(z, alpha, normalization) == pytest.approx(0.0, abs=1e-12)


def test_all_rows_equal_has_zero_entropy(rng):
    """The centred rows are rounding noise of the mean; they must not become unit vectors."""
    z = np.tile(rng.standard_normal(5) * 1e3 + 0.1, (7, 1))
    assert np.any(z - z.mean(axis=0) != 0)
    assert np.all(normalize_rows(z) == 0)
    assert matrix_entropy(z) == 0.0
    assert effective_rank(z) == 1.0


@pytest.mark.parametrize("shape", [(10, 30), (10, 15), (20, 8)])
@pytest.mark.parametrize("alpha", [1.0, 2.0])
def test_duplicating_every_row_leaves_raw_entropy_unchanged(rng, shape, alpha):
    """[Z; Z] keeps the mean and the normalised rows; its Gram is [[K, K], [K, K]] with
    eigenvalues 2*lambda(K) and zeros, so p and every raw entropy are unchanged (also clamped
    when both sizes use the same matrix form)."""
    z = rng.standard_normal(shape)
    doubled = np.vstack([z, z])
    assert matrix_entropy(doubled, alpha) == pytest.approx(matrix_entropy(z, alpha), rel=1e-10)
    same_form = (2 * shape[0] > shape[1]) == (shape[0] > shape[1])
    if same_form:
        assert matrix_entropy(doubled, alpha, clamp=True) == pytest.approx(
            matrix_entropy(z, alpha, clamp=True), rel=1e-10
        )


def test_clamp_changes_value_and_clamps_the_matrix_the_reference_forms(rng):
    # n <= d: the n x n Gram, which has negative entries after centring
    z = rng.standard_normal((12, 30))
    zn = ref_normalize(z)
    assert (zn @ zn.T).min() < 0
    clamped = matrix_entropy(z, clamp=True)
    assert clamped == pytest.approx(ref_psd_entropy(np.maximum(zn @ zn.T, 0)), rel=1e-10)
    assert abs(clamped - matrix_entropy(z)) > 1e-2
    # n > d: the d x d Z^T Z, as the reference code does
    z = rng.standard_normal((40, 6)) @ rng.standard_normal((6, 6))
    zn = ref_normalize(z)
    assert (zn.T @ zn).min() < 0
    clamped = matrix_entropy(z, clamp=True)
    assert clamped == pytest.approx(ref_psd_entropy(np.maximum(zn.T @ zn, 0)), rel=1e-10)
    assert abs(clamped - matrix_entropy(z)) > 1e-3


def test_renyi_limit_alpha_to_one_is_shannon_and_order_decreases(rng):
    z = rng.standard_normal((40, 25))
    shannon = matrix_entropy(z, 1.0)
    for alpha in (1 - 1e-6, 1 + 1e-6):
        assert matrix_entropy(z, alpha) == pytest.approx(shannon, abs=1e-5)
    orders = [matrix_entropy(z, a) for a in (0.5, 0.9, 1.0, 1.5, 2.0, 3.0)]
    assert all(a > b for a, b in zip(orders, orders[1:]))


def test_renyi_entropy_of_large_and_small_orders_matches_high_precision(rng):
    """p^alpha underflows to 0 in float64 for a large alpha, and log(sum p^alpha) / (1 - alpha)
    loses its digits to rounding next to alpha = 1: the reference is that formula in 60 digits."""
    mpmath.mp.dps = 60

    def reference(weights, alpha):
        total = mpmath.fsum(weights.tolist())
        order = mpmath.mpf(alpha)
        return float(mpmath.log(mpmath.fsum((mpmath.mpf(w) / total) ** order for w in weights)) / (1 - order))

    lam = rng.random(50) ** 3
    for alpha in (1e-300, 1e-8, 0.5, 1 - 1e-12, 1 + 1e-12, 2.0, 200.0, 700.0, 1e30):
        assert entropy_from_eigenvalues(lam, alpha) == pytest.approx(reference(lam, alpha), rel=1e-12)
    # the limit alpha -> inf is the min-entropy -log p_max
    assert entropy_from_eigenvalues(lam, 1e308) == pytest.approx(-np.log(lam.max() / lam.sum()), rel=1e-14)
    z = rng.standard_normal((30, 12))
    sigma_squared = np.linalg.svd(ref_normalize(z), compute_uv=False) ** 2
    for alpha in (2.0, 200.0, 700.0, 1e30):
        assert dataset_entropy(z, alpha) == pytest.approx(reference(sigma_squared, alpha), rel=1e-10)


def test_entropy_from_eigenvalues_basics():
    for alpha in (0.5, 1.0, 2.0):
        assert entropy_from_eigenvalues(np.full(7, 3.5), alpha) == pytest.approx(
            np.log(7), rel=1e-14
        )
        # scale-free, and zero or negative eigenvalues do not count
        assert entropy_from_eigenvalues([2.0, 2.0, 0.0, -1e-3], alpha) == pytest.approx(np.log(2))
    assert entropy_from_eigenvalues([0.0, 0.0]) == 0.0
    p = np.array([0.5, 0.25, 0.25])
    assert entropy_from_eigenvalues(p) == pytest.approx(-np.sum(p * np.log(p)), rel=1e-14)
    assert entropy_from_eigenvalues(p, 2.0) == pytest.approx(-np.log(np.sum(p**2)), rel=1e-14)
    for alpha in (0.0, -1.0, np.inf):
        with pytest.raises(ValueError):
            entropy_from_eigenvalues(p, alpha)


def test_normalizations(rng):
    z = rng.standard_normal((30, 12))
    raw = matrix_entropy(z)
    assert matrix_entropy(z, normalization="maxEntropy") == pytest.approx(raw / np.log(12))
    assert matrix_entropy(z, normalization="logN") == pytest.approx(raw / np.log(30))
    assert matrix_entropy(z, normalization="logD") == pytest.approx(raw / np.log(12))
    with pytest.raises(ValueError, match="normalization"):
        matrix_entropy(z, normalization="logNlogD")
    with pytest.raises(ValueError, match="undefined"):
        matrix_entropy(rng.standard_normal((5, 1)), normalization="maxEntropy")


def test_fp16_input_is_upcast_before_products(rng):
    z16 = (rng.standard_normal((20, 300)) * 400).astype(np.float16)
    assert float(np.finfo(np.float16).max) < 400.0 * 400.0  # fp16 products of such entries overflow
    for preprocess in (True, False):
        expected = matrix_entropy(z16.astype(np.float64), preprocess=preprocess)
        assert np.isfinite(expected)
        assert matrix_entropy(z16, preprocess=preprocess) == expected


def test_preprocess_false_uses_the_matrix_as_given(rng):
    z = rng.standard_normal((9, 20)) + 5
    sigma = np.linalg.svd(z, compute_uv=False)
    assert matrix_entropy(z, preprocess=False) == pytest.approx(
        ref_spectrum_entropy(sigma**2, 1), rel=1e-10
    )


# ---------------------------------------------------------------- prompt and dataset entropy


LENGTHS = [1, 5, 12, 3, 1, 40, 2, 9, 17]


@pytest.mark.parametrize("normalization", ["raw", "maxEntropy", "logN"])
@pytest.mark.parametrize("alpha", [1.0, 2.0])
def test_prompt_entropy_is_mean_over_prompts(rng, normalization, alpha):
    d = 10
    tokens, offsets = random_prompts(rng, LENGTHS, d)
    divisor = {"raw": lambda t: 1.0, "maxEntropy": lambda t: np.log(min(t, d)), "logN": np.log}[
        normalization
    ]
    expected = np.mean(
        [
            ref_matrix_entropy(tokens[a:b], alpha) / divisor(b - a)
            for a, b in zip(offsets[:-1], offsets[1:])
            if b - a >= 2
        ]
    )
    assert prompt_entropy(tokens, offsets, alpha, normalization) == pytest.approx(
        expected, rel=1e-10
    )
    accumulator = PromptEntropyAccumulator(alpha, normalization).update(tokens, offsets)
    assert (accumulator.count, accumulator.skipped) == (7, 2)


def test_prompt_entropy_streaming_equals_one_pass(rng):
    tokens, offsets = random_prompts(rng, LENGTHS * 3, 10, np.float16)
    one_pass = prompt_entropy(tokens, offsets, clamp=True)
    for _ in range(5):
        chunks = random_prompt_chunks(rng, tokens, offsets)
        sequential = PromptEntropyAccumulator(clamp=True)
        merged = PromptEntropyAccumulator(clamp=True)
        for chunk in chunks:
            sequential.update(*chunk)
            merged.merge(PromptEntropyAccumulator(clamp=True).update(*chunk))
        for accumulator in (sequential, merged):
            assert accumulator.finalize() == pytest.approx(one_pass, rel=1e-12)
            assert (accumulator.count, accumulator.skipped) == (21, 6)
    with pytest.raises(ValueError, match="same metric and options"):
        PromptEntropyAccumulator().merge(PromptEntropyAccumulator(clamp=True))
    with pytest.raises(ValueError, match="same metric and options"):
        PromptEntropyAccumulator().merge(CurvatureAccumulator())


def test_prompt_offsets_are_validated(rng):
    tokens = rng.standard_normal((6, 3))
    for offsets in ([1, 6], [0, 5], [0, 4, 2, 6], [0.0, 6.0]):
        with pytest.raises(ValueError, match="offsets"):
            prompt_entropy(tokens, np.asarray(offsets))
    with pytest.raises(ValueError, match="no prompt"):
        prompt_entropy(tokens, np.array([0, 1, 2, 3, 4, 5, 6]))


@pytest.mark.parametrize("shape", [(300, 12), (20, 64)])
def test_dataset_entropy_streaming_equals_one_pass(rng, shape):
    pooled = (rng.standard_normal(shape) @ rng.standard_normal((shape[1], shape[1])) + 3).astype(
        np.float32
    )
    assert dataset_entropy(pooled) == pytest.approx(ref_matrix_entropy(pooled), rel=1e-10)
    mean = pooled.astype(np.float64).mean(axis=0)  # pass 1
    options = [(1.0, "raw"), (2.0, "maxEntropy"), (0.5, "logN")]
    for _ in range(4):
        chunks = random_row_chunks(rng, pooled)
        sequential = DatasetEntropyAccumulator(mean)
        merged = DatasetEntropyAccumulator(mean)
        for chunk in chunks:
            sequential.update(chunk)
            merged.merge(DatasetEntropyAccumulator(mean).update(chunk))
        for accumulator in (sequential, merged):
            for alpha, normalization in options:
                assert accumulator.finalize(alpha, normalization) == pytest.approx(
                    dataset_entropy(pooled, alpha, normalization), rel=1e-10
                )
            if shape[0] > shape[1]:
                assert accumulator.finalize(clamp=True) == pytest.approx(
                    dataset_entropy(pooled, clamp=True), rel=1e-10
                )
            else:
                with pytest.raises(ValueError, match="clamp"):
                    accumulator.finalize(clamp=True)
    with pytest.raises(ValueError, match="same mean"):
        DatasetEntropyAccumulator(mean).merge(DatasetEntropyAccumulator(mean + 1))


# ---------------------------------------------------------------- effective rank and curvature


def test_effective_rank_conventions(rng):
    z = rng.standard_normal((50, 12)) @ rng.standard_normal((12, 12))
    sigma = np.linalg.svd(ref_normalize(z), compute_uv=False)
    assert effective_rank(z) == pytest.approx(np.exp(ref_spectrum_entropy(sigma**2, 1)), rel=1e-12)
    assert effective_rank(z) == pytest.approx(np.exp(matrix_entropy(z)), rel=1e-10)
    assert effective_rank(z, "roy-vetterli") == pytest.approx(
        np.exp(ref_spectrum_entropy(sigma, 1)), rel=1e-12
    )
    with pytest.raises(ValueError, match="convention"):
        effective_rank(z, "rankme")


def test_effective_rank_closed_forms(rng):
    """Rows +-e_1..+-e_k: normalize keeps them, Z^T Z = 2 I_k, every sigma equal: rank k.
    A rank-1 matrix has effective rank 1."""
    k = 5
    z = np.vstack([np.eye(k, 9), -np.eye(k, 9)])
    for convention in ("diff-erank", "roy-vetterli"):
        assert effective_rank(z, convention) == pytest.approx(k, rel=1e-12)
        rank_one = np.outer(rng.standard_normal(20), rng.standard_normal(7))
        assert effective_rank(rank_one, convention) == pytest.approx(1.0, rel=1e-12)


def ref_curvature(tokens, offsets, abs_cos=False):
    values = []
    for a, b in zip(offsets[:-1], offsets[1:]):
        if b - a < 3:
            continue
        z = tokens[a:b].astype(np.float64)
        angles = []
        for k in range(1, b - a - 1):
            v_k, v_next = z[k] - z[k - 1], z[k + 1] - z[k]
            c = v_next @ v_k / (np.linalg.norm(v_next) * np.linalg.norm(v_k))
            angles.append(np.arccos(min(1.0, abs(c) if abs_cos else c)))
        values.append(np.mean(angles))
    return np.mean(values)


def test_curvature_hand_cases():
    one = lambda t: np.array([0, len(t)])  # noqa: E731
    line = np.outer(np.arange(6.0), [1.0, 2.0, -1.0])
    assert curvature(line, one(line)) == pytest.approx(0.0, abs=1e-7)
    square = np.array([[0, 0], [1, 0], [1, 1], [0, 1], [0, 0]], dtype=float)
    assert curvature(square, one(square)) == pytest.approx(np.pi / 2, rel=1e-14)
    back_and_forth = np.array([[0, 0], [1, 0], [0, 0], [1, 0]], dtype=float)
    assert curvature(back_and_forth, one(back_and_forth)) == pytest.approx(np.pi, rel=1e-14)
    assert curvature(back_and_forth, one(back_and_forth), abs_cos=True) == pytest.approx(
        0.0, abs=1e-7
    )
    # a zero-length step gives angle 0 (reference code): steps (1,0), (0,0), (0,1)
    stall = np.array([[0, 0], [1, 0], [1, 0], [1, 1]], dtype=float)
    assert curvature(stall, one(stall)) == 0.0


@pytest.mark.parametrize("abs_cos", [False, True])
def test_curvature_matches_reference_loop_and_streams(rng, abs_cos):
    tokens, offsets = random_prompts(rng, LENGTHS, 6)
    expected = ref_curvature(tokens, offsets, abs_cos)
    assert curvature(tokens, offsets, abs_cos) == pytest.approx(expected, rel=1e-12)
    accumulator = CurvatureAccumulator(abs_cos)
    for chunk in random_prompt_chunks(rng, tokens, offsets):
        accumulator.update(*chunk)
    assert accumulator.finalize() == pytest.approx(expected, rel=1e-12)
    assert (accumulator.count, accumulator.skipped) == (6, 3)
    normalised = np.vstack(
        [
            ref_normalize(tokens[a:b]) if b - a > 1 else tokens[a:b]
            for a, b in zip(offsets[:-1], offsets[1:])
        ]
    )
    assert curvature(tokens, offsets, abs_cos, preprocess=True) == pytest.approx(
        ref_curvature(normalised, offsets, abs_cos), rel=1e-12
    )


# ---------------------------------------------------------------- augmentation invariance


def test_infonce_matches_torch_cross_entropy(rng):
    a = rng.standard_normal((32, 16)) + 1
    b = a + 0.5 * rng.standard_normal((32, 16))
    ta = F.normalize(torch.from_numpy(a), dim=1)
    tb = F.normalize(torch.from_numpy(b), dim=1)
    expected = F.cross_entropy(ta @ tb.T / 0.1, torch.arange(32)).item()
    result = infonce(a, b)
    assert result.loss == pytest.approx(expected, rel=1e-12)
    assert result.score == pytest.approx(1 - expected / np.log(32), rel=1e-12)
    assert infonce(a, b, temperature=0.5).loss == pytest.approx(
        F.cross_entropy(ta @ tb.T / 0.5, torch.arange(32)).item(), rel=1e-12
    )


def test_infonce_closed_form_orthogonal_views():
    """A = B = scaled identity: logits 10 on the diagonal, 0 elsewhere, so
    L = log(1 + (n-1) e^-10)."""
    n = 6
    result = infonce(3 * np.eye(n), np.eye(n))
    expected = np.log1p((n - 1) * np.exp(-10.0))
    assert result.loss == pytest.approx(expected, rel=1e-12)
    assert result.score == pytest.approx(1 - expected / np.log(n), rel=1e-12)


def ref_dime(a, b, alpha, n_permutations, seed):
    ka = ref_normalize(a) @ ref_normalize(a).T
    kb = ref_normalize(b) @ ref_normalize(b).T
    rng = np.random.default_rng(seed)
    shuffled = []
    for _ in range(n_permutations):
        p = np.eye(a.shape[0])[rng.permutation(a.shape[0])]  # (P K P^T)_ij = K_pi(i)pi(j)
        shuffled.append(ref_psd_entropy(ka * (p @ kb @ p.T), alpha))
    return np.mean(shuffled) - ref_psd_entropy(ka * kb, alpha)


@pytest.mark.parametrize("alpha", [1.0, 2.0])
def test_dime_matches_reference(rng, alpha):
    a = rng.standard_normal((25, 8))
    b = a + 0.3 * rng.standard_normal((25, 8))
    value = dime(a, b, alpha, n_permutations=7, seed=3)
    assert value == pytest.approx(ref_dime(a, b, alpha, 7, 3), rel=1e-9)
    assert value > 0  # paired views are more aligned than shuffled pairs
    assert dime(a, b, alpha, n_permutations=7, seed=3) == value
    assert dime(a, b, alpha, n_permutations=7, seed=4) != value
    with pytest.raises(ValueError):
        dime(a, b[:-1])


def ref_lidar(z, groups, alpha, delta):
    ids = np.unique(groups)
    means = np.array([z[groups == g].mean(axis=0) for g in ids])
    grand = means.mean(axis=0)
    sigma_b = sum(np.outer(m - grand, m - grand) for m in means) / len(ids)
    sigma_w = sum(
        np.outer(x - means[ids == g][0], x - means[ids == g][0]) for x, g in zip(z, groups)
    )
    sigma_w = sigma_w / len(z) + delta * np.eye(z.shape[1])
    root = scipy.linalg.fractional_matrix_power(sigma_w, -0.5).real
    return ref_psd_entropy(root @ sigma_b @ root, alpha)


@pytest.mark.parametrize("alpha", [1.0, 2.0])
def test_lidar_matches_reference(rng, alpha):
    sizes = [3, 5, 4, 6, 3, 2, 5, 4]  # unbalanced: the grand mean is the unweighted mean of groups
    groups = np.repeat(np.arange(len(sizes)) * 10, sizes)
    centres = rng.standard_normal((len(sizes), 6)) * 2
    z = centres[groups // 10] + 0.5 * rng.standard_normal((groups.size, 6))
    expected = ref_lidar(z, groups, alpha, 1e-4)
    assert lidar(z, groups, alpha) == pytest.approx(expected, rel=1e-9)
    assert lidar(z, groups, alpha, exp=True) == pytest.approx(np.exp(expected), rel=1e-9)
    assert lidar(z, groups, alpha, delta=0.1) == pytest.approx(
        ref_lidar(z, groups, alpha, 0.1), rel=1e-9
    )
