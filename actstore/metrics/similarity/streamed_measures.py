"""The streamed similarity measures beyond CKA: one accumulator of moments, any measure at finalize.

Procrustes, the angular shape metric (`shape`), CCA, SVCCA and PWCCA (`cca`) need only each block
pair's centred second moments `Xc_b^T Xc_b'`, which the feature-space state of streaming CKA
(`moments.FeatureMoments`: `sum u`, `sum u u^T` relative to a shift, moved exactly to the mean)
already holds for every pair of B blocks: O(D^2) memory whatever n, chunks in any order, partial
states merged in any tree. `MomentMeasures` is that state; `finalize(measure, rows, cols)` then
computes the measure for every requested block pair, preparing each block once (its
eigen-decomposition) and each pair from its cross block.

Measures are named (in `actstore.measures`, which builds them with the factories here) by the
identifiers of the similarity-repository project (Cloos et al. 2024, nacloos/similarity-repository,
`similarity/standardization.py`), so results compare across tools.
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
    `compare(prepared_a, prepared_b, C_ab)` per pair. `symmetric`: m(a, b) = m(b, a); `distance`:
    0 (not 1) between a block and itself."""

    prepare: Callable[[np.ndarray], Any]
    compare: Callable[[Any, Any, np.ndarray], float]
    symmetric: bool = True
    distance: bool = False


# The factories the measure registry (`actstore.measures`) names, one per family of identifiers.
def procrustes_measure(kind: str) -> MomentMeasure:
    """procrustes-distance=angular (kind "angular") or =euclidean."""
    compare = {"angular": shape.procrustes_angular, "euclidean": shape.procrustes_euclidean}[kind]
    return MomentMeasure(np.trace, compare, distance=True)


def shape_measure(alpha: float) -> MomentMeasure:
    """shape_metric-alpha={alpha}-distance=angular: partial whitening alpha in [0, 1]."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    return MomentMeasure(partial(shape.Whitened.of, alpha=alpha), shape.shape_angular, distance=True)


def cca_measure(score: str, variance: float | None = None) -> MomentMeasure:
    """cca-squared_score ("squared"), cca-score ("mean"), svcca-var=0.99-score ("mean" with the
    variance kept), pwcca-score ("pwcca", not symmetric)."""
    compare = {"squared": cca.cca_squared, "mean": cca.cca_mean, "pwcca": cca.pwcca}[score]
    return MomentMeasure(partial(cca.Whitening.of, variance=variance), compare, symmetric=score != "pwcca")


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
