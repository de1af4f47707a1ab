"""The device path of the metric accumulators (torch, float64) against the host path (numpy/BLAS)
and against float64 formulas written here.

Every test runs on torch's CPU device, the same code a GPU runs, and again on CUDA where a GPU is
present (skipped otherwise). Agreement is to rounding: both paths form every product in float64.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from actstore.metrics import entropy, lens, similarity
from actstore.metrics._numerics import SymmetricSum, array_ops

DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
    ),
]


def _chunks(rows: int, sizes=(7, 1, 30, 12)):
    bounds = np.cumsum([0, *sizes])
    assert bounds[-1] == rows
    return list(zip(bounds[:-1], bounds[1:]))


@pytest.fixture
def blocks():
    rng = np.random.default_rng(3)
    base = rng.normal(size=(50, 6))
    return [
        (base @ rng.normal(size=(6, 9)) + 4.0).astype(np.float16),
        (base @ rng.normal(size=(6, 5)) + rng.normal(size=(50, 5))).astype(np.float32),
        rng.normal(size=(50, 11)) * 30.0,
    ]


def _reference_cka(x: np.ndarray, y: np.ndarray) -> float:
    xc = x.astype(np.float64) - x.astype(np.float64).mean(0)
    yc = y.astype(np.float64) - y.astype(np.float64).mean(0)
    return np.linalg.norm(yc.T @ xc) ** 2 / (np.linalg.norm(xc.T @ xc) * np.linalg.norm(yc.T @ yc))


@pytest.mark.parametrize("device", DEVICES)
def test_symmetric_sum_on_device_is_the_float64_product_and_pickles_home(device):
    rng = np.random.default_rng(0)
    chunks = [rng.normal(size=(13, 8)).astype(np.float16), rng.normal(size=(5, 8)) * 1e3]
    total = SymmetricSum(8)
    for chunk in chunks:
        total.add(chunk, device)
    restored = pickle.loads(pickle.dumps(total))
    expected = sum(c.astype(np.float64).T @ c.astype(np.float64) for c in chunks)
    assert isinstance(restored.matrix(), np.ndarray)
    np.testing.assert_allclose(restored.matrix(), expected, rtol=1e-13)
    # a restored sum keeps accumulating, on the host or on the device again
    extra = rng.normal(size=(4, 8))
    restored.add(extra)
    restored.add(extra, device)
    np.testing.assert_allclose(restored.matrix(), expected + 2 * extra.T @ extra, rtol=1e-13)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["feature", "gram"])
def test_cka_accumulator_on_device_agrees_with_host_and_formula(blocks, device, mode):
    widths = [b.shape[1] for b in blocks]
    on_device = similarity.SimilarityAccumulator(widths, mode, device=device)
    on_host = similarity.SimilarityAccumulator(widths, mode)
    for start, stop in _chunks(50):
        on_device.update([b[start:stop] for b in blocks])
        on_host.update([b[start:stop] for b in blocks])
    shipped = pickle.loads(pickle.dumps(on_device))  # what a Ray task returns
    result, expected = shipped.finalize(), on_host.finalize()
    np.testing.assert_allclose(result.biased, expected.biased, rtol=1e-12)
    np.testing.assert_allclose(result.debiased, expected.debiased, rtol=1e-11)
    assert result.biased[0, 2] == pytest.approx(_reference_cka(blocks[0], blocks[2]), rel=1e-12)
    assert result.biased[1, 0] == pytest.approx(_reference_cka(blocks[1], blocks[0]), rel=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_device_and_host_partials_merge(blocks, device):
    widths = [b.shape[1] for b in blocks]
    first = similarity.SimilarityAccumulator(widths, device=device)
    first.update([b[:20] for b in blocks])
    second = similarity.SimilarityAccumulator(widths)
    second.update([b[20:] for b in blocks])
    merged = pickle.loads(pickle.dumps(first)).merge(second).finalize()
    whole = similarity.SimilarityAccumulator(widths)
    whole.update(blocks)
    np.testing.assert_allclose(merged.biased, whole.finalize().biased, rtol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_gram_strip_products_on_device(blocks, device):
    rows = np.concatenate([b.astype(np.float32) for b in blocks], axis=1)
    means = rows.astype(np.float64).mean(axis=0)
    widths = [b.shape[1] for b in blocks]
    strips = similarity.gram_strips(len(rows), len(widths), strip_bytes=8 * 3 * 50 * 7)
    assert len(strips) > 1
    result = similarity.gram_strip_products(rows, means, widths, strips, device)
    centred = rows.astype(np.float64) - means
    grams = [centred[:, s:s + w] @ centred[:, s:s + w].T for s, w in zip(np.cumsum([0, *widths[:-1]]), widths)]
    expected = np.array([[np.vdot(k, m) for m in grams] for k in grams])
    np.testing.assert_allclose(result, expected, rtol=1e-12)
    np.testing.assert_allclose(result, similarity.gram_strip_products(rows, means, widths, strips), rtol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_minibatch_cka_on_device(blocks, device):
    x, y = blocks[0].astype(np.float64), blocks[2]
    accumulator = similarity.MinibatchCKAAccumulator([(0, 1)], [x.shape[1], y.shape[1]], device=device)
    for start in range(0, 50, 10):
        accumulator.update([x[start:start + 10], y[start:start + 10]])
    expected = similarity.minibatch_cka(x, y, batch_size=10).value
    assert accumulator.finalize()[0] == pytest.approx(expected, rel=1e-12)
    one_batch = similarity.MinibatchCKAAccumulator([(0, 1)], [x.shape[1], y.shape[1]], device=device)
    one_batch.update([x, y])
    assert one_batch.finalize()[0] == pytest.approx(similarity.linear_cka_debiased(x, y), rel=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_dataset_entropy_on_device(blocks, device):
    z = blocks[2]
    accumulator = entropy.DatasetEntropyAccumulator(z.mean(axis=0), device=device)
    for start, stop in _chunks(50):
        accumulator.update(z[start:stop])
    shipped = pickle.loads(pickle.dumps(accumulator))
    u = (z - z.mean(0)) / np.linalg.norm(z - z.mean(0), axis=1, keepdims=True)
    p = np.linalg.eigvalsh(u.T @ u) / 50
    p = p[p > 1e-12]
    assert shipped.finalize(alpha=1.0) == pytest.approx(-np.sum(p * np.log(p)), rel=1e-10)
    assert shipped.finalize(alpha=2.0) == pytest.approx(entropy.dataset_entropy(z, alpha=2.0), rel=1e-10)


@pytest.mark.parametrize("device", DEVICES)
def test_nc1_on_device(device):
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 4, size=60)
    features = rng.normal(size=(4, 7))[labels] * 3 + rng.normal(size=(60, 7))
    parts = [lens.NC1Accumulator(device=device), lens.NC1Accumulator()]
    for part, (start, stop) in zip([0, 0, 1, 1], _chunks(60, (11, 19, 20, 10))):
        parts[part].update(features[start:stop], labels[start:stop])
    merged = pickle.loads(pickle.dumps(parts[0])).merge(parts[1])
    assert merged.finalize() == pytest.approx(lens.nc1(features, labels), rel=1e-10)
    means = np.array([features[labels == c].mean(0) for c in range(4)])
    within = sum((features[labels == c] - means[c]).T @ (features[labels == c] - means[c]) for c in range(4)) / 60
    between = (means - means.mean(0)).T @ (means - means.mean(0)) / 4
    expected = np.trace(within @ np.linalg.pinv(between, rcond=1e-10, hermitian=True)) / 4
    assert merged.finalize() == pytest.approx(expected, rel=1e-8)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where CUDA is missing")
def test_asking_for_cuda_without_a_gpu_says_so():
    with pytest.raises(RuntimeError, match="no CUDA device"):
        array_ops("cuda")
