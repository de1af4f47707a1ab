"""Sample-wise cosine (COS, "Tracing Representation Progression", Jiang et al. 2024, sec. 2.1)
with a Poisson bootstrap of its mean, streamed.

The mean COS of bootstrap replicate r is `sum_i w_ri COS_i / sum_i w_ri` with Poisson(1) weights
`w_ri` that depend only on (seed, r, global row index i) (`resampling.poisson_weights`;
Chamandy et al. 2012), so the accumulator keeps two sums per replicate and pair, merges in any
order, and its memory does not grow with n.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .cosine import BINS, CosineAccumulator, CosineStats
from .resampling import poisson_weights


@dataclass(frozen=True)
class ResampledCosineStats:
    """The sample's COS statistics and the mean COS of each bootstrap replicate, (R, P)."""

    stats: CosineStats
    bootstrap_mean: np.ndarray


class ResampledCosine(CosineAccumulator):
    """`CosineAccumulator` plus `replicates` Poisson-bootstrap replicates of the mean, seeded.
    Call `seek(first_row)` before each chunk's `update` (the chunk's first global row)."""

    def __init__(self, pairs: Sequence[tuple[int, int]], block_widths: Sequence[int],
                 centers: Sequence[np.ndarray | None] | None = None, replicates: int = 0, seed: int = 0,
                 bins: int = BINS) -> None:
        super().__init__(pairs, block_widths, centers, bins)
        if replicates < 0:
            raise ValueError(f"replicates must be >= 0, got {replicates}")
        self.replicates, self.seed = int(replicates), int(seed)
        self._weighted_sum = np.zeros((self.replicates, len(self.pairs)))
        self._weight_total = np.zeros(self.replicates)
        self._next_row = 0

    @staticmethod
    def estimate_nbytes(n_pairs: int, bins: int = BINS, replicates: int = 0) -> int:
        return CosineAccumulator.estimate_nbytes(n_pairs, bins) + 8 * replicates * (n_pairs + 1)

    def seek(self, row: int) -> None:
        """The global index of the next chunk's first row."""
        self._next_row = int(row)

    def _observe(self, cosine: np.ndarray) -> None:
        rows = cosine.shape[1]
        weights = poisson_weights(self.seed, self.replicates, np.arange(self._next_row, self._next_row + rows))
        self._weighted_sum += weights @ cosine.T
        self._weight_total += weights.sum(axis=1)
        self._next_row += rows

    def merge(self, other: ResampledCosine) -> ResampledCosine:
        if (other.replicates, other.seed) != (self.replicates, self.seed):
            raise ValueError("cannot merge cosine bootstraps of different replicates or seeds")
        super().merge(other)
        self._weighted_sum += other._weighted_sum
        self._weight_total += other._weight_total
        return self

    def finalize(self) -> ResampledCosineStats:  # type: ignore[override]
        stats = super().finalize()
        with np.errstate(invalid="ignore", divide="ignore"):  # an empty replicate (no row drawn) is NaN
            means = self._weighted_sum / self._weight_total[:, None]
        return ResampledCosineStats(stats, np.where(self._weight_total[:, None] > 0, means, np.nan))
