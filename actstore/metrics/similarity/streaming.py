"""Streaming exact linear CKA, biased and debiased, of every pair of B blocks (METRICS.md,
"Streaming exact CKA", actstore's default for stored runs).

Biased CKA (Kornblith et al. 2019) `CKA = ||Yc^T Xc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F)` and
debiased CKA `HSIC_u(K, L) / sqrt(HSIC_u(K, K) HSIC_u(L, L))` with the unbiased HSIC of Song et
al. 2007 (as in Brown et al. 2023), over all n samples, fed chunk by chunk in any order. The
result equals the one-pass value to 1e-9. Two states: feature-space moments (`moments.py`,
O(D^2) memory, `n D^2 / 2` multiply-adds) or the stored rows and their Gram strips (`gram.py`,
O(n D) memory, `n^2 D / 2 + n^2 B^2 / 2`); `choose_cka_mode` picks the cheaper one that fits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from .cka import cka_matrix
from .gram import GRAM_STRIP_BYTES, StoredRows
from .inputs import FLOAT64_BYTES, MIN_HSIC_SAMPLES, validated_blocks, validated_widths
from .moments import FeatureMoments


def cka_mode_costs(block_widths: Sequence[int], n: int) -> dict[str, float]:
    """Multiply-adds of the streaming CKA of B blocks (total width D) over n rows, per mode.

    feature: one syrk of every chunk into the D x D moments, `n D^2 / 2` (plus O(n B D)).
    gram: the upper triangle of one n x n Gram per block, `n^2 D / 2`, plus the pairwise
    Frobenius products of the B Grams, `n^2 B^2 / 2`.
    """
    widths = validated_widths(block_widths)
    total, blocks = sum(widths), len(widths)
    return {
        "feature": n * total * total / 2 + n * blocks * total,
        "gram": n * n * total / 2 + n * n * blocks * blocks / 2,
    }


def choose_cka_mode(
    block_widths: Sequence[int],
    n: int,
    memory_limit: int,
    strip_bytes: int = GRAM_STRIP_BYTES,
    itemsize: int = FLOAT64_BYTES,
    strip_tasks: int = 0,
) -> Literal["feature", "gram"]:
    """The cheaper mode (`cka_mode_costs`) for the streaming CKA of these blocks over n rows,
    gram only if its whole peak, finalize included (`estimate_peak_nbytes` with the rows'
    `itemsize` and `strip_tasks`), fits `memory_limit`. Feature mode is the fallback: its state
    does not grow with n, and a caller tiles the blocks when even that exceeds the limit."""
    costs = cka_mode_costs(block_widths, n)
    if costs["gram"] < costs["feature"]:
        peak = SimilarityAccumulator.estimate_peak_nbytes(
            block_widths, "gram", n, strip_bytes, itemsize=itemsize, strip_tasks=strip_tasks
        )
        if peak <= memory_limit:
            return "gram"
    return "feature"


@dataclass(frozen=True)
class CKAMatrices:
    """Biased and debiased linear CKA of every block pair over `n` samples.

    Both B x B float64 and symmetric with a unit diagonal; `debiased` is NaN where its
    denominator is not positive (e.g. a constant block) or n < 4, and it can be negative.
    """

    biased: np.ndarray
    debiased: np.ndarray
    n: int


class SimilarityAccumulator:
    """Streaming exact linear CKA (biased and debiased) of every pair of B blocks (METRICS.md).

    Feed row chunks with `update`, combine partial accumulators with `merge` (any chunk order, any
    merge tree), then `finalize`. The result equals the one-pass value to 1e-9.

    `mode="feature"` keeps the moments of the stacked rows `z_i = concat_b(block_b[i])` relative
    to a shift (the first chunk's column mean), in float64, O(D^2) memory with D = sum of widths,
    never O(n); `finalize` moves them exactly to the global mean and applies the centred
    feature-space formulas. `mode="gram"` keeps the rows (O(n D), float16/float32 chunks as they
    come, since they upcast exactly) and finalizes with the n x n Gram of every block, computed
    in strips of rows (`gram_strip_bytes` for all B blocks at once), never all B Grams at once:
    the cheaper choice when n is small against D (`choose_cka_mode`).

    Memory: `nbytes` / `estimate_nbytes` count the state held between calls. On top of it,
    feature mode transiently needs up to 2 D^2 float64 during `finalize` (one during `merge`);
    gram mode needs the concatenated rows and one strip (per strip task) during `finalize`.
    `estimate_peak_nbytes` counts both.
    """

    def __init__(
        self,
        block_widths: Sequence[int],
        mode: Literal["feature", "gram"] = "feature",
        gram_strip_bytes: int = GRAM_STRIP_BYTES,
        device: str | None = None,
    ) -> None:
        self.block_widths = validated_widths(block_widths)
        if mode not in ("feature", "gram"):
            raise ValueError(f"mode must be 'feature' or 'gram', got {mode!r}")
        self.mode = mode
        if mode == "feature":
            self._state = FeatureMoments(self.block_widths, device=device)
        else:
            self._state = StoredRows(
                self.block_widths, strip_bytes=int(gram_strip_bytes), device=device
            )

    @staticmethod
    def estimate_nbytes(
        block_widths: Sequence[int],
        mode: Literal["feature", "gram"],
        n: int,
        itemsize: int = FLOAT64_BYTES,
    ) -> int:
        """Bytes the accumulator will hold after `n` rows (feature mode: independent of n; gram
        mode: the rows, fed as `itemsize`-byte floats)."""
        widths = validated_widths(block_widths)
        if mode == "feature":
            return FeatureMoments.estimate_nbytes(widths)
        if mode == "gram":
            return StoredRows.estimate_nbytes(widths, n, itemsize)
        raise ValueError(f"mode must be 'feature' or 'gram', got {mode!r}")

    @staticmethod
    def estimate_peak_nbytes(
        block_widths: Sequence[int],
        mode: Literal["feature", "gram"],
        n: int,
        gram_strip_bytes: int = GRAM_STRIP_BYTES,
        itemsize: int = FLOAT64_BYTES,
        strip_tasks: int = 0,
    ) -> int:
        """Bytes held at the peak of `finalize` after `n` rows: the state plus what `finalize`
        allocates (feature: 2 D^2 float64; gram: the concatenated rows, the HSIC vectors and the
        Gram strips, `StoredRows.estimate_finalize_nbytes`; `strip_tasks` > 0 when they run in
        that many parallel tasks through `finalize(strip_map=...)`)."""
        widths = validated_widths(block_widths)
        held = SimilarityAccumulator.estimate_nbytes(widths, mode, n, itemsize)
        if mode == "feature":
            return held + 2 * FLOAT64_BYTES * sum(widths) ** 2
        return held + StoredRows.estimate_finalize_nbytes(
            widths, n, int(gram_strip_bytes), itemsize, strip_tasks
        )

    @property
    def device(self) -> str | None:
        """Where the O(n D^2) (feature) or O(n^2 D) (gram) products run: None for numpy on the
        host, else a torch device name ("cuda", or "cpu" for the same code path on the host).
        Set it in the task that feeds the chunks; merged and pickled states are always host
        arrays, and both paths agree to rounding."""
        return self._state.device

    @device.setter
    def device(self, device: str | None) -> None:
        self._state.device = device

    @property
    def nbytes(self) -> int:
        """Bytes of the state currently held."""
        return self._state.nbytes

    @property
    def n(self) -> int:
        """Rows seen so far."""
        return self._state.n

    def update(self, blocks: Sequence[np.ndarray]) -> None:
        """Add one chunk: `blocks[b]` has shape (rows, block_widths[b]), rows = the same samples."""
        # float16/float32 rows come as they are (exact): feature mode upcasts them as it shifts
        # them, gram mode keeps them (upcast before any product).
        matrices = validated_blocks(blocks, self.block_widths, upcast=False)
        if not len(matrices[0]):
            return
        if self.mode == "feature":
            self._state.add_blocks(matrices)
        else:
            self._state.add_rows(np.concatenate(matrices, axis=1))

    def merge(self, other: SimilarityAccumulator) -> SimilarityAccumulator:
        """Add `other`'s rows to this accumulator in place (`other` is unchanged); return self."""
        if other.block_widths != self.block_widths or other.mode != self.mode:
            raise ValueError(
                f"cannot merge a {other.mode} accumulator of widths {other.block_widths} into a "
                f"{self.mode} accumulator of widths {self.block_widths}"
            )
        self._state.absorb(other._state)
        return self

    def finalize(self, strip_map=None, in_place: bool = False) -> CKAMatrices:
        """Biased and debiased CKA matrices over all rows seen; the state is left unchanged.

        Gram mode only: `strip_map(rows, means, widths, strips)` may compute the Gram strips
        elsewhere (e.g. in parallel tasks), returning a list of `gram_strip_products` results
        over groups of the strips that together cover each strip once.
        Feature mode only: `in_place` moves the moments to the exact mean where they lie instead
        of on a copy (no D x D copy, ~40 ms at D = 2688; for a caller's own merged state): the
        state stays usable and the same to rounding, though a second finalize may then differ
        from the first in the last bits."""
        n = self._state.n
        if n == 0:
            raise ValueError("no rows were added; CKA needs at least one sample")
        with_hsic = n >= MIN_HSIC_SAMPLES
        if self.mode == "gram":
            cross_sq, hsic = self._state.pairwise_statistics(with_hsic, strip_map)
        else:
            cross_sq, hsic = self._state.pairwise_statistics(with_hsic, in_place)
        blocks = len(self.block_widths)
        debiased = np.full((blocks, blocks), np.nan) if hsic is None else cka_matrix(hsic)
        return CKAMatrices(biased=cka_matrix(cross_sq), debiased=debiased, n=n)
