"""Preset "skean2025" against a line-by-line port of the Layer by Layer reference code
(OFSkean/information_flow a6ad5086, experiments/utils/misc/metric_utils.py and repitl's
matrixAlphaEntropy), written here in torch float64 with its loops, never with actstore's functions."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from actstore.metrics.entropy import PromptEntropyAccumulator
from actstore.metrics.entropy_presets import (
    ReferenceCurvatureAccumulator,
    ReferenceDatasetEntropyAccumulator,
    reference_curvature,
    reference_dataset_entropy,
)


# ---- the port --------------------------------------------------------------------------------
def port_normalize(r: torch.Tensor) -> torch.Tensor:  # their `normalize` (Matrix-Entropy)
    r = r - r.mean(dim=0)
    return r / torch.norm(r, p=2, dim=1, keepdim=True)


def port_matrix_alpha_entropy(k: torch.Tensor) -> float:  # repitl, alpha = 1 (Shannon limit)
    ek = torch.linalg.eigvalsh(k)
    mek = ek[ek > 0]
    mek = mek / mek.sum()
    return float(-(mek * torch.log(mek)).sum())


def port_compute_entropy(hidden: torch.Tensor) -> float:  # compute_entropy, one layer, maxEntropy
    n, d = hidden.shape
    cov = hidden.T @ hidden if n > d else hidden @ hidden.T
    cov = torch.clamp(cov, min=0)
    return port_matrix_alpha_entropy(cov) / min(math.log(n), math.log(d))


def port_dataset_entropy(prompts: list[np.ndarray]) -> float:  # compute_on_concatenated_passes
    pooled = torch.stack([port_normalize(torch.tensor(p, dtype=torch.float64)).mean(dim=0) for p in prompts])
    return port_compute_entropy(pooled)


def port_prompt_entropy(prompts: list[np.ndarray]) -> float:  # compute_per_forward_pass
    return float(np.mean([port_compute_entropy(port_normalize(torch.tensor(p, dtype=torch.float64)))
                          for p in prompts]))


def port_curvature(prompts: list[np.ndarray]) -> float:  # compute_curvature, k = 1
    values = []
    for p in prompts:
        layer = port_normalize(torch.tensor(p, dtype=torch.float64))
        total = 0.0
        for i in range(layer.shape[0] - 1):
            # clamped: the reference takes arccos of the raw product, which is NaN where rounding puts the
            # cosine of two (anti)parallel tokens past +-1 (seen on a two-token prompt); the preset clips
            # there (documented), and the port does the same so the two agree where the reference is defined
            total += torch.arccos((layer[i].unsqueeze(1).T @ layer[i + 1].unsqueeze(1)).clamp(-1, 1)).item()
        values.append(total / (layer.shape[0] - 1))
    return float(np.mean(values))


# ---- data --------------------------------------------------------------------------------------
def prompts_and_offsets(n_prompts: int, d: int, seed: int, shortest: int = 2):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(shortest, 9, size=n_prompts)
    shift = rng.normal(size=d)  # a common offset: pooled vectors are not centred by the preset
    prompts = [rng.normal(size=(k, d)) + shift for k in lengths]
    return prompts, np.concatenate([[0], np.cumsum(lengths)]), np.concatenate(prompts)


@pytest.mark.parametrize("n_prompts,d", [(40, 6), (5, 12), (12, 12)])  # n > d, n < d, n = d
def test_dataset_entropy_matches_port(n_prompts, d):
    prompts, offsets, tokens = prompts_and_offsets(n_prompts, d, seed=n_prompts + d)
    assert reference_dataset_entropy(tokens, offsets) == pytest.approx(port_dataset_entropy(prompts), rel=1e-10)


def test_dataset_entropy_streams_in_any_chunking_and_order():
    prompts, offsets, tokens = prompts_and_offsets(30, 8, seed=3)  # crosses n = d while merging
    expected = port_dataset_entropy(prompts)
    parts = []
    for lo, hi in [(20, 30), (0, 5), (5, 20)]:
        local = offsets[lo:hi + 1] - offsets[lo]
        parts.append(ReferenceDatasetEntropyAccumulator(8).update(tokens[offsets[lo]:offsets[hi]], local))
    total = parts[0].merge(parts[1]).merge(parts[2])
    assert total.n == 30
    assert total.finalize() == pytest.approx(expected, rel=1e-10)
    # few prompts: the kept pooled rows give the n x n Gram after a merge too
    small = [ReferenceDatasetEntropyAccumulator(8).update(tokens[offsets[a]:offsets[b]], offsets[a:b + 1] - offsets[a])
             for a, b in [(3, 6), (0, 3)]]
    assert small[0].merge(small[1]).finalize() == pytest.approx(port_dataset_entropy(prompts[:6]), rel=1e-10)


def test_dataset_entropy_differs_from_the_metrics_md_definition():
    """The preset is a different pipeline: no set-level centring, so a shifted set changes it."""
    prompts, offsets, tokens = prompts_and_offsets(30, 6, seed=5)
    from actstore.metrics.entropy import dataset_entropy

    pooled = np.stack([p.mean(0) for p in prompts])
    assert abs(reference_dataset_entropy(tokens, offsets)
               - dataset_entropy(pooled, normalization="maxEntropy", clamp=True)) > 1e-3


def test_prompt_entropy_preset_options_match_port():
    prompts, offsets, tokens = prompts_and_offsets(15, 5, seed=9)
    value = PromptEntropyAccumulator(1.0, "maxEntropy", True).update(tokens, offsets).finalize()
    assert value == pytest.approx(port_prompt_entropy(prompts), rel=1e-10)


def test_curvature_matches_port_and_has_no_abs():
    # 3+ tokens: two centred tokens are exactly opposite, where arccos magnifies rounding to ~1e-8
    prompts, offsets, tokens = prompts_and_offsets(20, 7, seed=2, shortest=3)
    assert reference_curvature(tokens, offsets) == pytest.approx(port_curvature(prompts), rel=1e-10)
    # two tokens: after centring they point in opposite directions, an angle of pi (|cos| would give 0)
    two = np.array([[1.0, 2.0, 0.0], [3.0, -1.0, 5.0]])
    assert reference_curvature(two, np.array([0, 2])) == pytest.approx(np.pi, abs=1e-7)


def test_short_prompts_are_skipped_and_counted():
    tokens = np.random.default_rng(0).normal(size=(7, 4))
    offsets = np.array([0, 1, 4, 7])
    acc = ReferenceCurvatureAccumulator().update(tokens, offsets)
    assert acc.count == 2 and acc.skipped == 1
    dataset = ReferenceDatasetEntropyAccumulator(4).update(tokens, offsets)
    assert dataset.n == 2 and dataset.skipped == 1
    with pytest.raises(ValueError, match="at least 2 prompts"):
        ReferenceDatasetEntropyAccumulator(4).update(tokens[:4], np.array([0, 1, 4])).finalize()
