"""The error figures of lossy storage (`metrics.rounding.ErrorFigures`) against independent float64
formulas (tests/formulas.py), in any chunking and merge order, numpy and torch alike; the angle is
never below arccos of the true CKA(X, Xhat)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from actstore.metrics.rounding import FIGURES, ROUNDING_ALLOWANCE, ErrorFigures, angle_bound
from actstore.store.format import quantised
from tests.formulas import cka_numpy, debiased_numpy

STATES, ROWS, WIDTH = 3, 300, 12


def _pair(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(exact, stored) (L+1, rows, d): int8 codes per 64-row shard, one layer constant (stored exactly)."""
    rng = np.random.default_rng(seed)
    exact = (rng.standard_normal((STATES, ROWS, WIDTH)) * rng.uniform(0.1, 10, WIDTH) + 5).astype(np.float32)
    exact[2] = 1.5
    stored = np.empty_like(exact)
    for lo in range(0, ROWS, 64):
        codes, state = quantised.quantise(exact[:, lo:lo + 64])
        stored[:, lo:lo + 64] = quantised.decode(codes, state)
    return exact, stored


def _fed(exact, stored, bounds, as_tensors=False) -> ErrorFigures:
    figures = ErrorFigures(STATES, WIDTH)
    for lo, hi in bounds:
        parts = (exact[:, lo:hi], stored[:, lo:hi])
        figures.update(*(torch.from_numpy(p.copy()) for p in parts) if as_tensors else parts)
    return figures


def test_the_figures_are_the_formulas_of_metrics_md():
    exact, stored = _pair()
    figures = _fed(exact, stored, [(0, ROWS)]).finalize()
    assert set(figures) == set(FIGURES)
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
    # the constant layer is stored exactly: no angle
    assert [figures[name][2] for name in ("max_abs", "cka_biased", "angle_biased", "angle_debiased")] == [0, 1, 0, 0]


@pytest.mark.parametrize("as_tensors", [False, True])
def test_any_chunking_and_merge_order_give_the_one_pass_figures(as_tensors):
    exact, stored = _pair(1)
    one = _fed(exact, stored, [(0, ROWS)]).finalize()
    parts = [_fed(exact, stored, [b], as_tensors) for b in [(200, 300), (0, 64), (64, 200)]]
    merged = ErrorFigures(STATES, WIDTH)
    for part in parts:
        merged.merge(part)
    got = merged.finalize()
    for name in FIGURES:  # an angle moves by the cosine's rounding over the angle itself: 1e-15 / 7e-3
        rtol = 1e-9 if name.startswith("angle") else 1e-12
        np.testing.assert_allclose(got[name], one[name], rtol=rtol, atol=1e-13, err_msg=name)


def test_the_angle_is_lowered_by_the_rounding_allowance_of_n_rows():
    assert angle_bound(1.0, 1000) == pytest.approx(math.acos(1 - ROUNDING_ALLOWANCE * 1000))
    assert angle_bound(0.5, 10) > math.acos(0.5)
    assert math.isnan(angle_bound(math.nan, 10))
