"""`SymmetricSum`'s one-triangle BLAS operations and the feature-space moments built on them,
against full float64 matrices formed here with numpy."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from actstore.metrics._numerics import SymmetricSum
from actstore.metrics.similarity import SimilarityAccumulator
from tests.formulas import cka_numpy


def _summed(rows: list[np.ndarray], size: int) -> SymmetricSum:
    total = SymmetricSum(size)
    for chunk in rows:
        total.add(chunk)
    return total


def _read_only(state):
    """A pickled round trip whose arrays cannot be written, as Ray's object store hands them over."""
    restored = pickle.loads(pickle.dumps(state))
    for value in vars(restored).values():
        if isinstance(value, np.ndarray):
            value.flags.writeable = False
    return restored


@pytest.fixture
def chunks():
    rng = np.random.default_rng(5)
    return [rng.normal(size=(rows, 12)) * rng.uniform(0.1, 10, size=12) for rows in (9, 4, 20)]


def test_rank2_update_times_and_block_squares_match_the_full_matrix(chunks):
    rng = np.random.default_rng(6)
    total = _summed(chunks, 12)
    full = sum(c.T @ c for c in chunks)
    x, y = rng.normal(size=12), rng.normal(size=12)
    total.add_rank2(x, y)
    full += np.outer(x, y) + np.outer(y, x)
    probe = rng.normal(size=(12, 3))
    np.testing.assert_allclose(total.times(probe), full @ probe, rtol=1e-12)
    widths = (5, 3, 4)
    edges = np.concatenate(([0], np.cumsum(widths)))
    expected = [[np.sum(full[edges[a]:edges[a + 1], edges[b]:edges[b + 1]] ** 2) for b in range(3)]
                for a in range(3)]
    np.testing.assert_allclose(total.block_square_sums(widths), expected, rtol=1e-12)
    np.testing.assert_allclose(total.matrix(), full, rtol=1e-12)


def test_a_read_only_upper_triangle_state_merges_and_mirrors(chunks):
    first, second = _summed(chunks[:1], 12), _read_only(_summed(chunks[1:], 12))
    first.merge(second)
    np.testing.assert_allclose(first.matrix(), sum(c.T @ c for c in chunks), rtol=1e-12)
    alone = _read_only(_summed(chunks, 12))
    np.testing.assert_allclose(alone.matrix(), sum(c.T @ c for c in chunks), rtol=1e-12)


def test_moments_of_one_shift_merge_without_a_move_and_of_two_shifts_with_one():
    """Two partial states sharing their first chunk share its shift (the move is skipped); a third
    started elsewhere is moved. Every merge order gives the one-pass CKA."""
    rng = np.random.default_rng(7)
    x = (rng.normal(size=(60, 6)) * 3 + 50).astype(np.float16)
    y = (x.astype(np.float64) @ rng.normal(size=(6, 4)) + rng.normal(size=(60, 4))).astype(np.float32)
    parts = [(0, 10), (10, 35), (35, 60)]

    def partial(first: tuple[int, int], *more: tuple[int, int]) -> SimilarityAccumulator:
        acc = SimilarityAccumulator([6, 4])
        for start, stop in (first, *more):
            acc.update([x[start:stop], y[start:stop]])
        return acc

    shared = partial(parts[0], parts[1])
    assert np.array_equal(shared._state.shift, partial(parts[0])._state.shift)
    other = _read_only(partial(parts[2]))
    merged = shared.merge(other)
    expected = cka_numpy(x.astype(np.float64), y.astype(np.float64))
    assert merged.finalize().biased[0, 1] == pytest.approx(expected, rel=1e-12)
    double = partial(parts[0]).merge(partial(parts[0]))
    doubled_rows = np.concatenate([x[:10], x[:10]]).astype(np.float64), np.concatenate([y[:10], y[:10]])
    assert double.finalize().biased[0, 1] == pytest.approx(cka_numpy(*doubled_rows), rel=1e-12)
