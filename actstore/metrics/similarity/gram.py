"""The Gram-space state of streaming exact CKA: the rows as stored, and Gram strip products.

For B blocks with centred Grams `K_b = Xc_b Xc_b^T` (n x n), biased linear CKA (Kornblith et al.
2019) needs `<K_b, K_b'>_F`, and the unbiased HSIC (Song et al. 2007) on the zero-diagonal Grams
`HSIC_u = [tr(K~ L~) + (1^T K~ 1)(1^T L~ 1)/((n-1)(n-2)) - 2/(n-2) 1^T K~ L~ 1] / (n(n-3))`,
whose terms follow without forming K~: `<K~, L~> = <K, L> - diag(K)^T diag(L)` and
`K~ 1 = Xc (Xc^T 1) - diag(K)`. The Frobenius products are summed over strips of rows of the
upper triangle, `sum_strips 2 <K_b[r, first:], K_b'[r, first:]>_F - <K_b[r, r], K_b'[r, r]>_F`,
never holding the B n x n Grams at once; the cheaper choice when n is small against the width
(METRICS.md: Gram space when n <= d).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .._numerics import array_ops
from .cka import hsic_u_from_grams
from .inputs import FLOAT64_BYTES, block_starts, validated_widths

GRAM_STRIP_BYTES = 128 << 20
"""Default memory for one strip of the Grams in a gram-mode `finalize` (see `StoredRows`)."""


def _gram_strip_rows(n: int, blocks: int, strip_bytes: int) -> int:
    """Rows of the n x n Grams computed at once in gram mode: as many as `strip_bytes` holds for
    all B blocks (at least 1, at most n)."""
    return int(min(max(n, 1), max(1, strip_bytes // (FLOAT64_BYTES * blocks * max(n, 1)))))


def gram_strips(n: int, blocks: int, strip_bytes: int = GRAM_STRIP_BYTES) -> list[tuple[int, int]]:
    """The row strips [first, last) that a gram-mode finalize walks."""
    height = _gram_strip_rows(n, blocks, strip_bytes)
    return [(first, min(first + height, n)) for first in range(0, n, height)]


def gram_strip_products(
    rows: np.ndarray,
    means: np.ndarray,
    widths: Sequence[int],
    strips: Sequence[tuple[int, int]],
    device: str | None = None,
) -> np.ndarray:
    """`sum over strips of 2 <K_b[r, first:], K_b'[r, first:]>_F - <K_b[r, r], K_b'[r, r]>_F`
    (B x B) for the centred Grams `K_b = Xc_b Xc_b^T`, r = rows [first, last) of a strip.

    Over strips that tile 0..n this is `<K_b, K_b'>_F` (each Gram is symmetric: a strip holds
    its diagonal square once and the part right of it, which stands for its mirror too). `rows`
    is (n, D) in any float dtype; each block's rows from `first` on are upcast to float64 and
    centred with `means` (float64, D) before any product. Memory: one strip of the B Grams plus
    one block's rows. Pure, so strips can be dealt to parallel tasks and the results added.
    With a torch `device` the rows go there once, as stored, and every product runs there.
    """
    widths = validated_widths(widths)
    n, blocks = len(rows), len(widths)
    total = np.zeros((blocks, blocks))
    if not strips:
        return total
    ops = array_ops(device)
    rows, means = ops.upload(rows), ops.upload(np.asarray(means, dtype=np.float64))
    height = max(last - first for first, last in strips)
    buffer = ops.empty(blocks * height * n)
    for first, last in strips:
        strip, cols = last - first, n - first
        grams = buffer[: blocks * strip * cols].reshape(blocks, strip, cols)
        for block, (start, width) in enumerate(zip(block_starts(widths), widths)):
            tail = ops.float64_copy(rows[first:, start : start + width])
            tail -= means[start : start + width]
            ops.matmul(tail[:strip], tail.T, out=grams[block])
        flat = grams.reshape(blocks, strip * cols)
        square = grams[:, :, :strip].reshape(blocks, strip * strip)
        total += ops.download(2.0 * (flat @ flat.T) - square @ square.T)
    return total


@dataclass
class StoredRows:
    """All rows kept as they came (float16/32 stay, others are float64): the Gram-space state.

    `finalize` never holds the B n x n Grams: `gram_strip_products` walks their upper triangle in
    strips of rows (`strip_bytes` for all B blocks at once) and adds up the pairwise Frobenius
    products of each strip, centring (in float64) the rows each strip needs as it goes; a caller
    may deal the strips to parallel tasks (`strip_map`). Peak: the rows twice (kept +
    concatenated) plus a strip and one block's float64 rows per running strip task.
    """

    widths: tuple[int, ...]
    chunks: list[np.ndarray] = field(default_factory=list)
    strip_bytes: int = GRAM_STRIP_BYTES
    device: str | None = None

    @staticmethod
    def estimate_nbytes(widths: tuple[int, ...], n: int, itemsize: int = FLOAT64_BYTES) -> int:
        return itemsize * n * sum(widths)

    @staticmethod
    def estimate_task_nbytes(widths: tuple[int, ...], n: int, strip_bytes: int) -> int:
        """What one strip computation allocates: the strip of the B Grams, its diagonal square,
        one block's rows in float64 (and its upcast), a B x B result."""
        blocks = len(widths)
        height = _gram_strip_rows(n, blocks, strip_bytes)
        return FLOAT64_BYTES * (
            blocks * height * n + blocks * height * height + 2 * n * max(widths) + 4 * blocks**2
        )

    @staticmethod
    def estimate_finalize_nbytes(
        widths: tuple[int, ...], n: int, strip_bytes: int, itemsize: int = FLOAT64_BYTES,
        strip_tasks: int = 0,
    ) -> int:
        """Bytes `pairwise_statistics` allocates on top of the held rows: their concatenation,
        the HSIC vectors (O(B n)) and one block's centred rows, plus one strip computation in
        process (`strip_tasks=0`), or `strip_tasks` concurrent ones elsewhere reading one more
        copy of the rows (Ray's object store)."""
        rows = itemsize * n * sum(widths)
        own = rows + FLOAT64_BYTES * (4 * len(widths) * n + 2 * n * max(widths))
        task = StoredRows.estimate_task_nbytes(widths, n, strip_bytes)
        return own + (task if strip_tasks == 0 else rows + strip_tasks * task)

    @property
    def n(self) -> int:
        return sum(len(chunk) for chunk in self.chunks)

    @property
    def nbytes(self) -> int:
        return sum(chunk.nbytes for chunk in self.chunks)

    def add_rows(self, rows: np.ndarray) -> None:
        self.chunks.append(rows)

    def absorb(self, other: StoredRows) -> None:
        # Chunks are never modified in place, so sharing them with `other` is safe.
        self.chunks.extend(other.chunks)

    def pairwise_statistics(
        self, with_hsic: bool, strip_map=None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """`(<K_b, K_b'>_F, HSIC_u(K_b, K_b') or None)` from the centred Grams K_b = Xc_b Xc_b^T.

        `<K_b, K_b'>` from `gram_strip_products` over all strips, in process or through
        `strip_map(rows, means, widths, strips) -> list of partial B x B sums`. The unbiased HSIC
        uses the Gram form of Song et al. 2007 on the zero-diagonal Grams K~ = K - diag(K),
        whose terms follow without forming K~: `<K~, L~> = <K, L> - diag(K)^T diag(L)` and
        `K~ 1 = Xc (Xc^T 1) - diag(K)`.
        """
        rows = np.concatenate(self.chunks)
        n, blocks = len(rows), len(self.widths)
        means = rows.mean(axis=0, dtype=np.float64)
        strips = gram_strips(n, blocks, self.strip_bytes)
        if strip_map is None:
            cross_sq = gram_strip_products(rows, means, self.widths, strips, self.device)
        else:
            cross_sq = np.sum(strip_map(rows, means, self.widths, strips), axis=0)
        if not with_hsic:
            return cross_sq, None
        diagonals, row_sums, totals = np.empty((blocks, n)), np.empty((blocks, n)), np.empty(blocks)
        for block, (start, width) in enumerate(zip(block_starts(self.widths), self.widths)):
            part = rows[:, start : start + width].astype(np.float64)
            part -= means[start : start + width]
            diagonals[block] = np.einsum("ij,ij->i", part, part)  # K_b[i, i]
            column_sum = part.sum(axis=0)
            row_sums[block] = part @ column_sum - diagonals[block]
            totals[block] = column_sum @ column_sum - diagonals[block].sum()
        hsic = hsic_u_from_grams(
            cross_sq - diagonals @ diagonals.T,
            totals[:, None],
            totals[None, :],
            row_sums @ row_sums.T,
            n,
        )
        return cross_sq, hsic
