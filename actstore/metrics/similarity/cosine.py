"""Sample-wise cosine similarity, COS ("Tracing Representation Progression", Jiang et al. 2024,
sec. 2.1), one-pass and streamed per block pair.

`COS_i(l, l') = <h_i^l, h_i^l'> / (||h_i^l|| ||h_i^l'||)`, reported as the mean over samples plus
the distribution (quantiles at `QUANTILE_LEVELS`) for box plots. Option `center` is "global-mean"
(the default, as the paper's footnote says: subtract each layer's mean over all samples) or
"none". The widths must match: COS is for layers of one model, or of models of equal width. Unlike
CKA it is not invariant to a rotation of either side (METRICS.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from .._numerics import column_centered
from .inputs import paired, validated_blocks, validated_widths
from .stats import histogram_quantiles


def _require_equal_widths(width_a: int, width_b: int) -> None:
    if width_a != width_b:
        raise ValueError(
            f"sample-wise cosine needs equal widths, got {width_a} and {width_b}: COS compares "
            "layers of one model or of models of equal width"
        )


def _rowwise_cosine(hx: np.ndarray, hy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`<hx_i, hy_i> / (||hx_i|| ||hy_i||)` per row, 0 where a norm is 0; and the zero-norm mask."""
    dots = np.einsum("ij,ij->i", hx, hy)
    norm_products = np.sqrt(np.einsum("ij,ij->i", hx, hx)) * np.sqrt(np.einsum("ij,ij->i", hy, hy))
    zero_norm = norm_products == 0
    cosine = np.where(zero_norm, 0.0, dots / np.where(zero_norm, 1.0, norm_products))
    # Rounding can push |cos| a few ulps past 1.
    return np.clip(cosine, -1.0, 1.0), zero_norm


def samplewise_cosine(
    x: np.ndarray, y: np.ndarray, center: Literal["global-mean", "none"] = "global-mean"
) -> np.ndarray:
    """Sample-wise cosine similarity ("Tracing Representation Progression", sec. 2.1), shape (n,).

    `COS_i(l, l') = <h_i^l, h_i^l'> / (||h_i^l|| ||h_i^l'||)`. `center="global-mean"` (the paper's
    footnote) first subtracts each side's mean over all samples; "none" does not. A zero-norm
    row gives 0. The widths must match.
    """
    xs, ys = paired(x, y)
    _require_equal_widths(xs.shape[1], ys.shape[1])
    if center == "global-mean":
        xs, ys = column_centered(xs), column_centered(ys)
    elif center != "none":
        raise ValueError(f"center must be 'global-mean' or 'none', got {center!r}")
    return _rowwise_cosine(xs, ys)[0]


@dataclass(frozen=True)
class CosineStats:
    """Sample-wise cosine per block pair: `mean` (P,), `quantiles` (P, len(QUANTILE_LEVELS)).

    `zero_norm` (P,) counts the samples where either side had norm 0 (their cosine counts as 0).
    """

    mean: np.ndarray
    quantiles: np.ndarray
    n: int
    zero_norm: np.ndarray


BINS = 4000


class CosineAccumulator:
    """Streaming sample-wise cosine ("Tracing Representation Progression", sec. 2.1) per block pair.

    `COS_i(l, l') = <h_i^l, h_i^l'> / (||h_i^l|| ||h_i^l'||)` for each pair (i, j) of blocks of
    equal width. `centers[b]` is block b's global mean, subtracted first ("global-mean"
    centering, METRICS.md's default, which the caller computes beforehand) or None ("none");
    `centers=None` means no centering for any block. Memory is independent of n: a histogram of
    `bins` bins over [-1, 1] per pair plus exact sum, min and max, so the quantiles are within
    2/bins of np.quantile's and the min and max are exact.
    """

    def __init__(
        self,
        pairs: Sequence[tuple[int, int]],
        block_widths: Sequence[int],
        centers: Sequence[np.ndarray | None] | None = None,
        bins: int = BINS,
    ) -> None:
        self.block_widths = validated_widths(block_widths)
        self.pairs = tuple((int(first), int(second)) for first, second in pairs)
        if not self.pairs:
            raise ValueError("pairs must name at least one (block, block) pair")
        for first, second in self.pairs:
            if not (0 <= first < len(self.block_widths) and 0 <= second < len(self.block_widths)):
                raise ValueError(
                    f"pair ({first}, {second}) names a block outside "
                    f"0..{len(self.block_widths) - 1}"
                )
            _require_equal_widths(self.block_widths[first], self.block_widths[second])
        self.centers = self._validated_centers(centers)
        if bins < 1:
            raise ValueError(f"bins must be >= 1, got {bins}")
        self.bins = int(bins)
        n_pairs = len(self.pairs)
        self._n = 0
        self._counts = np.zeros((n_pairs, self.bins), dtype=np.int64)
        self._sum = np.zeros(n_pairs)
        self._min = np.full(n_pairs, np.inf)
        self._max = np.full(n_pairs, -np.inf)
        self._zero_norm = np.zeros(n_pairs, dtype=np.int64)

    @staticmethod
    def estimate_nbytes(n_pairs: int, bins: int = BINS) -> int:
        """Bytes one accumulator holds for `n_pairs` pairs: the int64 histograms and five per-pair
        statistics (the centers and the rows read are small beside them)."""
        return 8 * n_pairs * (bins + 5)

    def _validated_centers(
        self, centers: Sequence[np.ndarray | None] | None
    ) -> tuple[np.ndarray | None, ...]:
        if centers is None:
            return (None,) * len(self.block_widths)
        if len(centers) != len(self.block_widths):
            raise ValueError(f"expected {len(self.block_widths)} centers, got {len(centers)}")
        validated = []
        for block, (center, width) in enumerate(zip(centers, self.block_widths)):
            if center is not None:
                center = np.asarray(center, dtype=np.float64)
                if center.shape != (width,):
                    raise ValueError(
                        f"centers[{block}] has shape {center.shape}, expected ({width},)"
                    )
            validated.append(center)
        return tuple(validated)

    @property
    def n(self) -> int:
        """Rows seen so far."""
        return self._n

    def update(self, blocks: Sequence[np.ndarray]) -> None:
        """Add one chunk: `blocks[b]` has shape (rows, block_widths[b]), rows = the same samples."""
        matrices = validated_blocks(blocks, self.block_widths)
        if not len(matrices[0]):
            return
        used = {block for pair in self.pairs for block in pair}
        centred = {
            block: matrices[block] - (0.0 if self.centers[block] is None else self.centers[block])
            for block in used
        }
        per_pair = [_rowwise_cosine(centred[i], centred[j]) for i, j in self.pairs]
        cosine = np.stack([pair_cosine for pair_cosine, _ in per_pair])  # (P, rows)
        bin_index = np.clip(np.floor((cosine + 1.0) * (self.bins / 2)), 0, self.bins - 1)
        flat_index = bin_index.astype(np.int64) + self.bins * np.arange(len(self.pairs))[:, None]
        self._counts += np.bincount(flat_index.ravel(), minlength=self._counts.size).reshape(
            self._counts.shape
        )
        self._sum += cosine.sum(axis=1)
        self._min = np.minimum(self._min, cosine.min(axis=1))
        self._max = np.maximum(self._max, cosine.max(axis=1))
        self._zero_norm += np.stack([zero_norm for _, zero_norm in per_pair]).sum(axis=1)
        self._n += cosine.shape[1]
        self._observe(cosine)

    def _observe(self, cosine: np.ndarray) -> None:
        """A subclass's look at one chunk's cosines, (P, rows) (`uncertain_cos` bootstraps them)."""

    def merge(self, other: CosineAccumulator) -> CosineAccumulator:
        """Add `other`'s samples (in place; `other` is unchanged) and return self."""
        same_centers = all(
            (mine is None and theirs is None)
            or (mine is not None and theirs is not None and np.array_equal(mine, theirs))
            for mine, theirs in zip(self.centers, other.centers)
        )
        if (
            other.pairs != self.pairs
            or other.block_widths != self.block_widths
            or other.bins != self.bins
            or not same_centers
        ):
            raise ValueError(
                "cannot merge cosine accumulators of different pairs, widths, bins or centers"
            )
        self._n += other._n
        self._counts += other._counts
        self._sum += other._sum
        self._min = np.minimum(self._min, other._min)
        self._max = np.maximum(self._max, other._max)
        self._zero_norm += other._zero_norm
        return self

    def finalize(self) -> CosineStats:
        """Mean and quantiles (at QUANTILE_LEVELS) of the cosine of each pair over all samples."""
        if self._n == 0:
            raise ValueError("no rows were added; cosine statistics need at least one sample")
        return CosineStats(
            mean=self._sum / self._n,
            quantiles=histogram_quantiles(self._counts, self._min, self._max, self._n, self.bins),
            n=self._n,
            zero_norm=self._zero_norm.copy(),
        )
