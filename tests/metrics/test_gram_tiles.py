"""Gram-space CKA summed over rectangles of the sample space (`similarity.gram_tiles`): against the
explicit float64 formulas of tests/formulas.py, whatever the tiling, piece height and chunk order."""

from __future__ import annotations

import numpy as np
import pytest

from actstore.metrics.similarity.gram_tiles import ColumnMeans, cka_from_gram_sums, rectangle_products
from tests.formulas import cka_numpy, debiased_numpy

WIDTHS = [3, 5, 4]


def blocks(n: int, seed: int = 0) -> list[np.ndarray]:
    """float16 blocks with large means (the centring must be exact) and one low-rank block."""
    rng = np.random.default_rng(seed)
    out = [(rng.normal(size=(n, w)) + rng.normal(scale=20, size=w)).astype(np.float16) for w in WIDTHS]
    out[2] = (out[0][:, :1] * rng.normal(size=(1, WIDTHS[2]))).astype(np.float16)
    return out


def tiled(xs: list[np.ndarray], bounds: list[int], piece_rows: int, means) -> tuple[np.ndarray, np.ndarray]:
    n = len(xs[0])
    cross, diagonals = np.zeros((len(xs), len(xs))), np.full((len(xs), n), np.nan)
    panels = list(zip(bounds[:-1], bounds[1:]))
    for i, (r0, r1) in reversed(list(enumerate(panels))):  # any order
        rows = [x[r0:r1] for x in xs]
        square, diagonals[:, r0:r1] = rectangle_products(rows, None, means, piece_rows)
        cross += square
        for c0, c1 in panels[i + 1:]:
            cross += 2 * rectangle_products(rows, [x[c0:c1] for x in xs], means, piece_rows)[0]
    return cross, diagonals


@pytest.mark.parametrize("bounds,piece_rows", [([0, 50], 50), ([0, 16, 32, 48, 50], 5), ([0, 7, 50], 3)])
def test_tiles_equal_the_explicit_formulas(bounds, piece_rows):
    xs = blocks(50)
    means = ColumnMeans(WIDTHS)
    for first in range(0, 50, 20):
        part = ColumnMeans(WIDTHS)
        part.update([x[first:first + 20] for x in xs])
        means.merge(part)
    cross, diagonals = tiled(xs, bounds, piece_rows, means.finalize())
    assert not np.isnan(diagonals).any()
    biased, debiased = cka_from_gram_sums(cross, diagonals, 50)
    wide = [x.astype(np.float64) for x in xs]
    np.testing.assert_allclose(biased, [[cka_numpy(a, b) for b in wide] for a in wide], rtol=0, atol=1e-12)
    np.testing.assert_allclose(debiased, [[debiased_numpy(a, b) for b in wide] for a in wide], rtol=0, atol=1e-9)


def test_rectangle_is_the_frobenius_product_of_gram_parts():
    xs = blocks(30, seed=3)
    means = [x.astype(np.float64).mean(axis=0) for x in xs]
    grams = [(x - m) @ (x - m).T for x, m in zip((x.astype(np.float64) for x in xs), means)]
    got, diagonal = rectangle_products([x[4:11] for x in xs], [x[20:30] for x in xs], means, piece_rows=2)
    assert diagonal is None
    want = [[np.sum(a[4:11, 20:30] * b[4:11, 20:30]) for b in grams] for a in grams]
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_invariant_to_isotropic_scaling_and_orthogonal_transform():
    xs = blocks(40, seed=5)
    rotation = np.linalg.qr(np.random.default_rng(1).normal(size=(5, 5)))[0]
    moved = [xs[0], (xs[1].astype(np.float64) @ rotation * 3.0), xs[2]]
    results = []
    for group in (xs, moved):
        means = [x.astype(np.float64).mean(axis=0) for x in group]
        results.append(cka_from_gram_sums(*tiled(group, [0, 13, 40], 4, means), 40))
    np.testing.assert_allclose(results[0][0], results[1][0], atol=1e-10)
    np.testing.assert_allclose(results[0][1], results[1][1], atol=1e-10)


def test_debiased_is_nan_below_four_samples():
    xs = [x[:3] for x in blocks(3)]
    means = [x.astype(np.float64).mean(axis=0) for x in xs]
    biased, debiased = cka_from_gram_sums(*tiled(xs, [0, 3], 3, means), 3)
    assert np.isnan(debiased).all() and np.allclose(np.diag(biased), 1.0)
