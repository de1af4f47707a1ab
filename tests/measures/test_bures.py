"""nbs-score (`actstore.measures.bures`): equal to the Bures fidelity of the centred linear kernels
computed independently (scipy's sqrtm of n x n matrices, float64), streamed in chunks merged out of
order; its invariances and bounds; and served end to end (tests/measures/served.py)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import sqrtm
from scipy.stats import ortho_group

from actstore import measures
from actstore.metrics import similarity as sim
from tests.measures.served import assert_served, client, runs, streamed  # noqa: F401  (fixtures)

NAME = "nbs-score"


def bures_reference(x: np.ndarray, y: np.ndarray) -> float:
    """F(Kx, Ky) = tr (Kx^1/2 Ky Kx^1/2)^1/2 / sqrt(tr Kx tr Ky), K = Xc Xc^T (Harvey et al. 2023)."""
    xc, yc = x - x.mean(axis=0), y - y.mean(axis=0)
    kx, ky = xc @ xc.T, yc @ yc.T
    root = np.real(sqrtm(kx))
    fidelity = np.trace(np.real(sqrtm(root @ ky @ root)))
    return float(fidelity / np.sqrt(np.trace(kx) * np.trace(ky)))


def _pair(seed: int = 0, n: int = 60) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    latent = rng.normal(size=(n, 4))
    return (latent @ rng.normal(size=(4, 9)) + 0.5 * rng.normal(size=(n, 9)) + 2.0,
            np.tanh(latent @ rng.normal(size=(4, 6))) + 0.3 * rng.normal(size=(n, 6)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equals_the_bures_fidelity_of_the_kernels(seed):
    x, y = _pair(seed)
    matrix = streamed(NAME, x, y)
    assert matrix[0, 1] == pytest.approx(bures_reference(x, y), rel=1e-7)
    assert matrix[1, 0] == matrix[0, 1]  # symmetric
    assert matrix[0, 0] == matrix[1, 1] == 1.0
    assert 0.0 <= matrix[0, 1] <= 1.0


def test_is_the_cosine_of_the_procrustes_angle():
    x, y = _pair(3)
    total = sim.MomentMeasures([9, 6])
    total.update([x, y])
    angle = measures.get("procrustes-distance=angular")
    nbs = streamed(NAME, x, y)[0, 1]
    assert np.cos(total.finalize(angle.build({}), [0], [1])[0, 0]) == pytest.approx(nbs, rel=1e-9)


def test_invariances_and_what_it_is_not_invariant_to():
    x, y = _pair(4)
    before = streamed(NAME, x, y)[0, 1]
    rotated = x @ ortho_group.rvs(9, random_state=1)
    assert streamed(NAME, rotated * 3.5 - 7.0, y)[0, 1] == pytest.approx(before, rel=1e-9)  # orthogonal, scale, shift
    stretched = x * np.linspace(0.2, 5.0, 9)  # an anisotropic (invertible, not orthogonal) map changes it
    assert abs(streamed(NAME, stretched, y)[0, 1] - before) > 1e-3


def test_a_constant_layer_is_nan():
    x, _ = _pair(5)
    assert np.isnan(streamed(NAME, x, np.ones((len(x), 3)))[0, 1])


def test_served_end_to_end(client, module_server, runs):  # noqa: F811
    assert_served(client, module_server, runs, NAME, bures_reference)
