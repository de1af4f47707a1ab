"""Reference-pipeline presets: the matrix-entropy family as a published codebase computes it.

Preset "skean2025" reproduces the reference code of "Layer by Layer" (Skean et al. 2025;
OFSkean/information_flow, snapshot a6ad5086, experiments/utils/misc/metric_utils.py) from the
token rows of a token-level run. METRICS.md, "The reference pipeline", lists how it differs from
the definitions in `metrics.entropy`:

- every prompt's token matrix is first normalised over the prompt's own tokens
  (`normalize`: subtract the prompt's mean token, L2-normalise each token);
- dataset entropy mean-pools those normalised tokens per prompt (P, n x d), does NOT normalise the
  pooled set again, forms `P^T P` when n > d else `P P^T`, clamps it elementwise at 0, takes the
  Shannon entropy (alpha = 1) of its positive eigenvalues / their sum, and divides by
  `min(log n, log d)`;
- prompt entropy is `metrics.entropy.matrix_entropy` with clamp on and that normalisation, per
  prompt (their per-forward-pass path), averaged over prompts;
- curvature is the mean over consecutive pairs of `arccos(<u_k, u_{k+1}>)` between the prompt's
  normalised token vectors u (k = 1), no absolute value, averaged over prompts.

Prompts with fewer than 2 tokens are skipped and counted (the reference code has no value for
them: normalising one token divides 0 by 0). A cosine rounded past 1 is clipped before arccos.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Self

import numpy as np

from ._numerics import SymmetricSum, as_float64_matrix
from .entropy import Normalization, _normalized, _PromptMean, gram_entropy, normalize_rows

PRESETS = ("none", "skean2025")

# what the preset fixes; a request asking for something else is refused
SKEAN2025 = {"alpha": 1.0, "normalization": "maxEntropy", "clamp": True, "abs_cos": False}
SKEAN2025_METRICS = ("dataset_entropy", "prompt_entropy", "curvature")  # the metrics the preset covers


def reference_pooled(tokens: np.ndarray) -> np.ndarray:
    """The reference code's per-prompt vector: the mean of `normalize(prompt tokens)` (d,)."""
    return normalize_rows(tokens).mean(axis=0)


def reference_curvature_of_prompt(tokens: np.ndarray) -> float:
    """Mean angle `arccos(<u_k, u_{k+1}>)` between consecutive rows of `normalize(tokens)`."""
    u = normalize_rows(tokens)
    cos = np.einsum("ij,ij->i", u[:-1], u[1:])
    return float(np.mean(np.arccos(np.clip(cos, -1.0, 1.0))))


class ReferenceCurvatureAccumulator(_PromptMean):
    """Streaming preset curvature: sum and count of per-prompt mean angles between consecutive
    normalised tokens; prompts with < 2 tokens are skipped and counted."""

    min_tokens = 2

    def _value(self, tokens: np.ndarray) -> float:
        return reference_curvature_of_prompt(tokens)


class ReferenceDatasetEntropyAccumulator:
    """Streaming preset dataset entropy over whole prompts (chunks as in `_PromptMean.update`).

    Keeps `sum_i p_i p_i^T` (d x d, float64) of the pooled prompt vectors p_i, and the vectors
    themselves while there are at most d of them (for n <= d the clamped matrix is the n x n
    `P P^T`, which the d x d sum cannot give): memory stays O(d^2) whatever n is. Prompts may
    arrive in any order (the spectrum does not depend on the row order); accumulators merge.
    """

    def __init__(self, width: int) -> None:
        self.width = int(width)
        self.n = 0
        self.skipped = 0
        self._scatter = SymmetricSum(self.width)
        self._rows: list[np.ndarray] | None = []

    def _keep(self, rows: list[np.ndarray] | None) -> None:
        """Add `rows` to the kept vectors (after `n` counts them), or stop keeping past d rows."""
        if self._rows is None or rows is None or self.n > self.width:
            self._rows = None
        else:
            self._rows.extend(rows)

    def update(self, tokens: np.ndarray, offsets: np.ndarray) -> Self:
        x = as_float64_matrix(tokens, "tokens")
        if x.shape[1] != self.width:
            raise ValueError(f"tokens have {x.shape[1]} features, the accumulator {self.width}")
        pooled = []
        for start, stop in pairwise(np.asarray(offsets).tolist()):
            if stop - start < 2:
                self.skipped += 1
            else:
                pooled.append(reference_pooled(x[start:stop]))
        if pooled:
            self._scatter.add(np.stack(pooled))
            self.n += len(pooled)
            self._keep(pooled)
        return self

    def merge(self, other: ReferenceDatasetEntropyAccumulator) -> Self:
        if other.width != self.width:
            raise ValueError("can only merge preset dataset-entropy accumulators of the same width")
        self._scatter.merge(other._scatter)
        self.n += other.n
        self.skipped += other.skipped
        self._keep(other._rows)
        return self

    def finalize(self, alpha: float = 1.0, normalization: Normalization = "maxEntropy") -> float:
        if self.n < 2:
            raise ValueError(f"preset dataset entropy needs at least 2 prompts of >= 2 tokens, got {self.n}")
        if self.n > self.width:
            matrix = self._scatter.matrix()
        else:
            pooled = np.stack(self._rows)
            matrix = pooled @ pooled.T
        entropy = gram_entropy(np.maximum(matrix, 0.0), alpha)
        return _normalized(entropy, normalization, self.n, self.width)


def reference_dataset_entropy(tokens: np.ndarray, offsets: np.ndarray) -> float:
    """Preset dataset entropy of whole prompts in one call (`ReferenceDatasetEntropyAccumulator`)."""
    return ReferenceDatasetEntropyAccumulator(np.shape(tokens)[1]).update(tokens, offsets).finalize(
        SKEAN2025["alpha"], SKEAN2025["normalization"])


def reference_curvature(tokens: np.ndarray, offsets: np.ndarray) -> float:
    """Preset curvature of whole prompts in one call (`ReferenceCurvatureAccumulator`)."""
    return ReferenceCurvatureAccumulator().update(tokens, offsets).finalize()
