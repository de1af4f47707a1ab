"""The streamed similarity measures beyond CKA: one accumulator of moments, any measure at finalize.

Procrustes, the angular shape metric (`shape`), CCA, SVCCA and PWCCA (`cca`) need only each block
pair's centred second moments `Xc_b^T Xc_b'`, which the feature-space state of streaming CKA
(`moments.FeatureMoments`: `sum u`, `sum u u^T` relative to a shift, moved exactly to the mean)
already holds for every pair of B blocks: O(D^2) memory whatever n, chunks in any order, partial
states merged in any tree. `MomentMeasures` is that state; `finalize(measure, rows, cols)` then
computes the named measure for every requested block pair, preparing each block once (its
eigen-decomposition) and each pair from its cross block.

Measures are named by the identifiers of the similarity-repository project (Cloos et al. 2024,
github.com/nacloos/similarity-repository, `similarity/standardization.py`), so results compare
across tools; a `{alpha}` in a name is filled in by `identifier`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from . import cca, shape
from .inputs import MIN_HSIC_SAMPLES, validated_blocks, validated_widths
from .moments import FeatureMoments


@dataclass(frozen=True)
class MomentMeasure:
    """A measure of a block pair from centred moments: `prepare(C_bb)` once per block, then
    `compare(prepared_a, prepared_b, C_ab)` per pair. `symmetric`: m(a, b) = m(b, a)."""

    identifier: str
    prepare: Callable[[np.ndarray], Any]
    compare: Callable[[Any, Any, np.ndarray], float]
    symmetric: bool = True
    distance: bool = False


STREAMED_MEASURES = (
    "procrustes-distance=angular",
    "procrustes-distance=euclidean",
    "shape_metric-alpha={alpha}-distance=angular",
    "cca-squared_score",
    "cca-score",
    "svcca-var=0.99-score",
    "pwcca-score",
)


def identifier(name: str, alpha: float = 1.0) -> str:
    """The identifier with its parameters filled in (`shape_metric-alpha=0.5-distance=angular`)."""
    return name.replace("{alpha}", f"{alpha:g}")


def moment_measure(name: str, alpha: float = 1.0) -> MomentMeasure:
    """The `MomentMeasure` for one of `STREAMED_MEASURES` (alpha: the shape metric's whitening)."""
    filled = identifier(name, alpha)
    if name == "procrustes-distance=angular":
        return MomentMeasure(filled, np.trace, shape.procrustes_angular, distance=True)
    if name == "procrustes-distance=euclidean":
        return MomentMeasure(filled, np.trace, shape.procrustes_euclidean, distance=True)
    if name == "shape_metric-alpha={alpha}-distance=angular":
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        return MomentMeasure(filled, partial(shape.Whitened.of, alpha=alpha), shape.shape_angular, distance=True)
    if name in ("cca-squared_score", "cca-score"):
        score = cca.cca_squared if name == "cca-squared_score" else cca.cca_mean
        return MomentMeasure(filled, cca.Whitening.of, score)
    if name == "svcca-var=0.99-score":
        return MomentMeasure(filled, partial(cca.Whitening.of, variance=cca.SVCCA_VARIANCE), cca.cca_mean)
    if name == "pwcca-score":
        return MomentMeasure(filled, cca.Whitening.of, cca.pwcca, symmetric=False)
    raise ValueError(f"measure {name!r} is not one of {', '.join(STREAMED_MEASURES)}")


class MomentMeasures:
    """Streamed centred second moments of B blocks, enough for any `MomentMeasure` of any pair.

    `update` one chunk (blocks side by side, the same samples), `merge` partial accumulators,
    `finalize(measure, rows, cols)`: the len(rows) x len(cols) matrix of the measure between
    blocks rows[i] and cols[j]. Memory: `FeatureMoments` (O(D^2), D = sum of widths); finalize
    adds one centred copy of it and each block's eigenbasis, like the CKA feature mode's peak.
    """

    def __init__(self, block_widths: Sequence[int], device: str | None = None) -> None:
        self.block_widths = validated_widths(block_widths)
        self._moments = FeatureMoments(self.block_widths, device=device)

    @staticmethod
    def estimate_peak_nbytes(block_widths: Sequence[int]) -> int:
        widths = validated_widths(block_widths)
        return FeatureMoments.estimate_nbytes(widths) + 2 * 8 * sum(widths) ** 2

    @property
    def device(self) -> str | None:
        return self._moments.device

    @device.setter
    def device(self, device: str | None) -> None:
        self._moments.device = device

    @property
    def n(self) -> int:
        return self._moments.n

    @property
    def nbytes(self) -> int:
        return self._moments.nbytes

    def update(self, blocks: Sequence[np.ndarray]) -> None:
        matrices = validated_blocks(blocks, self.block_widths, upcast=False)
        if len(matrices[0]):
            self._moments.add_blocks(matrices)

    def merge(self, other: MomentMeasures) -> MomentMeasures:
        if other.block_widths != self.block_widths:
            raise ValueError(f"cannot merge moments of widths {other.block_widths} into {self.block_widths}")
        self._moments.absorb(other._moments)
        return self

    def finalize(self, measure: MomentMeasure, rows: Sequence[int], cols: Sequence[int]) -> np.ndarray:
        """The measure between block rows[i] and block cols[j], len(rows) x len(cols) float64."""
        if self.n < MIN_HSIC_SAMPLES:
            raise ValueError(f"these measures need n >= {MIN_HSIC_SAMPLES} samples, got n={self.n}")
        gram = self._moments.centred().cross_products.matrix()
        starts = np.concatenate(([0], np.cumsum(self.block_widths)))

        def part(a: int, b: int) -> np.ndarray:
            return gram[starts[a]:starts[a + 1], starts[b]:starts[b + 1]]

        # Many small (d x d) decompositions: threaded BLAS gains little on them and, on a busy
        # machine, its spinning threads make each one many times slower (20x measured on 2 cores).
        with threadpool_limits(1):
            prepared = {b: measure.prepare(part(b, b)) for b in sorted(set(rows) | set(cols))}
            out = np.empty((len(rows), len(cols)))
            done: dict[tuple[int, int], float] = {}
            for i, a in enumerate(rows):
                for j, b in enumerate(cols):
                    if measure.symmetric and (b, a) in done:
                        out[i, j] = done[b, a]
                        continue
                    value = measure.compare(prepared[a], prepared[b], part(a, b))
                    if a == b and not np.isnan(value):  # rounding keeps arccos(1 - eps) off 0
                        value = 0.0 if measure.distance else 1.0
                    out[i, j] = done[a, b] = value
        return out
