"""linear_regression-r2 and -reverse (`actstore.measures.regression`): equal to an independent
least-squares fit (numpy's lstsq on the centred rows, float64, R^2 = 1 - SSE / SST), streamed in
chunks merged out of order; rank-deficient predictors; invariances; and served end to end
(tests/measures/served.py)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import ortho_group

from actstore import measures
from tests.measures.served import assert_served, client, runs, streamed  # noqa: F401  (fixtures)


def r2_reference(x: np.ndarray, y: np.ndarray) -> float:
    """y predicted from x with an intercept by ordinary least squares: 1 - ||resid||^2 / ||y - mean||^2."""
    design = np.hstack([x, np.ones((len(x), 1))])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    residual = y - design @ coef
    return float(1.0 - (residual**2).sum() / ((y - y.mean(axis=0)) ** 2).sum())


def _pair(seed: int = 0, n: int = 70) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    latent = rng.normal(size=(n, 4))
    return (latent @ rng.normal(size=(4, 8)) + 0.6 * rng.normal(size=(n, 8)) - 1.0,
            latent[:, :2] @ rng.normal(size=(2, 5)) + 0.8 * rng.normal(size=(n, 5)) + 4.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equals_least_squares_both_ways(seed):
    x, y = _pair(seed)
    forward, reverse = streamed("linear_regression-r2", x, y), streamed("linear_regression-r2-reverse", x, y)
    assert forward[0, 1] == pytest.approx(r2_reference(x, y), rel=1e-9)  # B (columns) from A (rows)
    assert forward[1, 0] == pytest.approx(r2_reference(y, x), rel=1e-9)
    assert reverse[0, 1] == pytest.approx(r2_reference(y, x), rel=1e-9)  # A from B
    np.testing.assert_allclose(reverse, forward.T, rtol=1e-12)
    assert forward[0, 0] == forward[1, 1] == 1.0
    assert forward[0, 1] != pytest.approx(forward[1, 0], rel=1e-3)  # not symmetric


def test_a_rank_deficient_predictor_uses_the_minimum_norm_fit():
    x, y = _pair(3)
    doubled = np.hstack([x, x[:, :3] * 2.0 - x[:, 3:6]])  # 3 dependent columns: C_aa is singular
    assert streamed("linear_regression-r2", doubled, y)[0, 1] == pytest.approx(r2_reference(x, y), rel=1e-8)


def test_invariances():
    x, y = _pair(4)
    before = streamed("linear_regression-r2", x, y)[0, 1]
    rng = np.random.default_rng(9)
    invertible = rng.normal(size=(8, 8)) + 3 * np.eye(8)
    assert streamed("linear_regression-r2", x @ invertible + 5.0, y)[0, 1] == pytest.approx(before, rel=1e-8)
    target = y @ ortho_group.rvs(5, random_state=2) * 0.3 - 2.0  # orthogonal map, scale, shift of B
    assert streamed("linear_regression-r2", x, target)[0, 1] == pytest.approx(before, rel=1e-8)
    stretched = y * np.linspace(0.1, 4.0, 5)  # an anisotropic map of the target changes the weights
    assert abs(streamed("linear_regression-r2", x, stretched)[0, 1] - before) > 1e-3


def test_a_constant_target_is_nan_and_a_constant_predictor_explains_nothing():
    x, _ = _pair(5)
    constant = np.ones((len(x), 3))
    matrix = streamed("linear_regression-r2", x, constant)
    assert np.isnan(matrix[0, 1]) and matrix[1, 0] == 0.0


def test_too_few_samples_is_one_by_construction_and_noted():
    rng = np.random.default_rng(6)
    x, y = rng.normal(size=(6, 8)), rng.normal(size=(6, 3))  # n - 1 = 5 <= 8: x spans every direction
    assert streamed("linear_regression-r2", x, y)[0, 1] == pytest.approx(1.0, rel=1e-9)
    assert measures.get("linear_regression-r2").whitens({})


@pytest.mark.parametrize("name", ["linear_regression-r2", "linear_regression-r2-reverse"])
def test_served_end_to_end(client, module_server, runs, name):  # noqa: F811
    reference = r2_reference if name == "linear_regression-r2" else (lambda x, y: r2_reference(y, x))
    assert_served(client, module_server, runs, name, reference)
