"""The feature-space state of streaming exact CKA: float64 moments of the stacked rows.

METRICS.md, "Streaming exact CKA": accumulate `sum x`, `sum y`, `X^T X`, `Y^T Y`, `X^T Y`, the row
norms and the cross sums chunk by chunk, in float64, in any chunk order; memory O(d^2), never
O(n^2). From the moments centred at the exact mean, the biased CKA (Kornblith et al. 2019) needs
`||Xc_b^T Xc_b'||_F^2` and the unbiased HSIC (Song et al. 2007) its feature-space form
`n(n-3) HSIC_u = ||Xc^T Yc||_F^2 - n/(n-2) r_x^T r_y + s_x s_y / ((n-1)(n-2))`,
with r_i = ||xc_i||^2 and s = sum_i r_i. The moments are kept relative to a shift near the data and
moved exactly (`FeatureMoments.move_shift`), so chunks and partial states combine in any order.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np

from .._numerics import SymmetricSum
from .cka import hsic_u_from_moments
from .inputs import FLOAT64_BYTES, block_sums


@dataclass
class FeatureMoments:
    """Float64 moments of the stacked rows `u_i = z_i - shift`, enough for every block pair's CKA.

    With `a_i^(b) = ||u_i^(b)||^2` (squared norm of block b's part of row i): `row_sum` S =
    sum u_i, `cross_products` G = sum u_i u_i^T, `norm_sum` A_b = sum_i a_i^(b),
    `norm_weighted_sum` AU_b = sum_i a_i^(b) u_i and
    `norm_products` AA_bb' = sum_i a_i^(b) a_i^(b').
    Memory O(D^2) with D = sum of the widths, whatever n.

    G is a `SymmetricSum`: `add_blocks` adds to it on the host (BLAS syrk) or on `device`;
    `move_shift` (hence `absorb` and `centred`) and `pairwise_statistics` read and update its
    upper triangle in place on the host, never a D x D temporary.
    """

    widths: tuple[int, ...]
    n: int = 0
    shift: np.ndarray = field(init=False)
    row_sum: np.ndarray = field(init=False)
    cross_products: SymmetricSum = field(init=False)
    norm_sum: np.ndarray = field(init=False)
    norm_weighted_sum: np.ndarray = field(init=False)
    norm_products: np.ndarray = field(init=False)
    device: str | None = None
    _buffers: tuple[np.ndarray, np.ndarray] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        total, blocks = sum(self.widths), len(self.widths)
        self.shift = np.zeros(total)
        self.row_sum = np.zeros(total)
        self.cross_products = SymmetricSum(total)
        self.norm_sum = np.zeros(blocks)
        self.norm_weighted_sum = np.zeros((blocks, total))
        self.norm_products = np.zeros((blocks, blocks))

    @staticmethod
    def estimate_nbytes(widths: tuple[int, ...]) -> int:
        total, blocks = sum(widths), len(widths)
        return FLOAT64_BYTES * (2 * total + total**2 + blocks + blocks * total + blocks**2)

    @property
    def nbytes(self) -> int:
        arrays = (
            self.shift,
            self.row_sum,
            self.cross_products,
            self.norm_sum,
            self.norm_weighted_sum,
            self.norm_products,
        )
        return sum(array.nbytes for array in arrays)

    def add_blocks(self, blocks: list[np.ndarray]) -> None:
        """Add one chunk: `blocks[b]` is block b's rows (float16/32/64, equal rows), stacked in order.

        Each block is upcast and shifted in one pass into a float64 buffer of the stacked rows (no
        separate upcast, concatenation and shifted copies), then every moment is formed from it:
        G by one syrk, and AU, S, AA and A by two small products of the weights `[a^(b) | 1]`,
        one pass over the rows for AU and S together. The buffers are kept for the next chunk of
        as many rows: a fresh one per chunk costs its page faults (~0.7 ms of ~25 for a 256-row
        chunk of 2688 columns; a map task maps every buffer of 1 MiB or more anew, `workers.heap`)."""
        widths = [block.shape[1] for block in blocks]
        starts = np.concatenate(([0], np.cumsum(widths)))
        if self.n == 0:
            # Any shift is exact; one near the data keeps the sums centred (METRICS.md numerics).
            self.shift = np.concatenate([block.mean(axis=0, dtype=np.float64) for block in blocks])
        shifted, weights = self._chunk_buffers(len(blocks[0]), starts[-1], len(blocks))
        for b, block in enumerate(blocks):
            part = shifted[:, starts[b]:starts[b + 1]]
            np.subtract(block, self.shift[starts[b]:starts[b + 1]], out=part, dtype=np.float64)
            np.einsum("ij,ij->i", part, part, out=weights[b])
        self.n += len(shifted)
        self.cross_products.add(shifted, self.device)
        weighted = weights @ shifted  # rows: sum_i a_i^(b) u_i for each b, then sum_i u_i
        self.norm_weighted_sum += weighted[:-1]
        self.row_sum += weighted[-1]
        weight_products = weights[:-1] @ weights.T
        self.norm_products += weight_products[:, :-1]
        self.norm_sum += weight_products[:, -1]

    def add_tensors(self, blocks: list) -> None:
        """`add_blocks` of torch tensors on their own device (a capture's exact and stored values on
        its GPU): the shifted rows and G stay there (float64), only the O(B D) moments come home."""
        import torch

        widths = [block.shape[1] for block in blocks]
        starts = np.concatenate(([0], np.cumsum(widths)))
        if self.n == 0:
            self.shift = np.concatenate([block.double().mean(dim=0).cpu().numpy() for block in blocks])
        shift = torch.as_tensor(self.shift, device=blocks[0].device)
        shifted = torch.cat([block.double() - shift[starts[b]:starts[b + 1]] for b, block in enumerate(blocks)], dim=1)
        weights = torch.ones((len(blocks) + 1, len(shifted)), dtype=torch.float64, device=shifted.device)
        for b in range(len(blocks)):
            part = shifted[:, starts[b]:starts[b + 1]]
            weights[b] = (part * part).sum(dim=1)
        self.n += len(shifted)
        self.cross_products.add_tensor(shifted)
        weighted = (weights @ shifted).cpu().numpy()
        weight_products = (weights[:-1] @ weights.T).cpu().numpy()
        self.norm_weighted_sum += weighted[:-1]
        self.row_sum += weighted[-1]
        self.norm_products += weight_products[:, :-1]
        self.norm_sum += weight_products[:, -1]

    def _chunk_buffers(self, rows: int, total: int, blocks: int) -> tuple[np.ndarray, np.ndarray]:
        """The float64 (rows, total) buffer of a chunk's shifted rows and its (blocks + 1, rows)
        weights, whose last row is ones; made again only when the chunk's size changes."""
        if self._buffers is None or self._buffers[0].shape != (rows, total):
            weights = np.empty((blocks + 1, rows))
            weights[-1] = 1.0
            self._buffers = (np.empty((rows, total)), weights)
        return self._buffers

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()  # the chunk buffers are scratch: not pickled, not copied
        state["_buffers"] = None
        return state

    def move_shift(self, new_shift: np.ndarray) -> None:
        """Re-express the moments relative to `new_shift`, exactly, in place.

        With `δ = new_shift - shift`, `u' = u - δ`, `p_i^(b) = u_i^(b)·δ^(b)` and
        `e_b = ||δ^(b)||^2`: `a' = a - 2p + e`, so
        `S' = S - nδ`, `G' = G - Sδ^T - δS^T + nδδ^T`,
        `A' = A - 2P + n e` (P = sum p), `AU' = AU - 2 sum_i p_i u_i^T + e S^T - A' δ^T`,
        `AA' = AA - 2(AP + AP^T) + 4 PP + (A - 2P) e^T + e (A - 2P)^T + n e e^T`
        with `AP_bb' = sum a^(b) p^(b')` and `PP_bb' = sum p^(b) p^(b')`.
        """
        delta = new_shift - self.shift
        if not delta.any():  # partial states of one shift (or a move to where it is) add as they are
            return
        block_of_column = np.repeat(np.arange(len(self.widths)), self.widths)
        # Column b of delta_blocks holds δ^(b) in block b's rows and zeros elsewhere, so that
        # u_i @ delta_blocks = p_i for all blocks at once.
        delta_blocks = np.zeros((len(delta), len(self.widths)))
        delta_blocks[np.arange(len(delta)), block_of_column] = delta
        projection_weighted_sum = self.cross_products.times(delta_blocks).T
        projection_sum = self.row_sum @ delta_blocks
        projection_products = delta_blocks.T @ projection_weighted_sum.T
        norm_projection_products = self.norm_weighted_sum @ delta_blocks
        delta_norms = block_sums(delta * delta, self.widths, axis=0)

        partial_norm_sum = self.norm_sum - 2 * projection_sum
        new_norm_sum = partial_norm_sum + self.n * delta_norms
        self.norm_products += (
            -2 * (norm_projection_products + norm_projection_products.T)
            + 4 * projection_products
            + np.outer(partial_norm_sum, delta_norms)
            + np.outer(delta_norms, partial_norm_sum)
            + self.n * np.outer(delta_norms, delta_norms)
        )
        self.norm_weighted_sum += (
            -2 * projection_weighted_sum
            + np.outer(delta_norms, self.row_sum)
            - np.outer(new_norm_sum, delta)
        )
        self.norm_sum = new_norm_sum
        # G - Sδ^T - δS^T + nδδ^T = G + wδ^T + δw^T with w = nδ/2 - S: one symmetric rank-2
        # update in place (BLAS dsyr2 on the upper triangle), no D x D temporary.
        self.cross_products.add_rank2(self.n / 2 * delta - self.row_sum, delta)
        self.row_sum -= self.n * delta
        self.shift = self.shift + delta

    def absorb(self, other: FeatureMoments) -> None:
        """Add another accumulator's rows: move this one to the other's shift, then add moments.
        `other` is only read (it may be a read-only buffer from Ray's object store)."""
        self.move_shift(other.shift)
        self.n += other.n
        self.row_sum += other.row_sum
        self.cross_products.merge(other.cross_products)
        self.norm_sum += other.norm_sum
        self.norm_weighted_sum += other.norm_weighted_sum
        self.norm_products += other.norm_products

    def centred(self, in_place: bool = False) -> FeatureMoments:
        """Moved to the exact mean: its G blocks are `Xc_b^T Xc_b'`, its A holds `s_b` and its AA
        holds `r_b^T r_b'`. A copy (the state itself is unchanged), or with `in_place` this state
        itself, moved where it lies (no D x D copy; the moments are the same to rounding)."""
        centred = self if in_place else copy.deepcopy(self)
        centred.move_shift(self.shift + self.row_sum / self.n)
        return centred

    def pairwise_statistics(self, with_hsic: bool, in_place: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        """`(||Xc_b^T Xc_b'||_F^2, HSIC_u(K_b, K_b') or None)` for all block pairs (B x B each).

        Works on the state moved to the exact mean (`centred`: a copy, or with `in_place` the
        state itself), so the blocks of G are `Xc_b^T Xc_b'`, `A` holds `s_b` and `AA` holds
        `r_b^T r_b'` (METRICS.md feature-space form).
        """
        centred = self.centred(in_place)
        cross_sq = centred.cross_products.block_square_sums(self.widths)
        if not with_hsic:
            return cross_sq, None
        hsic = hsic_u_from_moments(
            cross_sq,
            centred.norm_products,
            centred.norm_sum[:, None],
            centred.norm_sum[None, :],
            self.n,
        )
        return cross_sq, hsic
