"""Outlier diagnostics: streamed per-dimension moments against numpy / scipy, and the summary's
definitions (severity, top dimensions, kurtosis, the outlier rule) on planted massive dimensions."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as scipy_stats

from actstore.metrics.outliers import DimensionMoments, outlier_dimensions, summarise


def planted(n: int = 2000, d: int = 64, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_t(6, size=(n, d))
    x[:, 7] = 3000 + 2 * rng.normal(size=n)  # massive and nearly constant (Sun et al. 2024)
    x[:, 40] = -500 + 5 * rng.normal(size=n)
    return x


def moments_of(blocks_by_chunk, widths) -> DimensionMoments:
    parts = []
    for blocks in blocks_by_chunk:
        part = DimensionMoments(widths)
        part.update(blocks)
        parts.append(part)
    total = parts[-1]
    for part in parts[:-1]:
        total.merge(part)
    return total


@pytest.mark.parametrize("cuts", [[], [1, 2], [300, 1100, 1999]])
def test_streamed_moments_match_numpy_and_scipy(cuts):
    x, y = planted(), np.random.default_rng(1).normal(size=(2000, 5))
    bounds = list(zip([0, *cuts], [*cuts, 2000]))
    stats = moments_of([[x[a:b], y[a:b]] for a, b in bounds], [64, 5]).finalize()
    for block, data in zip(stats, (x, y)):
        assert block.n == 2000
        np.testing.assert_allclose(block.mean, data.mean(0), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(block.std, data.std(0), rtol=1e-9)
        np.testing.assert_allclose(block.excess_kurtosis, scipy_stats.kurtosis(data, axis=0), rtol=1e-7, atol=1e-9)


def test_large_offsets_do_not_cancel():
    rng = np.random.default_rng(2)
    x = 1e6 + rng.normal(size=(5000, 3))  # power sums of x^4 would lose every digit of the kurtosis
    stats = moments_of([[x[:2500]], [x[2500:]]], [3]).finalize()[0]
    np.testing.assert_allclose(stats.excess_kurtosis, scipy_stats.kurtosis(x - 1e6, axis=0), atol=1e-6)


def test_summary_finds_the_massive_dimensions():
    x = planted()
    stats = moments_of([[x]], [64]).finalize()[0]
    summary = summarise(stats, top_k=3)
    mean, std = x.mean(0), x.std(0)
    np.testing.assert_allclose(summary.severity, np.linalg.norm(mean) / np.linalg.norm(std), rtol=1e-9)
    assert summary.severity > 100
    assert summary.top_dims[:2].tolist() == [7, 40]
    np.testing.assert_allclose(summary.top_ratio, np.sort(np.abs(mean) / std)[::-1][:3], rtol=1e-9)
    np.testing.assert_allclose(summary.top_mean[:2], mean[[7, 40]], rtol=1e-12)
    kurtosis = scipy_stats.kurtosis(x, axis=0)
    np.testing.assert_allclose([summary.kurtosis_max, summary.kurtosis_mean], [kurtosis.max(), kurtosis.mean()],
                               rtol=1e-7)
    assert summary.outlier_dims.tolist() == [7, 40]
    assert outlier_dimensions(stats, sigmas=100.0).tolist() == []


def test_constant_and_narrow_layers():
    x = np.ones((10, 4))
    x[:, 1] = np.arange(10)
    stats = moments_of([[x]], [4]).finalize()[0]
    summary = summarise(stats, top_k=3)
    assert summary.top_dims.tolist() == [1, -1, -1] and np.isnan(summary.top_ratio[1:]).all()
    assert np.isnan(stats.excess_kurtosis[0]) and np.isfinite(summary.kurtosis_max)
    with pytest.raises(ValueError, match="no rows were added"):
        DimensionMoments([3]).finalize()
    with pytest.raises(ValueError, match="cannot merge"):
        DimensionMoments([3]).merge(DimensionMoments([4]))
