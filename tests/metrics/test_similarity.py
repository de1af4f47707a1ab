"""Tests of actstore.metrics.similarity against independent float64 numpy references.

Each reference is written from METRICS.md's formula directly (explicit centring matrix H, explicit
zero-diagonal Grams), never by calling the module under test.
"""

import pickle

import numpy as np
import pytest

from actstore.metrics.similarity import (
    GRAM_STRIP_BYTES,
    QUANTILE_LEVELS,
    CosineAccumulator,
    SimilarityAccumulator,
    check_same_samples,
    choose_cka_mode,
    cka_mode_costs,
    gram_strip_products,
    hsic_unbiased,
    hsic_unbiased_gram,
    linear_cka,
    linear_cka_debiased,
    minibatch_cka,
    mutual_knn,
    samplewise_cosine,
)

# --------------------------------------------------------------------------------------------------
# Independent references


def ref_biased_cka(x, y):
    """Gram-space biased CKA with an explicit H = I - 11^T/n (Kornblith et al. 2019)."""
    n = len(x)
    h = np.eye(n) - np.ones((n, n)) / n
    k, l = h @ x @ x.T @ h, h @ y @ y.T @ h
    return np.sum(k * l) / (np.linalg.norm(k) * np.linalg.norm(l))


def ref_hsic_u(k, l):
    """Song et al. 2007 straight from the Gram formula, with explicit zero-diagonal Grams."""
    n = len(k)
    kt, lt = k - np.diag(np.diag(k)), l - np.diag(np.diag(l))
    one = np.ones(n)
    return (
        np.trace(kt @ lt)
        + (one @ kt @ one) * (one @ lt @ one) / ((n - 1) * (n - 2))
        - 2 / (n - 2) * (one @ kt @ lt @ one)
    ) / (n * (n - 3))


def ref_debiased_cka(x, y):
    x, y = x - x.mean(0), y - y.mean(0)
    k, l = x @ x.T, y @ y.T
    return ref_hsic_u(k, l) / np.sqrt(ref_hsic_u(k, k) * ref_hsic_u(l, l))


def ref_cosine(x, y, center):
    if center:
        x, y = x - x.mean(0), y - y.mean(0)
    return np.sum(x * y, 1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))


def ref_mutual_knn(x, y, k):
    def neighbours(m):
        u = m / np.linalg.norm(m, axis=1, keepdims=True)
        s = u @ u.T
        np.fill_diagonal(s, -np.inf)
        return np.argsort(-s, axis=1)[:, :k]

    return np.mean([len(set(a) & set(b)) for a, b in zip(neighbours(x), neighbours(y))]) / k


def related_pair(rng, n, dx, dy, noise=1.0):
    x = rng.normal(size=(n, dx))
    y = x @ rng.normal(size=(dx, dy)) + noise * rng.normal(size=(n, dy))
    return x, y


def orthogonal(rng, d):
    return np.linalg.qr(rng.normal(size=(d, d)))[0]


def blocks_of_widths(rng, n, widths):
    """Blocks sharing a latent factor, so the CKA values are far from 0 and 1."""
    latent = rng.normal(size=(n, 6))
    return [
        latent @ rng.normal(size=(6, w)) + rng.normal(size=(n, w)) + rng.normal(size=w)
        for w in widths
    ]


def one_pass_matrices(blocks):
    return tuple(
        np.array([[reference(first, second) for second in blocks] for first in blocks])
        for reference in (ref_biased_cka, ref_debiased_cka)
    )


def streamed(blocks, rng, mode="feature", n_chunks=6, **options):
    """Accumulate random, shuffled chunks (some of one row) and merge them in a random tree."""
    n = len(blocks[0])
    cuts = np.sort(rng.choice(np.arange(1, n), size=n_chunks - 1, replace=False))
    order = rng.permutation(n)
    pool = []
    for rows in np.split(order, cuts):
        accumulator = SimilarityAccumulator([b.shape[1] for b in blocks], mode, **options)
        for sub_rows in np.array_split(rows, rng.integers(1, 3)):
            accumulator.update([b[sub_rows] for b in blocks])
        pool.append(accumulator)
    while len(pool) > 1:
        i, j = rng.choice(len(pool), size=2, replace=False)
        pool[i].merge(pool[j])
        del pool[j]
    return pool[0]


# --------------------------------------------------------------------------------------------------
# One-pass values against the references


@pytest.mark.parametrize("n, dx, dy", [(60, 5, 8), (12, 30, 20)])
def test_linear_cka_feature_and_gram_match_reference(n, dx, dy):
    x, y = related_pair(np.random.default_rng(0), n, dx, dy)
    expected = ref_biased_cka(x, y)
    for space in ("feature", "gram", "auto"):
        assert linear_cka(x, y, space) == pytest.approx(expected, abs=1e-10)
    assert abs(linear_cka(x, y, "feature") - linear_cka(x, y, "gram")) < 1e-10


def test_unbiased_hsic_feature_and_gram_forms_match_reference():
    x, y = related_pair(np.random.default_rng(1), 30, 6, 4)
    x = x + 3.0
    expected = ref_hsic_u(x @ x.T, y @ y.T)
    assert hsic_unbiased(x, y) == pytest.approx(expected, rel=1e-10)
    assert hsic_unbiased_gram(x @ x.T, y @ y.T) == pytest.approx(expected, rel=1e-10)
    xc, yc = x - x.mean(0), y - y.mean(0)
    assert hsic_unbiased_gram(xc @ xc.T, yc @ yc.T) == pytest.approx(expected, rel=1e-10)


def test_debiased_cka_matches_reference():
    x, y = related_pair(np.random.default_rng(2), 40, 7, 9)
    assert linear_cka_debiased(x, y) == pytest.approx(ref_debiased_cka(x, y), abs=1e-10)


def test_unbiased_estimators_need_four_samples():
    x = np.random.default_rng(3).normal(size=(3, 2))
    for call in (
        lambda: hsic_unbiased(x, x),
        lambda: hsic_unbiased_gram(x @ x.T, x @ x.T),
        lambda: linear_cka_debiased(x, x),
    ):
        with pytest.raises(ValueError, match="n >= 4"):
            call()


def test_mismatched_sample_counts_are_rejected():
    rng = np.random.default_rng(4)
    with pytest.raises(ValueError, match="10 samples but y has 9"):
        linear_cka(rng.normal(size=(10, 3)), rng.normal(size=(9, 3)))


# --------------------------------------------------------------------------------------------------
# Sanity properties (METRICS.md)


@pytest.mark.parametrize("cka", [linear_cka, linear_cka_debiased])
def test_cka_identity_symmetry_rotation_and_scaling(cka):
    rng = np.random.default_rng(5)
    x, y = related_pair(rng, 50, 6, 10)
    assert cka(x, x) == pytest.approx(1.0, abs=1e-12)
    assert cka(x, y) == pytest.approx(cka(y, x), abs=1e-12)
    assert cka(x @ orthogonal(rng, 6), y) == pytest.approx(cka(x, y), abs=1e-10)
    assert cka(x, 37.5 * y) == pytest.approx(cka(x, y), abs=1e-10)


def test_cosine_is_not_invariant_to_rotation():
    rng = np.random.default_rng(6)
    x = rng.normal(size=(50, 8))
    y = x + 0.3 * rng.normal(size=(50, 8))
    rotated = x @ orthogonal(rng, 8)
    assert linear_cka(rotated, y) == pytest.approx(linear_cka(x, y), abs=1e-10)
    assert samplewise_cosine(x, y).mean() - samplewise_cosine(rotated, y).mean() > 0.5


def test_debiased_cka_can_be_negative_while_biased_cannot():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(20, 5)), rng.normal(size=(20, 5))
    assert linear_cka_debiased(x, y) < 0 < linear_cka(x, y)
    accumulator = SimilarityAccumulator([5, 5])
    accumulator.update([x, y])
    assert accumulator.finalize().debiased[0, 1] < 0


def test_constant_representation_gives_nan_not_a_crash():
    rng = np.random.default_rng(7)
    x, constant = rng.normal(size=(20, 4)), np.full((20, 3), 2.5)
    assert np.isnan(linear_cka_debiased(x, constant))
    assert np.isnan(linear_cka(x, constant))
    accumulator = SimilarityAccumulator([4, 3, 4])
    accumulator.update([x, constant, -x])
    result = accumulator.finalize()
    for matrix in (result.biased, result.debiased):
        assert np.isnan(matrix[1]).all() and np.isnan(matrix[:, 1]).all()
        assert np.allclose(matrix[np.ix_([0, 2], [0, 2])], 1.0, atol=1e-12)


# --------------------------------------------------------------------------------------------------
# Minibatch CKA


def test_minibatch_with_one_batch_equals_debiased_exactly():
    x, y = related_pair(np.random.default_rng(8), 37, 5, 6)
    result = minibatch_cka(x, y, batch_size=37)
    assert result.value == linear_cka_debiased(x, y)
    assert (result.n_batches, result.remainder) == (1, "none")


@pytest.mark.parametrize(
    "remainder, outcome, batch_sizes",
    [("drop", "dropped", [10, 10, 10]), ("merge", "merged", [10, 10, 13])],
)
def test_minibatch_short_final_batch(remainder, outcome, batch_sizes):
    x, y = related_pair(np.random.default_rng(9), 33, 4, 5)
    totals, start = np.zeros(3), 0
    for size in batch_sizes:
        k = x[start : start + size] @ x[start : start + size].T
        l = y[start : start + size] @ y[start : start + size].T
        totals += [ref_hsic_u(k, l), ref_hsic_u(k, k), ref_hsic_u(l, l)]
        start += size
    result = minibatch_cka(x, y, batch_size=10, remainder=remainder)
    assert result.value == pytest.approx(totals[0] / np.sqrt(totals[1] * totals[2]), abs=1e-10)
    assert (result.n_batches, result.batch_size, result.remainder) == (3, 10, outcome)


def test_minibatch_rejects_small_batches():
    x = np.random.default_rng(10).normal(size=(10, 3))
    with pytest.raises(ValueError, match="batch_size must be >= 4"):
        minibatch_cka(x, x, batch_size=3)
    with pytest.raises(ValueError, match="do not fill one batch"):
        minibatch_cka(x, x, batch_size=11)


# --------------------------------------------------------------------------------------------------
# Streaming CKA


@pytest.mark.parametrize("seed", range(4))
def test_streaming_equals_one_pass_over_random_chunkings_and_merge_trees(seed):
    rng = np.random.default_rng(100 + seed)
    blocks = blocks_of_widths(rng, 80, [5, 9, 3, 12])
    expected_biased, expected_debiased = one_pass_matrices(blocks)
    result = streamed(blocks, rng).finalize()
    assert result.n == 80
    np.testing.assert_allclose(result.biased, expected_biased, rtol=0, atol=1e-9)
    np.testing.assert_allclose(result.debiased, expected_debiased, rtol=0, atol=1e-9)
    assert np.array_equal(result.biased, result.biased.T)
    assert np.array_equal(result.debiased, result.debiased.T)
    assert np.all(np.diag(result.biased) == 1) and np.all(np.diag(result.debiased) == 1)


def test_finalize_leaves_the_state_usable_and_unchanged():
    rng = np.random.default_rng(11)
    blocks = blocks_of_widths(rng, 40, [4, 6])
    accumulator = SimilarityAccumulator([4, 6])
    accumulator.update([b[:25] for b in blocks])
    first, second = accumulator.finalize(), accumulator.finalize()
    assert np.array_equal(first.biased, second.biased)
    accumulator.update([b[25:] for b in blocks])
    np.testing.assert_allclose(
        accumulator.finalize().debiased, one_pass_matrices(blocks)[1], rtol=0, atol=1e-9
    )



def test_finalize_in_place_agrees_and_leaves_the_state_usable():
    # in place, the merged moments move to the mean where they lie (no copy): the same matrices
    # to rounding, and the state still takes rows and merges
    rng = np.random.default_rng(12)
    blocks = blocks_of_widths(rng, 60, [4, 6, 5])
    blocks = [b + 30.0 for b in blocks]  # far from zero: the move to the mean is a large one
    copied, moved = (SimilarityAccumulator([4, 6, 5]) for _ in range(2))
    for accumulator in (copied, moved):
        accumulator.update([b[:20] for b in blocks])
        accumulator.update([b[20:41] for b in blocks])  # another chunk size: the buffers are made again
    expected = copied.finalize()
    result = moved.finalize(in_place=True)
    np.testing.assert_allclose(result.biased, expected.biased, rtol=0, atol=1e-12)
    np.testing.assert_allclose(result.debiased, expected.debiased, rtol=0, atol=1e-12)
    rest = SimilarityAccumulator([4, 6, 5])
    rest.update([b[41:] for b in blocks])
    whole = moved.merge(rest).finalize(in_place=True)
    biased, debiased = one_pass_matrices(blocks)
    np.testing.assert_allclose(whole.biased, biased, rtol=0, atol=1e-9)
    np.testing.assert_allclose(whole.debiased, debiased, rtol=0, atol=1e-9)


def test_the_chunk_buffers_are_not_pickled():
    widths = [64] * 4
    accumulator = SimilarityAccumulator(widths)
    rng = np.random.default_rng(13)
    accumulator.update([rng.normal(size=(512, w)) for w in widths])
    # the state is ~0.5 MB (256 x 256 float64); the chunk's buffers would add another 1 MB
    assert len(pickle.dumps(accumulator)) < 1.2 * accumulator.nbytes
    copied = pickle.loads(pickle.dumps(accumulator))
    copied.update([rng.normal(size=(7, w)) for w in widths])
    assert copied.n == 519

def test_float16_chunks_are_upcast_before_any_product():
    rng = np.random.default_rng(12)
    # Coordinates around 300: their squares (9e4) overflow float16's 65504.
    blocks16 = [(300 + 40 * b).astype(np.float16) for b in blocks_of_widths(rng, 60, [6, 4])]
    blocks64 = [b.astype(np.float64) for b in blocks16]
    expected_biased, expected_debiased = one_pass_matrices(blocks64)
    result = streamed(blocks16, rng).finalize()
    np.testing.assert_allclose(result.biased, expected_biased, rtol=0, atol=1e-9)
    np.testing.assert_allclose(result.debiased, expected_debiased, rtol=0, atol=1e-9)
    assert linear_cka(*blocks16) == pytest.approx(expected_biased[0, 1], abs=1e-12)


@pytest.mark.parametrize("n", [30, 120])
def test_feature_and_gram_modes_agree(n):
    rng = np.random.default_rng(13)
    blocks = blocks_of_widths(rng, n, [40, 35, 50])
    feature = streamed(blocks, rng, "feature").finalize()
    gram = streamed(blocks, rng, "gram").finalize()
    np.testing.assert_allclose(gram.biased, feature.biased, rtol=0, atol=1e-9)
    np.testing.assert_allclose(gram.debiased, feature.debiased, rtol=0, atol=1e-9)
    np.testing.assert_allclose(
        gram.biased[0, 1], ref_biased_cka(blocks[0], blocks[1]), rtol=0, atol=1e-10
    )


def test_large_mean_offset_stays_accurate_thanks_to_the_shift():
    rng = np.random.default_rng(14)
    blocks = blocks_of_widths(rng, 200, [8, 5])
    expected_biased, expected_debiased = one_pass_matrices(blocks)
    offset = [b + 1e4 for b in blocks]
    result = streamed(offset, rng, n_chunks=9).finalize()
    np.testing.assert_allclose(result.biased, expected_biased, rtol=1e-8, atol=0)
    np.testing.assert_allclose(result.debiased, expected_debiased, rtol=1e-8, atol=0)


def test_fewer_than_four_rows_leave_debiased_undefined():
    blocks = blocks_of_widths(np.random.default_rng(15), 3, [2, 2])
    accumulator = SimilarityAccumulator([2, 2])
    accumulator.update(blocks)
    result = accumulator.finalize()
    assert np.isnan(result.debiased).all()
    assert result.biased[0, 1] == pytest.approx(ref_biased_cka(*blocks), abs=1e-12)


def test_memory_estimate_matches_held_state():
    rng = np.random.default_rng(16)
    widths = [7, 3, 5]
    for n_rows in (1, 50):
        feature, gram = SimilarityAccumulator(widths), SimilarityAccumulator(widths, "gram")
        for accumulator in (feature, gram):
            accumulator.update(blocks_of_widths(rng, n_rows, widths))
        assert feature.nbytes == SimilarityAccumulator.estimate_nbytes(widths, "feature", 10**9)
        assert gram.nbytes == SimilarityAccumulator.estimate_nbytes(widths, "gram", n_rows)
    assert SimilarityAccumulator.estimate_nbytes(widths, "feature", 1) == 8 * (
        2 * 15 + 15**2 + 3 + 3 * 15 + 3**2
    )


def test_accumulator_rejects_bad_input():
    rng = np.random.default_rng(17)
    accumulator = SimilarityAccumulator([3, 2])
    with pytest.raises(ValueError, match="no rows"):
        accumulator.finalize()
    with pytest.raises(ValueError, match="expected 2 blocks"):
        accumulator.update([rng.normal(size=(4, 3))])
    with pytest.raises(ValueError, match="block shapes"):
        accumulator.update([rng.normal(size=(4, 3)), rng.normal(size=(5, 2))])
    with pytest.raises(ValueError, match="block shapes"):
        accumulator.update([rng.normal(size=(4, 3)), rng.normal(size=(4, 3))])
    with pytest.raises(ValueError, match="cannot merge"):
        accumulator.merge(SimilarityAccumulator([3, 2], "gram"))


@pytest.mark.parametrize("strip_rows", [1, 7, 50, 200])
def test_gram_strips_agree_with_feature_mode_and_the_reference(strip_rows):
    """Gram mode walks the Grams' upper triangle in strips of rows: any strip height (1 row, a
    height that does not divide n, all n rows) gives the feature-space values to 1e-9."""
    rng = np.random.default_rng(20)
    n, widths = 83, [40, 35, 50, 9]
    blocks = [b + 30.0 * (i == 1) for i, b in enumerate(blocks_of_widths(rng, n, widths))]
    strip_bytes = 8 * len(widths) * n * strip_rows
    feature = streamed(blocks, rng, "feature").finalize()
    gram = streamed(blocks, rng, "gram", gram_strip_bytes=strip_bytes).finalize()
    np.testing.assert_allclose(gram.biased, feature.biased, rtol=0, atol=1e-9)
    np.testing.assert_allclose(gram.debiased, feature.debiased, rtol=0, atol=1e-9)
    expected_biased, expected_debiased = one_pass_matrices(blocks)
    np.testing.assert_allclose(gram.biased, expected_biased, rtol=0, atol=1e-9)
    np.testing.assert_allclose(gram.debiased, expected_debiased, rtol=0, atol=1e-9)


def test_gram_strips_dealt_to_parallel_tasks_add_up_to_the_whole():
    """`finalize(strip_map=...)` lets a caller compute groups of strips elsewhere (the service
    uses Ray tasks); any grouping that covers each strip once gives the same matrices."""
    rng = np.random.default_rng(23)
    blocks = blocks_of_widths(rng, 61, [12, 7, 20])
    accumulator = SimilarityAccumulator([12, 7, 20], "gram", gram_strip_bytes=8 * 3 * 61 * 5)
    accumulator.update(blocks)
    calls = []

    def three_tasks(rows, means, widths, strips):
        calls.append(len(strips))
        return [gram_strip_products(rows.copy(), means, widths, strips[i::3]) for i in range(3)]

    dealt = accumulator.finalize(strip_map=three_tasks)
    whole = accumulator.finalize()
    assert calls == [13]  # 61 rows in strips of 5
    np.testing.assert_allclose(dealt.biased, whole.biased, rtol=0, atol=1e-12)
    np.testing.assert_allclose(dealt.debiased, whole.debiased, rtol=0, atol=1e-12)
    np.testing.assert_allclose(dealt.biased, one_pass_matrices(blocks)[0], rtol=0, atol=1e-9)


def test_gram_mode_keeps_float16_rows_and_upcasts_before_products():
    rng = np.random.default_rng(24)
    # Coordinates around 300: their squares (9e4) overflow float16's 65504.
    blocks16 = [(300 + 40 * b).astype(np.float16) for b in blocks_of_widths(rng, 70, [6, 4, 9])]
    accumulator = SimilarityAccumulator([6, 4, 9], "gram")
    accumulator.update([b[:30] for b in blocks16])
    accumulator.update([b[30:] for b in blocks16])
    assert accumulator.nbytes == SimilarityAccumulator.estimate_nbytes([6, 4, 9], "gram", 70, itemsize=2)
    result = accumulator.finalize()
    expected_biased, expected_debiased = one_pass_matrices([b.astype(np.float64) for b in blocks16])
    np.testing.assert_allclose(result.biased, expected_biased, rtol=0, atol=1e-9)
    np.testing.assert_allclose(result.debiased, expected_debiased, rtol=0, atol=1e-9)


def test_feature_updates_merge_from_read_only_partials():
    """Feature mode updates only the upper triangle of its moments (BLAS syrk in place) and
    mirrors it when read; partial accumulators arrive from Ray's object store read-only."""
    rng = np.random.default_rng(21)
    blocks = blocks_of_widths(rng, 90, [6, 11, 4])
    first, second = SimilarityAccumulator([6, 11, 4]), SimilarityAccumulator([6, 11, 4])
    first.update([b[:50] for b in blocks])
    second.update([b[50:] for b in blocks])
    for array in vars(second._state).values():
        if isinstance(array, np.ndarray):
            array.flags.writeable = False
    result = first.merge(second).finalize()
    expected_biased, expected_debiased = one_pass_matrices(blocks)
    np.testing.assert_allclose(result.biased, expected_biased, rtol=0, atol=1e-9)
    np.testing.assert_allclose(result.debiased, expected_debiased, rtol=0, atol=1e-9)


def test_gram_finalize_stays_within_its_peak_estimate():
    """The gram finalize never holds the B n x n Grams: what it allocates (numpy reports to
    tracemalloc) stays within `estimate_peak_nbytes` minus the held rows."""
    import tracemalloc

    rng = np.random.default_rng(22)
    n, widths, strip_bytes = 400, [30] * 12, 8 * 12 * 400 * 16  # strips of 16 rows
    accumulator = SimilarityAccumulator(widths, "gram", gram_strip_bytes=strip_bytes)
    accumulator.update(blocks_of_widths(rng, n, widths))
    held = accumulator.nbytes
    allowed = SimilarityAccumulator.estimate_peak_nbytes(widths, "gram", n, strip_bytes) - held
    all_grams = 8 * len(widths) * n * n
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        accumulator.finalize()
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert peak <= allowed + (64 << 10)  # small temporaries: B x B matrices, Python objects
    assert allowed < all_grams / 4


def test_mode_chooser_picks_the_cheaper_mode_that_fits():
    # M = 4 runs x 7 layers of width 384 at n = 4096: n D^2 is ~2.3x B n^2 d (+ B^2 n^2)
    widths, n = [384] * 28, 4096
    costs = cka_mode_costs(widths, n)
    assert costs["feature"] > 2 * costs["gram"]
    assert choose_cka_mode(widths, n, memory_limit=1 << 30) == "gram"
    # the gram peak (rows twice + one strip) must fit, else feature (whose state is O(D^2))
    assert choose_cka_mode(widths, n, memory_limit=512 << 20) == "feature"
    # float16 rows (2 bytes) and two strip tasks reading a third copy of them
    assert choose_cka_mode(widths, n, memory_limit=768 << 20, itemsize=2, strip_tasks=2) == "gram"
    # n far above the total width: feature space
    assert choose_cka_mode([384] * 7, 100_000, memory_limit=1 << 40) == "feature"
    assert choose_cka_mode([384] * 7, 1000, memory_limit=1 << 30) == "gram"
    peak = SimilarityAccumulator.estimate_peak_nbytes(widths, "gram", n)
    assert 2 * 8 * n * sum(widths) < peak < 8 * len(widths) * n * n / 4
    rows16 = 2 * n * sum(widths)
    peak16 = SimilarityAccumulator.estimate_peak_nbytes(widths, "gram", n, itemsize=2, strip_tasks=2)
    upper = 3 * rows16 + 2 * (GRAM_STRIP_BYTES + (32 << 20)) + (32 << 20)
    assert 3 * rows16 + 2 * 8 * len(widths) * 100 * n < peak16 < upper


# --------------------------------------------------------------------------------------------------
# Sample-wise cosine


@pytest.mark.parametrize("center", ["global-mean", "none"])
def test_samplewise_cosine_matches_reference(center):
    rng = np.random.default_rng(18)
    x = rng.normal(size=(30, 6)) + 1.0
    y = x + rng.normal(size=(30, 6))
    np.testing.assert_allclose(
        samplewise_cosine(x, y, center), ref_cosine(x, y, center == "global-mean"), atol=1e-12
    )


def test_cosine_width_mismatch_names_the_widths():
    rng = np.random.default_rng(19)
    with pytest.raises(ValueError, match="3 and 4"):
        samplewise_cosine(rng.normal(size=(5, 3)), rng.normal(size=(5, 4)))
    with pytest.raises(ValueError, match="3 and 4"):
        CosineAccumulator([(0, 1)], [3, 4])


@pytest.mark.parametrize("bins", [50, 4000])
def test_cosine_accumulator_streams_mean_and_quantiles(bins):
    rng = np.random.default_rng(20)
    n = 501
    # Half-integers with column sums exactly n/2: the mean is exactly 0.5 and row 7 has norm 0
    # after global-mean centring.
    x = rng.integers(-4, 5, size=(n, 6)).astype(np.float64)
    x[7] = 0.0
    x[8] -= x.sum(0)
    x += 0.5
    y = x + 1.5 * rng.normal(size=(n, 6))
    z = rng.normal(size=(n, 6))
    centers = [x.mean(0), y.mean(0), None]
    pairs = [(0, 1), (1, 2), (0, 0)]
    pool = []
    for rows in np.array_split(rng.permutation(n), 5):
        accumulator = CosineAccumulator(pairs, [6, 6, 6], centers, bins=bins)
        accumulator.update([x[rows], y[rows], z[rows]])
        pool.append(accumulator)
    merged = pool[2].merge(pool[0]).merge(pool[4].merge(pool[1])).merge(pool[3])
    stats = merged.finalize()

    exact = [
        samplewise_cosine(x, y),
        samplewise_cosine(y - y.mean(0), z, center="none"),
        samplewise_cosine(x, x),
    ]
    assert exact[0][7] == 0.0 and stats.n == n
    assert list(stats.zero_norm) == [1, 0, 1]
    for pair, values in enumerate(exact):
        assert stats.mean[pair] == pytest.approx(values.mean(), abs=1e-12)
        reference = np.quantile(values, QUANTILE_LEVELS)
        assert np.all(np.abs(stats.quantiles[pair] - reference) <= 2 / bins + 1e-12)
        assert stats.quantiles[pair, 0] == values.min()
        assert stats.quantiles[pair, -1] == values.max()


# --------------------------------------------------------------------------------------------------
# Mutual kNN and sample identity


def test_mutual_knn_matches_reference():
    rng = np.random.default_rng(21)
    x, y = related_pair(rng, 40, 5, 7, noise=2.0)
    for k in (1, 5, 39):
        assert mutual_knn(x, y, k) == pytest.approx(ref_mutual_knn(x, y, k), abs=1e-12)
    assert mutual_knn(x, x, 5) == 1.0
    with pytest.raises(ValueError, match="1 <= k < n"):
        mutual_knn(x, y, 40)


def test_check_same_samples_names_the_first_mismatch():
    check_same_samples(["a", "b", "c"], np.array(["a", "b", "c"]))
    with pytest.raises(ValueError, match=r"position 2: 'c' \(first\) vs 'x' \(second\)"):
        check_same_samples(["a", "b", "c", "d"], ["a", "b", "x", "y"])
    with pytest.raises(ValueError, match=r"position 0: 1 \(first\) vs '1' \(second\)"):
        check_same_samples([1, 2], ["1", "2"])
    with pytest.raises(ValueError, match="differ in length: 3 .* vs 2"):
        check_same_samples([1, 2, 3], [1, 2])
