"""Bootstrap intervals, the permutation null and feature options of similarity, against independent
float64 formulas that materialise the same Poisson weights as repeated rows."""

from __future__ import annotations

import numpy as np
import pytest

from actstore.metrics.similarity.features import TransformedAccumulator, feature_transform
from actstore.metrics.similarity.resampling import (
    calibrated_score,
    null_permutation,
    percentile_interval,
    permutation_p_value,
    poisson_weights,
)
from actstore.metrics.similarity.streaming import SimilarityAccumulator
from actstore.metrics.similarity.uncertain_cka import ResampledCKA
from actstore.metrics.similarity.uncertain_cos import ResampledCosine
from tests.formulas import cka_numpy, debiased_numpy, debiased_resampled_numpy


def correlated(n: int, seed: int = 0, dx: int = 6, dy: int = 9) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dx))
    return x, x @ rng.normal(size=(dx, dy)) + 0.8 * rng.normal(size=(n, dy))


def fed_in_chunks(make, blocks, cuts, order):
    """Accumulators from `make()` fed the chunks of `blocks` between `cuts` in the given order,
    merged left to right."""
    bounds = list(zip([0, *cuts], [*cuts, len(blocks[0])]))
    parts = []
    for k in order:
        start, stop = bounds[k]
        part = make()
        part.seek(start)
        part.update([block[start:stop] for block in blocks])
        parts.append(part)
    total = parts[0]
    for part in parts[1:]:
        total.merge(part)
    return total


def fed(x, y, replicates, permutations, seed, cuts, order, **kwargs) -> ResampledCKA:
    """A resampled CKA of x and y fed in chunks (`fed_in_chunks`)."""
    return fed_in_chunks(lambda: ResampledCKA([x.shape[1], y.shape[1]], [(0, 1)], replicates, permutations, seed,
                                              **kwargs), [x, y], cuts, order)


def test_poisson_weights_depend_only_on_seed_replicate_and_row():
    whole = poisson_weights(5, 50, np.arange(20_000))
    assert whole.dtype == np.int64 and whole.min() == 0
    np.testing.assert_array_equal(poisson_weights(5, 50, np.arange(7_000, 9_000)), whole[:, 7_000:9_000])
    np.testing.assert_array_equal(poisson_weights(5, 10, np.arange(20_000)), whole[:10])
    assert abs(whole.mean() - 1) < 0.01 and abs(whole.var() - 1) < 0.02  # Poisson(1)
    assert not np.array_equal(poisson_weights(6, 50, np.arange(20_000)), whole)
    assert abs(np.corrcoef(whole[0], whole[1])[0, 1]) < 0.05


def test_null_permutations_are_seeded_bijections():
    first = null_permutation(3, 0, 500)
    assert sorted(first) == list(range(500))
    np.testing.assert_array_equal(null_permutation(3, 0, 500), first)
    assert not np.array_equal(null_permutation(3, 1, 500), first)
    assert not np.array_equal(null_permutation(4, 0, 500), first)


@pytest.mark.parametrize(("cuts", "order", "strip_bytes"), [([], [0], 1 << 20), ([13, 40], [2, 0, 1], 3_000),
                                                            ([1, 2, 50], [3, 1, 0, 2], 800)])
def test_bootstrap_and_null_match_the_expanded_rows(cuts, order, strip_bytes):
    x, y = correlated(61, seed=1)
    stats = fed(x, y, 12, 6, 9, cuts, order, strip_bytes=strip_bytes).finalize()
    np.testing.assert_allclose(stats.biased, [cka_numpy(x, y)], atol=1e-10)
    np.testing.assert_allclose(stats.debiased, [debiased_numpy(x, y)], atol=1e-10)
    for r, w in enumerate(poisson_weights(9, 12, np.arange(61))):
        xe, ye = np.repeat(x, w, axis=0), np.repeat(y, w, axis=0)  # row i drawn w_i times
        np.testing.assert_allclose(stats.bootstrap_biased[r, 0], cka_numpy(xe, ye), atol=1e-10)
        np.testing.assert_allclose(stats.bootstrap_debiased[r, 0], debiased_resampled_numpy(x, y, w), atol=1e-10)
    for p in range(6):
        permuted = y[null_permutation(9, p, 61)]
        np.testing.assert_allclose(stats.null_biased[p, 0], cka_numpy(x, permuted), atol=1e-10)
        np.testing.assert_allclose(stats.null_debiased[p, 0], debiased_numpy(x, permuted), atol=1e-10)


def test_results_do_not_depend_on_chunking_or_merge_order_and_seeds_reproduce():
    x, y = correlated(50, seed=2)
    one = fed(x, y, 20, 5, 1, [], [0]).finalize()
    many = fed(x, y, 20, 5, 1, [7, 30, 31], [2, 3, 0, 1]).finalize()
    np.testing.assert_allclose(many.bootstrap_biased, one.bootstrap_biased, atol=1e-12)
    np.testing.assert_allclose(many.null_debiased, one.null_debiased, atol=1e-12)
    other = fed(x, y, 20, 5, 2, [], [0]).finalize()
    assert not np.allclose(other.bootstrap_biased, one.bootstrap_biased)


def test_interval_contains_the_estimate_and_narrows_with_more_samples():
    widths = []
    for n in (60, 600):
        x, y = correlated(n, seed=3)
        stats = fed(x, y, 200, 0, 0, [], [0]).finalize()
        low, high = percentile_interval(stats.bootstrap_biased, 0.95)[:, 0]
        assert low <= stats.biased[0] <= high
        low_d, high_d = percentile_interval(stats.bootstrap_debiased, 0.95)[:, 0]
        assert low_d <= stats.debiased[0] <= high_d
        # no row pairs with its own copies, so the debiased replicates centre on the estimate
        assert abs(stats.bootstrap_debiased.mean() - stats.debiased[0]) < 0.2 * (high_d - low_d)
        widths.append(high - low)
    assert widths[1] < 0.6 * widths[0]  # ~ 1/sqrt(n): 10x the samples, about a third of the width


def test_null_of_independent_data_is_near_zero_and_calibration_is_a_rescaling():
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(300, 5)), rng.normal(size=(300, 5))
    stats = fed(x, y, 0, 100, 0, [], [0]).finalize()
    assert abs(stats.null_debiased.mean()) < 0.01  # the unbiased HSIC's null centres on 0
    assert 0 < stats.null_biased.mean() < 0.05  # biased CKA's floor ~ d/n
    observed, null_mean = stats.biased, stats.null_biased.mean(axis=0)
    assert abs(calibrated_score(observed, null_mean)[0]) < 0.05 + 2 * stats.null_biased.std()
    assert calibrated_score(null_mean, null_mean)[0] == 0 and calibrated_score(np.ones(1), null_mean)[0] == 1
    assert np.isnan(calibrated_score(np.array([0.5]), np.array([1.0])))[0]
    assert permutation_p_value(stats.biased, stats.null_biased)[0] > 0.01
    related = fed(*correlated(300, seed=5), 0, 50, 0, [], [0]).finalize()
    assert permutation_p_value(related.biased, related.null_biased)[0] == 1 / 51  # never 0 (Phipson & Smyth)
    assert calibrated_score(related.biased, related.null_biased.mean(axis=0))[0] > 0.5


def test_cosine_bootstrap_is_the_weighted_mean_over_any_chunking():
    x, y = correlated(70, seed=6, dy=6)
    cosine = np.einsum("ij,ij->i", x, y) / np.linalg.norm(x, axis=1) / np.linalg.norm(y, axis=1)
    weights = poisson_weights(2, 15, np.arange(70))
    parts = []
    for start, stop in [(40, 70), (0, 25), (25, 40)]:
        part = ResampledCosine([(0, 1)], [6, 6], replicates=15, seed=2)
        part.seek(start)
        part.update([x[start:stop], y[start:stop]])
        parts.append(part)
    result = parts[0].merge(parts[1]).merge(parts[2]).finalize()
    np.testing.assert_allclose(result.bootstrap_mean[:, 0], weights @ cosine / weights.sum(axis=1), atol=1e-12)
    np.testing.assert_allclose(result.stats.mean, [cosine.mean()], atol=1e-12)
    with pytest.raises(ValueError, match="different replicates or seeds"):
        parts[0].merge(ResampledCosine([(0, 1)], [6, 6], replicates=15, seed=3))


def test_standardised_and_excluded_features_feed_any_accumulator():
    x, y = correlated(80, seed=7)
    x[:, 2] = x[:, 2] * 1000 + 5000  # a massive dimension
    zx, zy = (x - x.mean(0)) / x.std(0), (y - y.mean(0)) / y.std(0)
    transforms = [feature_transform(6, (), x.mean(0), x.std(0)), feature_transform(9, (), y.mean(0), y.std(0))]
    standard = TransformedAccumulator(SimilarityAccumulator([6, 9]), transforms)
    standard.update([x[:30], y[:30]])
    rest = TransformedAccumulator(SimilarityAccumulator([6, 9]), transforms)
    rest.update([x[30:], y[30:]])
    matrices = standard.merge(rest).finalize()
    np.testing.assert_allclose(matrices.biased[0, 1], cka_numpy(zx, zy), atol=1e-10)
    np.testing.assert_allclose(matrices.debiased[0, 1], debiased_numpy(zx, zy), atol=1e-10)
    dropped = TransformedAccumulator(SimilarityAccumulator([5, 9]), [feature_transform(6, [2]), feature_transform(9)])
    dropped.update([x, y])
    keep = [0, 1, 3, 4, 5]
    np.testing.assert_allclose(dropped.finalize().biased[0, 1], cka_numpy(x[:, keep], y), atol=1e-10)
    constant = feature_transform(3, (), np.zeros(3), np.array([1.0, 0.0, 2.0]))
    np.testing.assert_array_equal(constant.apply(np.ones((2, 3))), [[1, 0, 0.5], [1, 0, 0.5]])
    with pytest.raises(ValueError, match="leaves none of 2"):
        feature_transform(2, [0, 1])
