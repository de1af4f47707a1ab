"""Linear CKA (biased and debiased) with a Poisson bootstrap and a permutation null, in one pass.

The accumulator keeps the rows with their global row indices (the Gram-space state of
`gram.py`: mergeable in any order), and `finalize` evaluates, for the sample itself and for each
bootstrap replicate r with weights `w_r` (`resampling.poisson_weights`, a function of (seed, r,
row index) only), the CKA of the resampled multiset in which row i appears `w_ri` times:

- biased (Kornblith et al. 2019), with weighted centring `H_w = I - 1 w^T / W`, `W = sum w`:
  `N_KL(w) = sum_ij w_i w_j (H_w K H_w^T)_ij L_ij = w^T (K o L) w - 2 (Kw o Lw)^T w / W
  + (w^T K w)(w^T L w) / W^2` and `CKA = N_KL / sqrt(N_KK N_LL)`;
- debiased: the unbiased HSIC (Song et al. 2007) of the multiset of W rows in which, as the zero
  diagonal intends, no row pairs with a copy of itself (the Gram of the repeated rows with every
  copy-copy block zeroed): `tr(K~ L~) = w^T (K o L) w - sum_i w_i^2 K_ii L_ii`,
  `1^T K~ 1 = w^T K w - sum_i w_i^2 K_ii`,
  `1^T K~ L~ 1 = sum_i w_i (Kw - w o diag K)_i (Lw - w o diag L)_i`, n -> W. An approximation
  of a fresh sample's HSIC_u (docs/metrics.md); counting copies as distinct samples instead
  inflates every replicate.

Only `w^T (K o L) w` needs the n x n Grams: it is summed over strips of rows of their upper
triangle (n^2 R / 2 per block pair, on top of the n^2 D / 2 of the Grams); `Kw = Xc (Xc^T w)`
costs O(n d R). Weights of all ones give
the point estimate through the same formulas.

The permutation null compares A with B's rows permuted (`resampling.null_permutation`, a seeded
bijection of the global row index): only the cross term changes, `||Xc^T P Yc||_F^2` in feature
space (O(n dx dy) per permutation) and `r_x^T P r_y` for the unbiased HSIC; the self terms are
the sample's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .cka import hsic_u_from_grams, hsic_u_from_moments, normalised
from .gram import GRAM_STRIP_BYTES
from .inputs import FLOAT64_BYTES, MIN_HSIC_SAMPLES, block_starts, validated_blocks, validated_widths
from .resampling import null_permutation, poisson_weights


@dataclass(frozen=True)
class ResampledCKAStats:
    """Per requested block pair (P of them): the CKA of the sample (`biased`, `debiased`, shape
    (P,)), of each bootstrap replicate (`bootstrap_*`, (R, P)) and of each permutation of B's rows
    (`null_*`, (Q, P)). NaN where a variant is undefined (a constant block, fewer than 4 rows)."""

    biased: np.ndarray
    debiased: np.ndarray
    bootstrap_biased: np.ndarray
    bootstrap_debiased: np.ndarray
    null_biased: np.ndarray
    null_debiased: np.ndarray
    n: int


def _strip_height(n: int, blocks: int, strip_bytes: int) -> int:
    """Rows of the Grams formed at once: the strips of `blocks` Grams plus one product fit."""
    return int(min(max(n, 1), max(1, strip_bytes // (FLOAT64_BYTES * (blocks + 1) * max(n, 1)))))


def exact_bootstrap_cost(block_widths: Sequence[int], pairs: Sequence[tuple[int, int]], n: int,
                         replicates: int) -> float:
    """Multiply-adds of `ResampledCKA.finalize` with `replicates` replicates (no null): per strip
    of the Grams' upper triangle (with its diagonal squares 5/8 of the square once there are four
    strips) the used blocks' Grams and one Hadamard quadratic per product and weight row,
    `5/8 n^2 (D + P (B + 1))`, plus `Kw` for every used block, `2 n D (B + 1)`."""
    widths = validated_widths(block_widths)
    used = sorted({x for pair in pairs for x in pair})
    width = sum(widths[b] for b in used)
    products = len({tuple(sorted(p)) for p in pairs} | {(b, b) for b in used})
    columns = replicates + 1
    return 5 / 8 * n * n * (width + products * columns) + 2 * n * width * columns


class ResampledCKA:
    """Streaming CKA of the block `pairs`, with `replicates` Poisson-bootstrap replicates and
    `permutations` permutations of the second block's rows, all seeded by `seed`.

    Feed chunks with `seek(first_row)` + `update(blocks)` (rows `first_row`, `first_row + 1`, ...
    of the whole sample), `merge` partial accumulators in any order, then `finalize`. Memory: the
    rows as they came (O(n D)); `estimate_peak_nbytes` adds what `finalize` allocates.
    """

    def __init__(self, block_widths: Sequence[int], pairs: Sequence[tuple[int, int]], replicates: int = 0,
                 permutations: int = 0, seed: int = 0, strip_bytes: int = GRAM_STRIP_BYTES) -> None:
        self.block_widths = validated_widths(block_widths)
        self.pairs = tuple((int(a), int(b)) for a, b in pairs)
        if not self.pairs or any(not (0 <= x < len(self.block_widths)) for pair in self.pairs for x in pair):
            raise ValueError(f"pairs must name blocks in 0..{len(self.block_widths) - 1}, got {self.pairs}")
        if replicates < 0 or permutations < 0:
            raise ValueError("replicates and permutations must be >= 0")
        self.replicates, self.permutations, self.seed = int(replicates), int(permutations), int(seed)
        self.strip_bytes = int(strip_bytes)
        self._chunks: list[tuple[int, np.ndarray]] = []
        self._next_row = 0

    @property
    def n(self) -> int:
        return sum(len(rows) for _, rows in self._chunks)

    @property
    def nbytes(self) -> int:
        return sum(rows.nbytes for _, rows in self._chunks)

    @staticmethod
    def estimate_peak_nbytes(block_widths: Sequence[int], pairs: Sequence[tuple[int, int]], n: int,
                             replicates: int, permutations: int, itemsize: int = FLOAT64_BYTES,
                             strip_bytes: int = GRAM_STRIP_BYTES) -> int:
        """Bytes held at the peak of `finalize` after n rows fed as `itemsize`-byte floats: the
        rows twice (kept + sorted), the used blocks centred in float64, the weights and `Kw` per
        used block ((R+1) x n each), one strip of Grams and, with a null, one permuted block."""
        widths = validated_widths(block_widths)
        used = sorted({x for pair in pairs for x in pair})
        used_width = sum(widths[b] for b in used)
        columns = replicates + 1
        height = _strip_height(n, len(used), strip_bytes)
        strip = FLOAT64_BYTES * ((len(used) + 1) * height * n + height * columns)
        null = FLOAT64_BYTES * (n * max(widths[b] for _, b in pairs) + max(widths) ** 2) if permutations else 0
        return (2 * itemsize * n * sum(widths) + FLOAT64_BYTES * (n * used_width + columns * n * (len(used) + 1))
                + strip + null)

    def seek(self, row: int) -> None:
        """The global index of the next chunk's first row (the map task's range start)."""
        self._next_row = int(row)

    def update(self, blocks: Sequence[np.ndarray]) -> None:
        """Add one chunk: `blocks[b]` has shape (rows, block_widths[b]); float16/32 rows are kept
        as they are (exact) and upcast before any product."""
        matrices = validated_blocks(blocks, self.block_widths, upcast=False)
        if len(matrices[0]):
            self._chunks.append((self._next_row, np.concatenate(matrices, axis=1)))
            self._next_row += len(matrices[0])

    def merge(self, other: ResampledCKA) -> ResampledCKA:
        """Add `other`'s rows (in place; `other` is unchanged) and return self."""
        if (other.block_widths, other.pairs, other.replicates, other.permutations, other.seed) != (
                self.block_widths, self.pairs, self.replicates, self.permutations, self.seed):
            raise ValueError("cannot merge resampled CKA accumulators of different blocks, pairs or resampling")
        self._chunks.extend(other._chunks)
        return self

    def finalize(self) -> ResampledCKAStats:
        """The sample's CKA, the bootstrap replicates' and the null's, per pair (state unchanged)."""
        if not self._chunks:
            raise ValueError("no rows were added; CKA needs at least one sample")
        chunks = sorted(self._chunks, key=lambda chunk: chunk[0])
        rows = np.concatenate([chunk for _, chunk in chunks])
        index = np.concatenate([np.arange(first, first + len(chunk)) for first, chunk in chunks])
        n = len(rows)
        if len(np.unique(index)) != n:
            raise ValueError("two chunks claim the same global rows: seek() each chunk's first row")
        weights = np.vstack([np.ones(n), poisson_weights(self.seed, self.replicates, index)])
        used = sorted({x for pair in self.pairs for x in pair})
        starts = block_starts(self.block_widths)
        centred, diagonal, kw = {}, {}, {}
        for b in used:
            part = rows[:, starts[b]: starts[b] + self.block_widths[b]].astype(np.float64)
            part -= part.mean(axis=0)
            centred[b] = part
            diagonal[b] = np.einsum("ij,ij->i", part, part)
            kw[b] = part @ (part.T @ weights.T)  # K_b w for every replicate: (n, R+1)
        products = sorted({tuple(sorted(p)) for p in self.pairs} | {(b, b) for b in used})
        quadratic = self._hadamard_quadratics(centred, weights, used, products)
        total = weights.sum(axis=1)
        wkw = {b: np.einsum("ri,ir->r", weights, kw[b]) for b in used}

        def biased_term(a: int, b: int) -> np.ndarray:
            cross = np.einsum("ri,ir,ir->r", weights, kw[a], kw[b])
            return quadratic[tuple(sorted((a, b)))] - 2 * cross / total + wkw[a] * wkw[b] / total**2

        squared = weights * weights  # copies of one row never pair: w_i^2 of the n x n diagonal goes

        def hsic_term(a: int, b: int) -> np.ndarray:
            trace = quadratic[tuple(sorted((a, b)))] - squared @ (diagonal[a] * diagonal[b])
            tot_a, tot_b = wkw[a] - squared @ diagonal[a], wkw[b] - squared @ diagonal[b]
            row_a, row_b = kw[a] - weights.T * diagonal[a][:, None], kw[b] - weights.T * diagonal[b][:, None]
            row_dot = np.einsum("ri,ir,ir->r", weights, row_a, row_b)
            with np.errstate(divide="ignore", invalid="ignore"):
                hsic = hsic_u_from_grams(trace, tot_a, tot_b, row_dot, total)
            return np.where(total >= MIN_HSIC_SAMPLES, hsic, np.nan)

        self_biased = {b: biased_term(b, b) for b in used}
        self_hsic = {b: hsic_term(b, b) for b in used}
        biased = np.stack([normalised(biased_term(a, b), self_biased[a], self_biased[b]) for a, b in self.pairs], 1)
        debiased = np.stack([normalised(hsic_term(a, b), self_hsic[a], self_hsic[b]) for a, b in self.pairs], 1)
        null_biased, null_debiased = self._null(centred, diagonal, self_biased, self_hsic, n)
        return ResampledCKAStats(biased[0], debiased[0], biased[1:], debiased[1:], null_biased, null_debiased, n)

    def _hadamard_quadratics(self, centred: dict, weights: np.ndarray, used: list[int],
                             products: list[tuple[int, int]]) -> dict[tuple[int, int], np.ndarray]:
        """`w_r^T (K_a o K_b) w_r` for every product pair and weight row, over strips of rows of
        the upper triangle (the product is symmetric: a strip's part right of its diagonal square
        counts twice, the square once, so each entry is multiplied by the weights once)."""
        n = len(weights[0])
        quadratic = {p: np.zeros(len(weights)) for p in products}
        # at least four strips once n is large: the upper triangle then costs (1 + 1/4) / 2 of the square
        height = min(_strip_height(n, len(used), self.strip_bytes), max(256, -(-n // 4)))
        for first in range(0, n, height):
            last = min(first + height, n)
            grams = {b: centred[b][first:last] @ centred[b][first:].T for b in used}  # (strip, n - first)
            strip_weights = weights[:, first:last]
            for a, b in products:
                hadamard = grams[a] * grams[b]
                height_now = last - first
                right = np.einsum("ri,ir->r", strip_weights, hadamard[:, height_now:] @ weights[:, last:].T)
                square = np.einsum("ri,ir->r", strip_weights, hadamard[:, :height_now] @ strip_weights.T)
                quadratic[(a, b)] += 2 * right + square
        return quadratic

    def _null(self, centred: dict, diagonal: dict, self_biased: dict, self_hsic: dict, n: int
              ) -> tuple[np.ndarray, np.ndarray]:
        """CKA of A against B's rows permuted, per permutation and pair: (Q, P) each."""
        null_biased = np.full((self.permutations, len(self.pairs)), np.nan)
        null_debiased = np.full((self.permutations, len(self.pairs)), np.nan)
        for p in range(self.permutations):
            order = null_permutation(self.seed, p, n)
            for k, (a, b) in enumerate(self.pairs):
                cross = centred[a].T @ centred[b][order]
                cross_sq = float(np.vdot(cross, cross))
                null_biased[p, k] = normalised(cross_sq, self_biased[a][0], self_biased[b][0])
                if n >= MIN_HSIC_SAMPLES:
                    hsic = hsic_u_from_moments(cross_sq, diagonal[a] @ diagonal[b][order], diagonal[a].sum(),
                                               diagonal[b].sum(), n)
                    null_debiased[p, k] = normalised(hsic, self_hsic[a][0], self_hsic[b][0])
        return null_biased, null_debiased
