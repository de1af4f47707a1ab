"""Feature options for similarity: z-score each dimension and/or leave dimensions out, per block.

- Standardise: `z_ik = (x_ik - mu_k) / sigma_k` with the mean and population std over all n samples
  (from a first pass, `metrics.outliers.DimensionMoments`); a constant dimension (sigma_k = 0)
  becomes 0. Linear CKA of standardised features is CKA of the correlation-scaled data: for
  biased feature-space CKA it equals applying `S^-1/2 Xc^T Xc S^-1/2` (S the diagonal of the
  covariances) to the centred moments, but the debiased HSIC's row-norm terms
  `r_i = ||z_i||^2` are not functions of the second moments, so actstore standardises the rows
  in a second pass instead, which serves every variant alike (docs/metrics.md).
- Exclude: the listed dimensions are dropped before any product.

`TransformedAccumulator` applies one `FeatureTransform` per block to each chunk and passes the
result to any streaming similarity accumulator (`metrics.accumulator.Accumulator`; its `device`
and `seek` too when the inner accumulator has them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..accumulator import Accumulator, OnDevice, Seekable


@dataclass(frozen=True)
class FeatureTransform:
    """Keep the columns `keep`; then subtract `shift` and multiply by `scale` (both over the
    kept columns, or None)."""

    keep: np.ndarray
    shift: np.ndarray | None = None
    scale: np.ndarray | None = None

    @property
    def width(self) -> int:
        return len(self.keep)

    def apply(self, block: np.ndarray) -> np.ndarray:
        kept = np.asarray(block)[:, self.keep].astype(np.float64)
        if self.shift is not None:
            kept -= self.shift
        if self.scale is not None:
            kept *= self.scale
        return kept


def feature_transform(width: int, exclude: Sequence[int] = (), mean: np.ndarray | None = None,
                      std: np.ndarray | None = None) -> FeatureTransform:
    """The transform of a block of `width` dimensions: drop `exclude`, and z-score with `mean` and
    `std` when given (dimensions with std 0 become 0). At least one dimension must remain."""
    dropped = np.zeros(width, dtype=bool)
    dropped[np.asarray(list(exclude), dtype=np.int64)] = True
    keep = np.flatnonzero(~dropped)
    if not len(keep):
        raise ValueError(f"excluding {len(exclude)} dimensions leaves none of {width}")
    if mean is None or std is None:
        return FeatureTransform(keep)
    std = np.asarray(std, dtype=np.float64)[keep]
    scale = np.where(std > 0, 1.0 / np.where(std > 0, std, 1.0), 0.0)
    return FeatureTransform(keep, np.asarray(mean, dtype=np.float64)[keep], scale)


class TransformedAccumulator:
    """Feeds `inner` each chunk's blocks through their transforms; otherwise it is `inner`."""

    def __init__(self, inner: Accumulator, transforms: Sequence[FeatureTransform]) -> None:
        self.inner = inner
        self.transforms = tuple(transforms)

    @property
    def device(self) -> str | None:
        """The inner accumulator's device (where its products run), if it has one."""
        return self.inner.device if isinstance(self.inner, OnDevice) else None

    @device.setter
    def device(self, device: str | None) -> None:
        if isinstance(self.inner, OnDevice):
            self.inner.device = device

    def seek(self, row: int) -> None:
        if isinstance(self.inner, Seekable):
            self.inner.seek(row)

    def update(self, blocks: Sequence[np.ndarray], *extra) -> None:
        if len(blocks) != len(self.transforms):
            raise ValueError(f"expected {len(self.transforms)} blocks, got {len(blocks)}")
        self.inner.update([t.apply(b) for t, b in zip(self.transforms, blocks)], *extra)

    def merge(self, other: TransformedAccumulator) -> TransformedAccumulator:
        self.inner.merge(other.inner)
        return self

    def finalize(self, *args, **kwargs):
        return self.inner.finalize(*args, **kwargs)
