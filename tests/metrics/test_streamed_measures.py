"""Procrustes, the angular shape metric, CCA, SVCCA and PWCCA from streamed moments: equal to the
independent data-space formulas (tests/measure_formulas.py), equal over any chunking and merge
order, and invariant exactly to the transforms ReSi lists for each (and not to one it does not)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import ortho_group

from actstore import measures
from actstore.errors import InvalidArgument
from actstore.metrics import similarity as sim
from tests.measure_formulas import (
    cca_reference,
    procrustes_reference,
    pwcca_reference,
    shape_metric_reference,
    svcca_reference,
)

REFERENCES = {
    "procrustes-distance=angular": lambda x, y: procrustes_reference(x, y, "angular"),
    "procrustes-distance=euclidean": lambda x, y: procrustes_reference(x, y, "euclidean"),
    "cca-squared_score": lambda x, y: cca_reference(x, y, squared=True),
    "cca-score": lambda x, y: cca_reference(x, y, squared=False),
    "svcca-var=0.99-score": svcca_reference,
    "pwcca-score": pwcca_reference,
}

STREAMED_MEASURES = ("procrustes-distance=angular", "procrustes-distance=euclidean",
                     "shape_metric-alpha={alpha}-distance=angular", "cca-squared_score", "cca-score",
                     "svcca-var=0.99-score", "pwcca-score")  # the measures of this module's references


def moment_measure(name: str, alpha: float = 1.0):
    """The registered measure's computation, alpha given to the one that takes it."""
    spec = measures.get(name)
    return spec.build(spec.resolve({"alpha": alpha} if spec.options else {}))


def _pair(seed: int = 0, n: int = 300, dx: int = 12, dy: int = 9) -> tuple[np.ndarray, np.ndarray]:
    """Related representations with a decaying spectrum (so the 99% cut of SVCCA drops some) and a
    non-zero mean."""
    rng = np.random.default_rng(seed)
    latent = rng.normal(size=(n, 6))
    x = latent @ rng.normal(size=(6, dx)) + 0.3 * rng.normal(size=(n, dx)) * np.geomspace(1, 0.01, dx) + 5.0
    y = np.tanh(latent @ rng.normal(size=(6, dy))) + 0.2 * rng.normal(size=(n, dy)) - 2.0
    return x, y


def _streamed(x: np.ndarray, y: np.ndarray, name: str, alpha: float = 1.0, chunks: int = 5) -> float:
    """The measure between block 0 (x) and block 1 (y), streamed in chunks merged out of order."""
    parts = []
    for rows in np.array_split(np.arange(len(x)), chunks):
        part = sim.MomentMeasures([x.shape[1], y.shape[1]])
        part.update([x[rows], y[rows]])
        parts.append(part)
    total = parts[-1]
    for part in reversed(parts[:-1]):
        total.merge(part)
    return float(total.finalize(moment_measure(name, alpha), [0], [1])[0, 0])


@pytest.mark.parametrize("name", list(REFERENCES))
def test_streamed_measure_equals_the_data_space_formula(name):
    x, y = _pair()
    expected = REFERENCES[name](x, y)
    assert _streamed(x, y, name) == pytest.approx(expected, rel=1e-9, abs=1e-9)
    # the one-pass helpers agree too
    if name.startswith("procrustes"):
        assert sim.procrustes_distance(x, y, name.split("=")[1]) == pytest.approx(expected, rel=1e-9)
    else:
        assert sim.cca_similarity(x, y, name) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("alpha", [0.0, 0.3, 1.0])
def test_shape_metric_equals_explicit_partial_whitening(alpha):
    x, y = _pair(1)
    expected = shape_metric_reference(x, y, alpha)
    assert _streamed(x, y, "shape_metric-alpha={alpha}-distance=angular", alpha) == pytest.approx(expected, rel=1e-8)
    assert sim.shape_metric(x, y, alpha) == pytest.approx(expected, rel=1e-8)


def test_shape_metric_ends_are_procrustes_and_cca():
    x, y = _pair(2, dx=8, dy=8)
    assert sim.shape_metric(x, y, 1.0) == pytest.approx(sim.procrustes_distance(x, y, "angular"), rel=1e-12)
    # alpha = 0 whitens fully: the cosine is the mean canonical correlation (equal widths)
    assert np.cos(sim.shape_metric(x, y, 0.0)) == pytest.approx(cca_reference(x, y, squared=False), rel=1e-9)


def test_the_identifier_fills_in_the_parameters():
    shape = measures.get("shape_metric-alpha={alpha}-distance=angular")
    assert shape.filled(shape.resolve({"alpha": 0.5})) == "shape_metric-alpha=0.5-distance=angular"
    assert measures.get("cca-squared_score").filled({}) == "cca-squared_score"
    with pytest.raises(InvalidArgument, match="not one of"):
        moment_measure("cka-score")


def _orthogonal(d: int, seed: int) -> np.ndarray:
    return ortho_group.rvs(d, random_state=seed)


# which transforms leave each measure unchanged (ReSi, Klabunde et al. 2023, table 1)
TRANSFORMS = {
    "translation": lambda m, seed: m + np.random.default_rng(seed).normal(size=m.shape[1]) * 10,
    "isotropic scaling": lambda m, seed: m * (3.0 + seed),
    "orthogonal": lambda m, seed: m @ _orthogonal(m.shape[1], seed),
    "invertible linear": lambda m, seed: m @ (np.eye(m.shape[1]) + np.random.default_rng(seed).normal(
        size=(m.shape[1], m.shape[1]))),
}
INVARIANT = {
    "procrustes-distance=angular": {"translation", "isotropic scaling", "orthogonal"},
    "procrustes-distance=euclidean": {"translation", "orthogonal"},
    # alpha = 0.5: netrep's partial whitening of the unnormalised Xc^T Xc depends on the scale
    "shape_metric-alpha={alpha}-distance=angular": {"translation", "orthogonal"},
    "cca-squared_score": set(TRANSFORMS),
    "cca-score": set(TRANSFORMS),
    "svcca-var=0.99-score": {"translation", "isotropic scaling", "orthogonal"},
    "pwcca-score": {"translation", "isotropic scaling"},
}


@pytest.mark.parametrize("name", list(INVARIANT))
@pytest.mark.parametrize("transform", list(TRANSFORMS))
def test_invariances(name, transform):
    x, y = _pair(3)
    alpha = 0.5
    before = _streamed(x, y, name, alpha)
    after = _streamed(TRANSFORMS[transform](x, 1), TRANSFORMS[transform](y, 2), name, alpha)
    if transform in INVARIANT[name]:
        assert after == pytest.approx(before, rel=1e-7, abs=1e-9)
    else:  # the table says it is not invariant: this data shows a change
        assert abs(after - before) > 1e-4


def test_fully_whitened_shape_metric_is_invariant_to_invertible_linear_maps():
    x, y = _pair(4)
    a, b = TRANSFORMS["invertible linear"](x, 5), TRANSFORMS["invertible linear"](y, 6)
    name = "shape_metric-alpha={alpha}-distance=angular"
    assert _streamed(a, b, name, 0.0) == pytest.approx(_streamed(x, y, name, 0.0), rel=1e-7)


def test_matrix_over_blocks_symmetry_and_diagonal():
    x, y = _pair(5)
    z = x[:, :5] * 2 + 1
    total = sim.MomentMeasures([12, 9, 5])
    total.update([x, y, z])
    for name in STREAMED_MEASURES:
        measure = moment_measure(name, 0.5)
        matrix = total.finalize(measure, [0, 1, 2], [0, 1, 2])
        assert np.allclose(np.diag(matrix), 0.0 if measure.distance else 1.0)
        if measure.symmetric:
            assert np.array_equal(matrix, matrix.T)
        # a sub-selection is the same numbers
        assert np.allclose(total.finalize(measure, [2, 0], [1]), matrix[[2, 0]][:, [1]], rtol=1e-12, atol=0)
    pwcca = total.finalize(moment_measure("pwcca-score"), [0, 1], [0, 1])
    assert pwcca[0, 1] == pytest.approx(pwcca_reference(x, y), rel=1e-9)
    assert pwcca[1, 0] == pytest.approx(pwcca_reference(y, x), rel=1e-9)


def test_a_constant_block_gives_nan_and_too_few_rows_are_refused():
    x, _ = _pair(6)
    total = sim.MomentMeasures([12, 3])
    total.update([x, np.ones((len(x), 3))])
    for name in STREAMED_MEASURES:
        if name != "procrustes-distance=euclidean":
            assert np.isnan(total.finalize(moment_measure(name), [0], [1])[0, 0]), name
    small = sim.MomentMeasures([2, 2])
    small.update([np.eye(3)[:, :2], np.eye(3)[:, 1:]])
    with pytest.raises(ValueError, match="n >= 4"):
        small.finalize(moment_measure("cca-score"), [0], [1])


def test_float16_chunks_and_the_device_path_agree():
    x, y = _pair(7)
    x16, y16 = x.astype(np.float16), y.astype(np.float16)
    host = sim.MomentMeasures([12, 9])
    host.update([x16, y16])
    device = sim.MomentMeasures([12, 9], device="cpu")  # torch's code path, on the CPU
    device.update([x16, y16])
    for name in STREAMED_MEASURES:
        measure = moment_measure(name, 0.5)
        expected = REFERENCES.get(name, lambda a, b: shape_metric_reference(a, b, 0.5))(
            x16.astype(np.float64), y16.astype(np.float64))
        assert host.finalize(measure, [0], [1])[0, 0] == pytest.approx(expected, rel=1e-8)
        assert device.finalize(measure, [0], [1])[0, 0] == pytest.approx(expected, rel=1e-8)
