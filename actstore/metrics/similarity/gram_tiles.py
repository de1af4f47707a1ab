"""Gram-space CKA of many blocks, summed over rectangles of the n x n sample space.

For B blocks X_b (n x d_b) centred at their exact column means m_b, biased linear CKA (Kornblith
et al. 2019) needs the B x B matrix `S[b, b'] = <K_b, K_b'>_F` of the centred Grams
`K_b = Xc_b Xc_b^T`. Writing `f_ij = (K_1[i, j], ..., K_B[i, j])`, `S = sum_ij f_ij f_ij^T`: a sum
over the entries (i, j), so the n x n entries can be cut into rectangles `R x C` and summed in any
order, on any machine. One rectangle costs one product `Xc_b[R] Xc_b[C]^T` per block
(|R| |C| d_b multiply-adds) plus one syrk of its B x |R||C| entry matrix (B^2 |R||C| / 2). The
Grams are symmetric, so only rectangles on or above the diagonal are formed: one strictly above
counts twice, a square on the diagonal once. Over a tiling of the upper triangle, every Gram entry
is computed once: `n^2 D / 2` multiply-adds for the Grams (D = sum of d_b) and `n^2 B^2 / 4` for
the pairwise products, with memory for the rows of R and C and B |R||C| entries, never an n x n
Gram.

The unbiased HSIC (Song et al. 2007, Gram form in `cka.hsic_u_from_grams`) on the zero-diagonal
Grams `K~ = K - diag(K)` needs, besides S, only `diag(K_b)`: centred exactly, `Xc_b^T 1 = 0`, so
`K~_b 1 = -diag(K_b)`, `1^T K~_b 1 = -tr K_b` and `<K~_b, K~_b'> = S - diag(K_b)^T diag(K_b')`.
The diagonal squares give `diag(K_b)` for free.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .cka import cka_matrix, hsic_u_from_grams
from .inputs import FLOAT64_BYTES, MIN_HSIC_SAMPLES


class ColumnMeans:
    """Float64 column sums of every block, streamed: the exact means a Gram tiling centres at."""

    def __init__(self, widths: Sequence[int]) -> None:
        self.sums = [np.zeros(width) for width in widths]
        self.n = 0

    def update(self, blocks: Sequence[np.ndarray]) -> None:
        for total, block in zip(self.sums, blocks):
            total += block.sum(axis=0, dtype=np.float64)
        self.n += len(blocks[0])

    def merge(self, other: ColumnMeans) -> ColumnMeans:
        for mine, theirs in zip(self.sums, other.sums):
            mine += theirs
        self.n += other.n
        return self

    def finalize(self) -> list[np.ndarray]:
        if self.n == 0:
            raise ValueError("no rows were added; CKA needs at least one sample")
        return [total / self.n for total in self.sums]


def rectangle_products(
    rows: Sequence[np.ndarray],
    cols: Sequence[np.ndarray] | None,
    means: Sequence[np.ndarray],
    piece_rows: int,
) -> tuple[np.ndarray, np.ndarray | None]:
    """`(<K_b[R, C], K_b'[R, C]>_F for all block pairs (B x B), diag(K_b[R, R]) or None)`.

    `rows[b] = X_b[R]` and `cols[b] = X_b[C]` as stored (any float dtype; each piece is upcast to
    float64 and centred with `means[b]` before any product); `cols=None` is the square C = R, whose
    diagonal (B x |R|) is returned too. The rows go `piece_rows` at a time, so the entry matrix
    held is B x piece_rows x |C| float64.
    """
    square = cols is None
    cols = rows if square else cols
    blocks, height, width = len(rows), len(rows[0]), len(cols[0])
    widest = max(block.shape[1] for block in rows)
    piece_rows = max(1, min(piece_rows, height))
    entries = np.empty((blocks, piece_rows * width))
    left, right = np.empty((piece_rows, widest)), np.empty((width, widest))
    total = np.zeros((blocks, blocks))
    diagonal = np.empty((blocks, height)) if square else None
    for first in range(0, height, piece_rows):
        last = min(first + piece_rows, height)
        piece = entries[:, : (last - first) * width]
        for b in range(blocks):
            d = rows[b].shape[1]
            a, c = left[: last - first, :d], right[:, :d]
            np.copyto(a, rows[b][first:last])
            a -= means[b]
            np.copyto(c, cols[b])
            c -= means[b]
            gram = piece[b].reshape(last - first, width)
            np.matmul(a, c.T, out=gram)
            if square:
                diagonal[b, first:last] = gram[np.arange(last - first), np.arange(first, last)]
        total += piece @ piece.T
    return total, diagonal


def rectangle_nbytes(blocks: int, widest: int, piece_rows: int, width: int) -> int:
    """What `rectangle_products` allocates: the entry matrix, two centred float64 pieces, B x B."""
    return FLOAT64_BYTES * (blocks * piece_rows * width + (piece_rows + width) * widest + 2 * blocks**2)


def cka_from_gram_sums(cross: np.ndarray, diagonals: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(biased, debiased) CKA matrices from `S = <K_b, K_b'>_F` and the Gram diagonals (B x n).

    Debiased is NaN for n < MIN_HSIC_SAMPLES (the unbiased HSIC needs n >= 4)."""
    blocks = len(cross)
    if n < MIN_HSIC_SAMPLES:
        return cka_matrix(cross), np.full((blocks, blocks), np.nan)
    traces = diagonals.sum(axis=1)
    hsic = hsic_u_from_grams(
        cross - diagonals @ diagonals.T,
        -traces[:, None],
        -traces[None, :],
        diagonals @ diagonals.T,
        n,
    )
    return cka_matrix(cross), cka_matrix(hsic)
