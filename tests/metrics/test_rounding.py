"""The error figures of lossy storage (`metrics.rounding.ErrorFigures`) against independent float64
formulas (tests/formulas.py, and the statistical bound recomputed from n x n Gram matrices), in any
chunking and merge order, numpy and torch alike; the angle is never below arccos of the true
CKA(X, Xhat); the statistical bound holds over many seeds of the stochastic rounding, for Y of
every kind and with both sides lossy, and shrinks with n where the angle does not."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from actstore.metrics.rounding import (
    DECODE_ULPS,
    DRAW_BIAS_STEPS,
    FIGURES,
    ROUNDING_ALLOWANCE,
    SIDE_CONFIDENCE,
    SIDE_TERMS,
    ErrorFigures,
    angle_bound,
    answer_bound,
    completed,
    side_bound,
)
from actstore.store.format import quantised
from tests.formulas import cka_numpy, debiased_numpy, hsic_u_numpy

STATES, ROWS, WIDTH = 3, 300, 12


def _coded(exact: np.ndarray, seed: int, shard_rows: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """(stored, states (shards, 2, L+1, d)) of exact (L+1, rows, d), coded per shard of `shard_rows`."""
    stored, states = np.empty_like(exact), []
    for lo in range(0, exact.shape[1], shard_rows):
        codes, state = quantised.quantise(exact[:, lo:lo + shard_rows], seed=seed * 1000 + lo)
        stored[:, lo:lo + shard_rows] = quantised.decode(codes, state)
        states.append(state)
    return stored, np.stack(states)


def _pair(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(exact, stored, states) (L+1, rows, d): int8 codes per 64-row shard, one layer constant (stored exactly)."""
    rng = np.random.default_rng(seed)
    exact = (rng.standard_normal((STATES, ROWS, WIDTH)) * rng.uniform(0.1, 10, WIDTH) + 5).astype(np.float32)
    exact[2] = 1.5
    return exact, *_coded(exact, seed)


def _fed(exact, stored, states, bounds, as_tensors=False, shard_rows=64) -> ErrorFigures:
    """Figures fed shard-aligned `bounds` (row ranges of whole 64-row shards)."""
    figures = ErrorFigures(exact.shape[0], exact.shape[2])
    for lo, hi in bounds:
        for start in range(lo, hi, shard_rows):
            stop = min(start + shard_rows, hi)
            parts = (exact[:, start:stop], stored[:, start:stop], states[start // shard_rows])
            figures.update(*(torch.from_numpy(p.copy()) for p in parts) if as_tensors else parts)
    return figures


def _statistical_bound_from_grams(x, xhat, half_steps, magnitudes) -> dict[str, float]:
    """metrics.rounding.statistical_bound recomputed in the n x n Gram space (METRICS.md's K = X X^T):
    {gap_, spread_, bound_ + variant}."""
    n = len(x)
    h = np.eye(n) - 1 / n
    khat = xhat @ xhat.T
    khatc = h @ khat @ h
    xc, ec = h @ x, h @ (xhat - x)
    spread = half_steps + DECODE_ULPS * magnitudes
    variance = np.linalg.eigvalsh((xc * spread) @ (xc * spread).T)[-1]  # lambda_max(Xc D'^2 Xc^T)
    t = math.sqrt(2 * variance * math.log(2 / (1 - SIDE_CONFIDENCE)))
    bias = math.sqrt(n * np.sum((DRAW_BIAS_STEPS * 2 * half_steps + DECODE_ULPS * magnitudes) ** 2))
    numerator = 2 * t + 2 * math.sqrt(np.linalg.eigvalsh(xc @ xc.T)[-1]) * bias + np.linalg.norm(ec @ ec.T)
    norms = {"biased": np.linalg.norm(khatc), "debiased": math.sqrt(n * (n - 3) * hsic_u_numpy(khat, khat))}
    cosines = {"biased": cka_numpy(x, xhat), "debiased": debiased_numpy(x, xhat)}
    found = {}
    for variant, norm in norms.items():
        found[f"gap_{variant}"] = 1 - cosines[variant]
        found[f"spread_{variant}"] = numerator / norm
        found[f"bound_{variant}"] = math.hypot(found[f"gap_{variant}"], found[f"spread_{variant}"])
    return found


def test_the_figures_are_the_formulas_of_metrics_md():
    exact, stored, states = _pair()
    figures = _fed(exact, stored, states, [(0, ROWS)]).finalize()
    assert set(figures) == set(FIGURES + SIDE_TERMS)
    half_steps = states[:, 0].max(axis=0).astype(np.float64) / 2
    magnitudes = (np.abs(states[:, 1].astype(np.float64)) + 128 * states[:, 0]).max(axis=0)
    for layer in range(2):
        x, xhat = exact[layer].astype(np.float64), stored[layer].astype(np.float64)
        xc, xhatc = x - x.mean(0), xhat - xhat.mean(0)
        assert figures["rows"][layer] == ROWS
        assert figures["rel_frobenius"][layer] == pytest.approx(np.linalg.norm(xhat - x) / np.linalg.norm(x), rel=1e-12)
        assert figures["max_abs"][layer] == np.abs(xhat - x).max()
        assert figures["cka_biased"][layer] == pytest.approx(cka_numpy(x, xhat), abs=1e-13)
        assert figures["cka_debiased"][layer] == pytest.approx(debiased_numpy(xc, xhatc), abs=1e-13)
        true_angle = math.acos(cka_numpy(x, xhat))
        assert true_angle <= figures["angle_biased"][layer] <= true_angle + 1e-7
        expected = _statistical_bound_from_grams(x, xhat, half_steps[layer], magnitudes[layer])
        for name in SIDE_TERMS:  # each carries the allowance of n rows
            assert figures[name][layer] == pytest.approx(expected[name], rel=1e-9, abs=ROUNDING_ALLOWANCE * ROWS * 2)
        for variant in ("biased", "debiased"):
            assert figures[f"bound_{variant}"][layer] == pytest.approx(
                min(expected[f"bound_{variant}"], figures[f"angle_{variant}"][layer]), rel=1e-9,
                abs=ROUNDING_ALLOWANCE * ROWS * 3)
    # the constant layer is stored exactly: no angle
    assert [figures[name][2] for name in ("max_abs", "cka_biased", "angle_biased", "angle_debiased", "bound_biased",
                                          "bound_debiased")] == [0, 1, 0, 0, 0, 0]


@pytest.mark.parametrize("as_tensors", [False, True])
def test_any_chunking_and_merge_order_give_the_one_pass_figures(as_tensors):
    exact, stored, states = _pair(1)
    one = _fed(exact, stored, states, [(0, ROWS)]).finalize()
    parts = [_fed(exact, stored, states, [b], as_tensors) for b in [(256, 300), (0, 64), (64, 256)]]
    merged = ErrorFigures(STATES, WIDTH)
    for part in parts:
        merged.merge(part)
    got = merged.finalize()
    for name in FIGURES + SIDE_TERMS:  # an angle moves by the cosine's rounding over the angle itself: 1e-15 / 7e-3
        rtol = 1e-9 if name.startswith(("angle", "bound", "gap", "spread")) else 1e-12
        np.testing.assert_allclose(got[name], one[name], rtol=rtol, atol=1e-13, err_msg=name)


def test_the_angle_is_lowered_by_the_rounding_allowance_of_n_rows():
    assert angle_bound(1.0, 1000) == pytest.approx(math.acos(1 - ROUNDING_ALLOWANCE * 1000))
    assert angle_bound(0.5, 10) > math.acos(0.5)
    assert math.isnan(angle_bound(math.nan, 10))


def _layers(n: int, seed: int) -> np.ndarray:
    """(3, n, 24) float32 like a residual stream's: low rank plus noise, a channel far from zero, a
    massive-activation channel (one row in 40); layer 1 a rotated, noisier layer 0, layer 2 independent."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((n, 6)) @ rng.standard_normal((6, 24)) + 0.3 * rng.standard_normal((n, 24))
    base[:, 2] += 40
    base[::40, 5] += 200
    rotation, _ = np.linalg.qr(rng.standard_normal((24, 24)))
    other = rng.standard_normal((n, 24)) * rng.uniform(0.5, 3, 24)
    return np.stack([base, base @ rotation + rng.standard_normal((n, 24)), other]).astype(np.float32)


def _both_ckas(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(biased, debiased) linear CKA, float64, in the feature-space form of METRICS.md written out
    here (the n x n Gram form of tests/formulas.py is the same number, at n^3 cost)."""
    x, y = x.astype(np.float64), y.astype(np.float64)
    x, y = x - x.mean(0), y - y.mean(0)
    n = len(x)

    def hsic(a, b):
        ra, rb = (a * a).sum(1), (b * b).sum(1)
        return np.sum((a.T @ b) ** 2) - n / (n - 2) * ra @ rb + ra.sum() * rb.sum() / ((n - 1) * (n - 2))

    biased = np.sum((x.T @ y) ** 2) / math.sqrt(np.sum((x.T @ x) ** 2) * np.sum((y.T @ y) ** 2))
    return np.array([biased, hsic(x, y) / math.sqrt(hsic(x, x) * hsic(y, y))])


def test_the_feature_space_ckas_of_these_tests_are_the_gram_formulas():
    x, y = _layers(120, 5)[:2]
    np.testing.assert_allclose(_both_ckas(x, y), [cka_numpy(x, y), debiased_numpy(x, y)], rtol=1e-10)


def test_the_statistical_bound_holds_over_many_seeds_for_every_kind_of_y_and_with_both_sides_lossy():
    """80 seeds of the rounding of one exact run of 3 layers (2,000 rows, shards of 256): for every
    pair of layers, biased and debiased, |CKA(Xhat, Y) - CKA(X, Y)| <= bound_X with Y exact (a
    layer of the run, the same layer, a layer of other data), and |CKA(Xhat, Yhat) - CKA(X, Y)| <=
    bound_X + bound_Y with both stored; and each within the finer `answer_bound` taken at the
    answer's own value: 3,840 checks of bounds stated at 99.9% or more, none may fail (a failure
    rate of 1 in 1,000 would give 4 in expectation; the bound's slack makes 0 the honest
    expectation)."""
    exact = _layers(2000, 0)
    elsewhere = _layers(2000, 99)[2]
    exact_ckas = {(a, b): _both_ckas(exact[a], exact[b]) for a in range(3) for b in range(3)}
    worst = finest = 0.0
    for seed in range(80):
        stored, states = _coded(exact, seed, shard_rows=256)
        figures = _fed(exact, stored, states, [(0, 2000)], shard_rows=256).finalize()
        bound = np.array([figures["bound_biased"], figures["bound_debiased"]]).T  # (layers, 2)

        def side(layer, figures=figures):
            return tuple(np.array([figures[f"{name}_{variant}"][layer] for variant in ("biased", "debiased")])
                         for name in ("bound", "gap", "spread"))

        def finer(answer, first, second=None):
            return np.array([answer_bound(answer[v], tuple(part[v] for part in first),
                                          None if second is None else tuple(part[v] for part in second),
                                          debiased=v == 1) for v in range(2)])

        for a in range(3):
            answer = _both_ckas(stored[a], elsewhere)
            error = np.abs(answer - _both_ckas(exact[a], elsewhere))
            assert np.all(error <= bound[a]), (seed, a, error, bound[a])
            assert np.all(error <= finer(answer, side(a))), (seed, a, error, finer(answer, side(a)))
            for b in range(3):
                answer = _both_ckas(stored[a], exact[b])
                with_exact = np.abs(answer - exact_ckas[a, b])
                assert np.all(with_exact <= bound[a]), (seed, a, b, with_exact, bound[a])
                assert np.all(with_exact <= finer(answer, side(a))), (seed, a, b, with_exact)
                if a != b:  # one layer against itself is CKA 1 on both sides
                    answer = _both_ckas(stored[a], stored[b])
                    both = np.abs(answer - exact_ckas[a, b])
                    assert np.all(both <= bound[a] + bound[b]), (seed, a, b, both, bound[a] + bound[b])
                    pair = finer(answer, side(a), side(b))
                    assert np.all(both <= pair), (seed, a, b, both, pair)
                    assert np.all(pair <= bound[a] + bound[b] + 1e-15)
                    worst = max(worst, float((both / (bound[a] + bound[b])).max()))
                    finest = max(finest, float((both / pair).max()))
    assert 0 < worst <= finest < 1


def test_side_bound_is_the_largest_over_its_interval_and_never_above_the_side_bound():
    """Against a grid of 200,001 points of c' over the interval: the largest of gap |c'| + spread
    sqrt(1 - c'^2) there, or the side's bound where that is smaller; NaN terms leave the bound."""
    grid = np.linspace(-1, 1, 200_001)
    rng = np.random.default_rng(4)
    for _ in range(200):
        c, half_width = rng.uniform(-1, 1), rng.uniform(0, 0.3)
        gap, spread = rng.uniform(0, 0.05, 2)
        bound = math.hypot(gap, spread) * rng.choice([1.0, 0.5])
        for debiased in (False, True):
            inside = grid[(grid >= c - half_width) & (grid <= c + half_width) & ((grid >= 0) | debiased)]
            if not inside.size:
                continue
            brute = np.max(gap * np.abs(inside) + spread * np.sqrt(1 - inside**2))
            found = side_bound(np.array(c), np.array(half_width), np.array(bound), np.array(gap), np.array(spread),
                               debiased)
            assert min(brute, bound) <= found + 1e-15  # never below the largest: a bound
            assert found <= min(brute, bound) + 1e-6  # the grid's step of 1e-5 at a slope <= 0.05
    assert side_bound(np.array(0.5), np.array(0.1), np.array(0.02), np.array(math.nan), np.array(math.nan),
                      False) == 0.02
    assert answer_bound(np.array([0.9]), (0.01, 0.001, 0.003), None, False) < 0.01


def test_the_statistical_bound_shrinks_with_n_where_the_angle_does_not():
    """Four times the rows: the statistical bound falls by ~2 (1 / sqrt(n)), the angle stays; and
    at 8,000 rows the bound is far below the angle."""
    figures = {}
    for n in (2000, 8000):
        exact = _layers(n, 1)
        stored, states = _coded(exact, 3, shard_rows=256)
        figures[n] = _fed(exact, stored, states, [(0, n)], shard_rows=256).finalize()
    for variant in ("biased", "debiased"):
        small, large = (np.array(figures[n][f"bound_{variant}"]) for n in (2000, 8000))
        assert np.all(large < small / 1.5)
        angles_small, angles_large = (np.array(figures[n][f"angle_{variant}"]) for n in (2000, 8000))
        np.testing.assert_allclose(angles_large, angles_small, rtol=0.25)
        assert np.all(large < angles_large / 4)


def test_figures_stored_before_the_statistical_bound_take_their_angles_as_bounds():
    old = {"rows": [10.0], "angle_biased": [0.02], "angle_debiased": [0.03]}
    unrefined = {name: [math.nan] for name in SIDE_TERMS}
    assert completed(old) == {**old, "bound_biased": [0.02], "bound_debiased": [0.03], **unrefined}
    new = {**old, "bound_biased": [1e-3], "bound_debiased": [2e-3]}
    assert completed(new) == {**new, **unrefined}
