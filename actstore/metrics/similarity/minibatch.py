"""Minibatch CKA (Nguyen, Raghu & Kornblith 2021, "Do Wide and Deep Networks Learn the Same
Things?"), for data too large for one pass in memory.

`CKA = sum_b HSIC_u(K_b, L_b) / sqrt(sum_b HSIC_u(K_b, K_b) sum_b HSIC_u(L_b, L_b))` over batches b
of equal size >= 4, with HSIC_u the unbiased estimator of Song et al. 2007 (`cka.py`), each batch
centred on its own. A short final batch is dropped, or merged into the one before it; the result
says which. With one batch of size n it equals debiased CKA exactly (METRICS.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from .._numerics import column_centered, squared_cross_norms
from .cka import debiased_cka_terms, hsic_u_from_moments, normalised
from .inputs import (
    MIN_HSIC_SAMPLES,
    paired,
    require_hsic_samples,
    validated_blocks,
    validated_widths,
)


@dataclass(frozen=True)
class MinibatchCKA:
    """Minibatch CKA and how the rows were batched.

    `remainder` says what happened to the short final batch: "none" (n divisible by batch_size),
    "dropped" or "merged" (into the batch before it).
    """

    value: float
    n_batches: int
    batch_size: int
    remainder: Literal["none", "dropped", "merged"]


def minibatch_cka(
    x: np.ndarray,
    y: np.ndarray,
    batch_size: int,
    remainder: Literal["drop", "merge"] = "drop",
) -> MinibatchCKA:
    """Minibatch CKA (Nguyen, Raghu & Kornblith 2021) over consecutive batches of rows.

    `CKA = sum_b HSIC_u(K_b, L_b) / sqrt(sum_b HSIC_u(K_b, K_b) sum_b HSIC_u(L_b, L_b))`, each
    batch centred on its own. A short final batch is dropped or merged into the batch before it.
    With one batch of all n rows it equals `linear_cka_debiased` exactly.
    """
    xs, ys = paired(x, y)
    if batch_size < MIN_HSIC_SAMPLES:
        raise ValueError(
            f"batch_size must be >= {MIN_HSIC_SAMPLES} (unbiased HSIC), got {batch_size}"
        )
    if remainder not in ("drop", "merge"):
        raise ValueError(f"remainder must be 'drop' or 'merge', got {remainder!r}")
    n_batches, short_rows = divmod(len(xs), batch_size)
    if n_batches == 0:
        raise ValueError(f"{len(xs)} samples do not fill one batch of {batch_size}")
    stops = [batch_size * (b + 1) for b in range(n_batches)]
    if short_rows and remainder == "merge":
        stops[-1] = len(xs)
    totals = np.zeros(3)
    for start, stop in zip([0, *stops[:-1]], stops):
        totals += debiased_cka_terms(
            column_centered(xs[start:stop]), column_centered(ys[start:stop])
        )
    outcome = "none" if not short_rows else ("dropped" if remainder == "drop" else "merged")
    return MinibatchCKA(float(normalised(*totals)), n_batches, batch_size, outcome)


class MinibatchCKAAccumulator:
    """Streaming minibatch CKA (Nguyen, Raghu & Kornblith 2021) for block pairs.

    Each `update` is ONE batch (the caller cuts equal batches of >= 4 rows, the last one possibly
    merged with the short remainder). Per pair it sums `HSIC_u(K_b, L_b)`, `HSIC_u(K_b, K_b)` and
    `HSIC_u(L_b, L_b)`; `finalize` gives `sum HSIC_u(K,L) / sqrt(sum HSIC_u(K,K) sum HSIC_u(L,L))`.
    Batches may arrive in any order and partial sums merge by addition.
    """

    def __init__(
        self,
        pairs: Sequence[tuple[int, int]],
        block_widths: Sequence[int],
        device: str | None = None,
    ) -> None:
        self.block_widths = validated_widths(block_widths)
        self.pairs = tuple((int(i), int(j)) for i, j in pairs)
        self.totals = np.zeros((len(self.pairs), 3))
        self.batches = 0
        self.device = device

    def update(self, blocks: Sequence[np.ndarray]) -> None:
        """Add one batch. The `||Xc^T Yc||_F^2` products run on `device` (None: the host)."""
        matrices = validated_blocks(blocks, self.block_widths)
        n = len(matrices[0])
        require_hsic_samples(n)
        centred = {b: column_centered(matrices[b]) for pair in self.pairs for b in pair}
        norms = {b: np.einsum("ij,ij->i", c, c) for b, c in centred.items()}
        needed = sorted({p for i, j in self.pairs for p in ((i, j), (i, i), (j, j))})
        squares = squared_cross_norms(centred, needed, self.device)

        def hsic(i: int, j: int) -> float:
            return hsic_u_from_moments(
                squares[i, j], norms[i] @ norms[j], norms[i].sum(), norms[j].sum(), n
            )

        for p, (i, j) in enumerate(self.pairs):
            self.totals[p] += (hsic(i, j), hsic(i, i), hsic(j, j))
        self.batches += 1

    def merge(self, other: MinibatchCKAAccumulator) -> MinibatchCKAAccumulator:
        self.totals += other.totals
        self.batches += other.batches
        return self

    def finalize(self) -> np.ndarray:
        """(P,) minibatch CKA per pair (NaN where a self-HSIC sum is not positive)."""
        return np.array([normalised(*terms) for terms in self.totals], dtype=np.float64)
