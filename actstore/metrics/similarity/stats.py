"""Quantiles of a distribution kept as a histogram, for the box plots of streamed metrics.

METRICS.md asks for the mean of sample-wise cosine (COS, "Tracing Representation Progression",
Jiang et al. 2024, sec. 2.1) plus its distribution as quantiles. A stream keeps a histogram of
`bins` bins over [low, high] with the exact count, min and max; `histogram_quantiles` then follows
np.quantile's linear rule, `Q(q) = v_(floor(p)) + (p - floor(p)) (v_(ceil(p)) - v_(floor(p)))` at
position `p = q (n-1)` of the sorted sample, placing each rank's value inside its bin, so every
quantile is within one bin width (high-low)/bins of the exact one and Q(0), Q(1) are exact.
Also used by the residual norm ratio of `lens.py`.
"""

from __future__ import annotations

import numpy as np

QUANTILE_LEVELS = (0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0)


def histogram_quantiles(
    counts: np.ndarray, lowest: np.ndarray, highest: np.ndarray, n: int, bins: int,
    low: float = -1.0, high: float = 1.0,
) -> np.ndarray:
    """Quantiles at QUANTILE_LEVELS from per-pair histograms over [low, high], shape (P, levels).

    Follows np.quantile's linear rule: the value at position `q (n-1)` of the sorted sample,
    interpolated between the two ranks around it. A rank's value is placed inside its bin,
    the bin's c elements spread evenly (the j-th at the centre of the j-th of c equal slots), so
    it is within one bin width (high-low)/bins of the exact value; ranks 0 and n-1 are the exact
    min and max.
    """
    positions = np.asarray(QUANTILE_LEVELS) * (n - 1)
    ranks = np.stack([np.floor(positions), np.ceil(positions)]).astype(np.int64)  # (2, levels)
    cumulative = np.cumsum(counts, axis=1)
    bin_of_rank = np.stack(
        [np.searchsorted(pair_cumulative, ranks, side="right") for pair_cumulative in cumulative]
    )  # (P, 2, levels): the first bin whose inclusive cumulative count exceeds the rank
    flat_bins = bin_of_rank.reshape(len(counts), -1)
    in_bin = np.take_along_axis(counts, flat_bins, axis=1).reshape(bin_of_rank.shape)
    through_bin = np.take_along_axis(cumulative, flat_bins, axis=1).reshape(bin_of_rank.shape)
    before_bin = through_bin - in_bin
    values = low + ((high - low) / bins) * (bin_of_rank + (ranks - before_bin + 0.5) / in_bin)
    lowest, highest = lowest[:, None, None], highest[:, None, None]
    values = np.clip(values, lowest, highest)
    values = np.where(ranks == 0, lowest, np.where(ranks == n - 1, highest, values))
    fraction = positions - ranks[0]
    return values[:, 0] + fraction * (values[:, 1] - values[:, 0])
