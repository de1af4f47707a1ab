"""The grouped Poisson bootstrap of CKA against its definition (the group weights written out as
repeated rows, independent float64 formulas), its invariances, its agreement with the exact
bootstrap, its coverage of a known population CKA, and the plan that chooses between them."""

from __future__ import annotations

import numpy as np
import pytest

from actstore.errors import ResourceExhausted
from actstore.metrics.similarity import grouped_cka
from actstore.metrics.similarity.grouped_cka import GroupedBootstrapCKA
from actstore.metrics.similarity.resampling import group_poisson_weights, percentile_interval, sample_groups
from actstore.metrics.similarity.uncertain_cka import ResampledCKA
from actstore.server.planners.cka_bootstrap import MIN_GROUPS, plan_bootstrap
from tests.formulas import biased_grouped_numpy, cka_numpy, debiased_numpy, debiased_resampled_numpy
from tests.metrics.test_uncertainty import fed_in_chunks


def correlated(n: int, seed: int = 0, widths=(6, 9, 4), offset: float = 50.0) -> list[np.ndarray]:
    """Blocks that share a signal, far from the origin (the moments must be shifted to stay exact)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, widths[0]))
    return [x @ rng.normal(size=(widths[0], w)) + 0.8 * rng.normal(size=(n, w)) + offset * rng.normal(size=w)
            for w in widths]


def fed(blocks, pairs, replicates, groups, seed, cuts, order, make=GroupedBootstrapCKA):
    """`make(widths, pairs, replicates, groups, seed)` fed the chunks between `cuts` in `order`."""
    widths = [b.shape[1] for b in blocks]
    return fed_in_chunks(lambda: make(widths, pairs, replicates, groups, seed), blocks, cuts, order)


def test_groups_and_their_weights_are_seeded_functions_of_row_and_group():
    groups = sample_groups(3, np.arange(30_000), 48)
    np.testing.assert_array_equal(sample_groups(3, np.arange(10_000, 12_000), 48), groups[10_000:12_000])
    counts = np.bincount(groups, minlength=48)
    assert counts.min() > 0.8 * 30_000 / 48 and counts.max() < 1.2 * 30_000 / 48  # random iid groups
    assert not np.array_equal(sample_groups(4, np.arange(30_000), 48), groups)
    weights = group_poisson_weights(3, 2_000, 48)
    np.testing.assert_array_equal(group_poisson_weights(3, 10, 48), weights[:10])
    assert weights.dtype == np.int64 and abs(weights.mean() - 1) < 0.02 and abs(weights.var() - 1) < 0.05


@pytest.mark.parametrize(("cuts", "order", "groups"),
                         [([], [0], 5), ([13, 40], [2, 0, 1], 7), ([1, 2, 50], [3, 1, 0, 2], 64)])
@pytest.mark.parametrize("near", [False, True])
def test_replicates_equal_the_repeated_rows_definition(cuts, order, groups, near):
    """Sums about the origin, far from the data (the finalize moves the group products to the mean
    first), or about a shift near the mean (a third of a standard deviation off: the finalize
    centres by algebra alone)."""
    blocks = correlated(61, seed=1)
    pairs = [(0, 1), (2, 1), (0, 2)]
    shifts = [b.mean(axis=0) + b.std(axis=0) / 3 for b in blocks] if near else None
    stats = fed([blocks[0], blocks[1], blocks[2].astype(np.float32)], pairs, 12, groups, 9, cuts, order,
                make=lambda w, p, r, g, s: GroupedBootstrapCKA(w, p, r, g, s, shifts)).finalize().stats()
    blocks[2] = blocks[2].astype(np.float32).astype(np.float64)  # float32 rows are exact, upcast before products
    row_weights = group_poisson_weights(9, 12, groups)[:, sample_groups(9, np.arange(61), groups)]
    for k, (a, b) in enumerate(pairs):
        x, y = blocks[a], blocks[b]
        np.testing.assert_allclose(stats.biased[k], cka_numpy(x, y), atol=1e-10)
        np.testing.assert_allclose(stats.debiased[k], debiased_numpy(x, y), atol=1e-10)
        for r, w in enumerate(row_weights):  # every row of group g drawn w_g times
            expected = biased_grouped_numpy(x, y, w) if w.sum() else np.nan
            np.testing.assert_allclose(stats.bootstrap_biased[r, k], expected, atol=1e-10)
            expected = debiased_resampled_numpy(x, y, w) if w.sum() >= 4 else np.nan
            np.testing.assert_allclose(stats.bootstrap_debiased[r, k], expected, atol=1e-10)
    assert stats.null_biased.shape == (0, 3) and stats.n == 61


def test_chunking_merge_order_and_the_row_buffer_change_nothing(monkeypatch):
    blocks = correlated(700, seed=2, widths=(5, 7))
    one = fed(blocks, [(0, 1)], 30, 8, 1, [], [0]).finalize().stats()
    monkeypatch.setattr(grouped_cka, "PENDING_ROWS_PER_GROUP", 2)  # flush every 16 rows
    many = fed(blocks, [(0, 1)], 30, 8, 1, [7, 300, 301, 650], [2, 4, 3, 0, 1]).finalize().stats()
    np.testing.assert_allclose(many.bootstrap_biased, one.bootstrap_biased, atol=1e-12)
    np.testing.assert_allclose(many.bootstrap_debiased, one.bootstrap_debiased, atol=1e-12)
    near = [block[3] for block in blocks]  # any shift is exact; one near the data keeps the sums small
    shifted = fed_in_chunks(lambda: GroupedBootstrapCKA([5, 7], [(0, 1)], 30, 8, 1, shifts=near), blocks,
                            [350], [1, 0]).finalize().stats()
    np.testing.assert_allclose(shifted.bootstrap_debiased, one.bootstrap_debiased, atol=1e-10)
    np.testing.assert_allclose(shifted.bootstrap_biased, one.bootstrap_biased, atol=1e-10)
    other = fed(blocks, [(0, 1)], 30, 8, 2, [], [0]).finalize().stats()
    assert not np.allclose(other.bootstrap_biased, one.bootstrap_biased)
    again = fed(blocks, [(0, 1)], 30, 8, 1, [], [0])
    first = again.finalize().stats()
    np.testing.assert_allclose(again.finalize().stats().bootstrap_debiased, first.bootstrap_debiased, atol=1e-12)


def test_split_shares_fed_the_same_rows_join_to_the_whole():
    blocks = correlated(300, seed=5)
    pairs = [(0, 1), (2, 1), (0, 2)]
    whole = fed(blocks, pairs, 20, 6, 4, [], [0]).finalize().stats()
    template = GroupedBootstrapCKA([6, 9, 4], pairs, 20, 6, 4)
    for parts in (2, 4, 10):
        shares = template.split(parts)
        assert len(shares) == min(parts, 6) and sorted(p for s in shares for p in s.products) == template.products
        for share in shares:
            share.update(blocks)
        terms = [share.finalize() for share in shares]
        joined = terms[0].stats(*terms[1:])
        # the shares sum the same float64 products in another order: 1.4e-12 apart was seen on this
        # machine's BLAS (a wrong share would be off by orders more)
        for field in ("biased", "debiased", "bootstrap_biased", "bootstrap_debiased"):
            np.testing.assert_allclose(getattr(joined, field), getattr(whole, field), rtol=0, atol=1e-10)
    # a pair: its own product against both blocks with themselves (syrk: half the work each)
    cross, selves = GroupedBootstrapCKA([6, 6], [(0, 1)], 5, 4).split(2)
    assert (cross.products, selves.products) == ([(0, 1)], [(0, 0), (1, 1)])
    cross.update([blocks[0][:, :6], blocks[1][:, :6]])
    with pytest.raises(ValueError, match=r"the products \[\(0, 0\), \(1, 1\)\] are missing"):
        cross.finalize().stats()
    with pytest.raises(ValueError, match="before adding rows"):
        cross.split(2)


def test_grouped_and_exact_intervals_agree_in_width_at_large_n():
    """Both estimate the same sampling spread. At n = 1200 the ratio of their standard errors has a
    relative spread of ~9% (the grouped one's ~ 1/sqrt(2 * 63), each bootstrap's Monte-Carlo error
    with 300 replicates ~ 4%; measured over 12 data sets: mean 1.04, sd 0.086), so over three data
    sets the standard errors and the 95% interval widths agree within 20% on average."""
    ratios = {"biased": [], "debiased": []}
    widths = {"biased": [], "debiased": []}
    for seed in range(3):
        blocks = correlated(1200, seed=seed, widths=(6, 9), offset=3.0)
        exact = fed(blocks, [(0, 1)], 300, 0, seed, [], [0], make=lambda w, p, r, g, s: ResampledCKA(w, p, r, 0, s))
        exact, grouped = exact.finalize(), fed(blocks, [(0, 1)], 300, 64, seed, [], [0]).finalize().stats()
        for variant in ratios:
            e, g = getattr(exact, f"bootstrap_{variant}")[:, 0], getattr(grouped, f"bootstrap_{variant}")[:, 0]
            ratios[variant].append(g.std() / e.std())
            widths[variant].append(np.diff(percentile_interval(g, 0.95))[0] / np.diff(percentile_interval(e, 0.95))[0])
    for variant in ratios:
        assert 0.8 < np.mean(ratios[variant]) < 1.2 and 0.8 < np.mean(widths[variant]) < 1.2, (ratios, widths)


def test_where_width_over_n_is_large_both_intervals_keep_their_width():
    """n = 1000 rows of width 48: with copy pairs the biased replicates of whole repeated groups
    spread 1.35-1.7x wider than the exact bootstrap's (the duplication bias ~ width / n varies with
    the groups' weights); without them, on weights scaled to total n, both variants agree with it."""
    biased, debiased = [], []
    for seed in range(3):
        rng = np.random.default_rng(seed)
        x = rng.normal(size=(1000, 48))
        y = x @ rng.normal(size=(48, 48)) / np.sqrt(48) + rng.normal(size=(1000, 48))
        exact = fed([x, y], [(0, 1)], 200, 0, seed, [], [0], make=lambda w, p, r, g, s: ResampledCKA(w, p, r, 0, s))
        exact, grouped = exact.finalize(), fed([x, y], [(0, 1)], 200, 48, seed, [], [0]).finalize().stats()
        biased.append(grouped.bootstrap_biased.std() / exact.bootstrap_biased.std())
        debiased.append(grouped.bootstrap_debiased.std() / exact.bootstrap_debiased.std())
    assert 0.8 < np.mean(debiased) < 1.2 and 0.8 < np.mean(biased) < 1.2, (biased, debiased)


@pytest.mark.slow
def test_debiased_interval_covers_the_population_cka():
    """x ~ N(0, I_6), y = x A + noise: population linear CKA = ||A||_F^2 / (sqrt(6) ||A^T A + s^2 I||_F).
    Over 60 samples of n = 1500 the grouped bootstrap's 90% debiased interval covers it about 90% of
    the time (binomial sd ~ 4%)."""
    rng = np.random.default_rng(11)
    a, noise = rng.normal(size=(6, 5)) * 0.4, 1.0
    truth = np.sum(a * a) / (np.sqrt(6) * np.linalg.norm(a.T @ a + noise**2 * np.eye(5)))
    covered = []
    for trial in range(60):
        x = rng.normal(size=(1500, 6))
        y = x @ a + noise * rng.normal(size=(1500, 5))
        stats = fed([x, y], [(0, 1)], 200, 48, trial, [], [0]).finalize().stats()
        low, high = percentile_interval(stats.bootstrap_debiased[:, 0], 0.90)
        covered.append(low <= truth <= high)
    assert 0.78 <= np.mean(covered) <= 0.98, np.mean(covered)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="groups >= 1"):
        GroupedBootstrapCKA([3, 3], [(0, 1)], 10, 0)
    with pytest.raises(ValueError, match="pairs must name blocks"):
        GroupedBootstrapCKA([3, 3], [(0, 2)], 10, 4)
    with pytest.raises(ValueError, match="different blocks, pairs, products, replicates, groups, seeds or shifts"):
        GroupedBootstrapCKA([3, 3], [(0, 1)], 10, 4).merge(GroupedBootstrapCKA([3, 3], [(0, 1)], 10, 5))
    with pytest.raises(ValueError, match="different blocks, pairs, products, replicates, groups, seeds or shifts"):
        GroupedBootstrapCKA([3, 3], [(0, 1)], 10, 4).merge(
            GroupedBootstrapCKA([3, 3], [(0, 1)], 10, 4, shifts=[np.ones(3), np.zeros(3)]))
    with pytest.raises(ValueError, match="products must be some of"):
        GroupedBootstrapCKA([3, 3, 3], [(0, 1)], 10, 4, products=[(0, 2)])
    with pytest.raises(ValueError, match="one vector per block"):
        GroupedBootstrapCKA([3, 3], [(0, 1)], 10, 4, shifts=[np.ones(3)])
    with pytest.raises(ValueError, match="no rows were added"):
        GroupedBootstrapCKA([3, 3], [(0, 1)], 10, 4).finalize()
    with pytest.raises(ValueError, match="block shapes"):
        GroupedBootstrapCKA([3, 3], [(0, 1)], 10, 4).update([np.zeros((4, 3)), np.zeros((4, 2))])


def test_the_plan_picks_by_modelled_cost_and_sizes_groups_and_tasks_to_memory():
    widths, pair, gib = [384, 384], [(0, 1)], 1 << 30
    assert plan_bootstrap("auto", 48, widths, pair, 512, 200, gib, 2).method == "exact"
    assert plan_bootstrap("auto", 48, widths, pair, 32768, 200, gib, 16).tasks == 1  # one task per 32768 rows
    large = plan_bootstrap("auto", 48, widths, pair, 1 << 20, 200, gib, 16)
    assert (large.method, large.groups) == ("grouped", 48) and 1 <= large.tasks < 16  # 17 states would not fit
    assert GroupedBootstrapCKA.estimate_peak_nbytes(widths, pair, 48, 200, large.tasks) <= gib
    assert GroupedBootstrapCKA.estimate_peak_nbytes(widths, pair, 48, 200, large.tasks + 1) > gib
    assert large.key() == {"bootstrap_method": "grouped", "bootstrap_groups": 48}
    assert plan_bootstrap("exact", 48, widths, pair, 8192, 200, gib, 2).key() == {"bootstrap_method": "exact"}
    lowered = plan_bootstrap("grouped", 64, widths, pair, 100, 200, gib // 3, 2)
    assert MIN_GROUPS <= lowered.groups < 64 and "fewer than the 64 asked" in lowered.note()
    with pytest.raises(ResourceExhausted, match=r"16 groups .* would hold [\d.]+ MiB .* over the 20.00 MiB limit"):
        plan_bootstrap("grouped", 48, widths, pair, 8192, 200, 20 << 20, 2)
    assert plan_bootstrap("auto", 48, widths, pair, 8192, 200, 20 << 20, 2).method == "exact"  # the exact check decides
