"""Linear CKA (biased and debiased) with a grouped Poisson bootstrap: the replicates cost O(G^3)
each, whatever the number of samples n.

Grouped Poisson bootstrap (Chamandy, Muralidharan, Najmi & Naidu 2012, "Estimating uncertainty for
massive data streams", who resample units coarser than a row; random groups as in the method of
random groups, Wolter 2007, "Introduction to Variance Estimation", ch. 2): row i belongs to group
`g(i) = hash(seed, i) mod G` (`resampling.sample_groups`), replicate r draws group g
`w_rg ~ Poisson(1)` times (`resampling.group_poisson_weights`), and every row of a group shares its
weight. Replicate r's CKA is that of the multiset in which row i appears `w_r,g(i)` times, biased
and debiased exactly as in `uncertain_cka` (no row pairs with a copy of itself). The groups are
random i.i.d. subsets, so for a smooth function of moments such as CKA the replicates estimate the
per-row bootstrap's sampling variance (times 1 - 1/G), with about G - 1 degrees of freedom: the
standard error's relative error from the grouping is about 1 / sqrt(2 (G - 1)).

State: per group, the float64 moments of its stacked rows (`moments.FeatureMoments`: count n_g,
sum s_g, X^T X, the row norms' sums), so memory is G x D^2 whatever n, mergeable in any order. The
finalize moves every group, exactly, to the sample's mean (the centre `uncertain_cka` uses too).
For a block pair (a, b) with group moments `S_g = X_g^T Y_g` (da x db), `s_g`, `t_g` (the column
sums of X_g, Y_g), `rho_g = sum_i r_i q_i`, `u_g = sum_i r_i y_i`, `v_g = sum_i q_i x_i` over the
group's rows (`r_i = ||x_i||^2`, `q_i = ||y_i||^2`), and per replicate `S(w) = sum_g w_g S_g`,
`s(w)`, `t(w)`, `N(w) = sum_g w_g n_g`:

- biased: `||C(w)||_F^2` with `C(w) = S(w) - s(w) t(w)^T / N(w)` (the weighted centring is shift
  invariant): `w^T Q w - 2 T[w, w, w] / N + ||s(w)||^2 ||t(w)||^2 / N^2`, with the G x G Frobenius
  Gram `Q_gh = <S_g, S_h>` and `T_ghk = s_g^T S_h t_k` (G x G x G), each ~ G^2 da db to form;
- debiased (`cka.hsic_u_from_grams` with n -> N(w); the sum over i != j with multiplicities
  `w_i w_j` is the full sum minus `sum_i w_i^2` times the diagonal):
  `tr(K~ L~) = w^T Q w - sum_g w_g^2 rho_g`, `1^T K~ 1 = ||s(w)||^2 - sum_g w_g^2 tr(X_g^T X_g)`,
  `1^T K~ L~ 1 = T[w, w, w] - sum_g w_g^2 (u_g . t(w) + v_g . s(w)) + sum_g w_g^3 rho_g`.

Weights of all ones give the sample's CKA through the same formulas. Cost: the per-group moments
are the plain feature-space query's syrk, `n D^2 / 2`; the finalize ~ 2 G^2 da db per product
(Q and S_h t_k) plus (B + 1) G^3 for the replicates (`grouped_bootstrap_cost`).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np

from .cka import hsic_u_from_grams, normalised
from .inputs import FLOAT64_BYTES, MIN_HSIC_SAMPLES, block_starts, validated_blocks, validated_widths
from .moments import FeatureMoments
from .resampling import group_poisson_weights, sample_groups
from .uncertain_cka import ResampledCKAStats

PENDING_ROWS_PER_GROUP = 32  # rows are buffered until each group gets ~32 at once: one syrk per group
PENDING_BYTES = 32 << 20  # ... or until the buffer holds this much as float64


def _products(pairs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The block products a set of pairs needs: each pair (sorted) and every used block with itself."""
    used = sorted({x for pair in pairs for x in pair})
    return sorted({tuple(sorted(p)) for p in pairs} | {(b, b) for b in used})


def grouped_bootstrap_cost(block_widths: Sequence[int], pairs: Sequence[tuple[int, int]], n: int,
                           replicates: int, groups: int) -> float:
    """Multiply-adds of the grouped bootstrap: the per-group syrk of the used blocks' rows
    (`n D^2 / 2`), then per product (a, b) `Q` and the `S_h t_k` of `T` (2 G^2 da db), `T`'s
    contraction with the s_g (G^3 da) and the (B + 1) replicates' cubic forms (G^3)."""
    widths = validated_widths(block_widths)
    used_width = sum(widths[b] for b in sorted({x for pair in pairs for x in pair}))
    finalize = sum(2 * groups**2 * widths[a] * widths[b] + groups**3 * (widths[a] + replicates + 1)
                   for a, b in _products(pairs))
    return n * used_width**2 / 2 + finalize


class GroupedBootstrapCKA:
    """Streaming CKA of the block `pairs` with `replicates` grouped-Poisson-bootstrap replicates
    over `groups` random groups, seeded by `seed`.

    Feed chunks with `seek(first_row)` + `update(blocks)`, `merge` partial accumulators in any
    order, then `finalize` (a `ResampledCKAStats` without a null). Rows wait in a buffer (at most
    `PENDING_BYTES` as float64) so that each group's moments grow by one syrk of many rows;
    pickling (how a map task returns its accumulator) flushes it, so those products run in the
    single-threaded map tasks rather than in the reducer.
    """

    def __init__(self, block_widths: Sequence[int], pairs: Sequence[tuple[int, int]], replicates: int,
                 groups: int, seed: int = 0) -> None:
        self.block_widths = validated_widths(block_widths)
        self.pairs = tuple((int(a), int(b)) for a, b in pairs)
        if not self.pairs or any(not (0 <= x < len(self.block_widths)) for pair in self.pairs for x in pair):
            raise ValueError(f"pairs must name blocks in 0..{len(self.block_widths) - 1}, got {self.pairs}")
        if replicates < 0 or groups < 1:
            raise ValueError(f"replicates must be >= 0 and groups >= 1, got {replicates} and {groups}")
        self.replicates, self.groups, self.seed = int(replicates), int(groups), int(seed)
        self.used = sorted({x for pair in self.pairs for x in pair})
        self.used_widths = tuple(self.block_widths[b] for b in self.used)
        self._moments: dict[int, FeatureMoments] = {}
        self._pending: list[tuple[int, np.ndarray]] = []
        self._next_row = 0

    @staticmethod
    def state_nbytes(block_widths: Sequence[int], pairs: Sequence[tuple[int, int]], groups: int) -> int:
        """Bytes of one accumulator's state: every group's moments plus the row buffer."""
        widths = validated_widths(block_widths)
        used = tuple(widths[b] for b in sorted({x for pair in pairs for x in pair}))
        pending = min(PENDING_ROWS_PER_GROUP * groups * FLOAT64_BYTES * sum(used), PENDING_BYTES)
        return groups * FeatureMoments.estimate_nbytes(used) + pending

    @staticmethod
    def estimate_peak_nbytes(block_widths: Sequence[int], pairs: Sequence[tuple[int, int]], groups: int,
                             replicates: int, tasks: int) -> int:
        """Bytes held at the peak of a query's reduce and finalize: `tasks` partial states and
        their merge, plus the finalize's largest product (its G group blocks, T and the
        replicates' contraction of T)."""
        widths = validated_widths(block_widths)
        largest = max(widths[a] * widths[b] for a, b in _products(pairs))
        finalize = FLOAT64_BYTES * (groups * largest + 2 * groups**3 + (replicates + 1) * groups**2)
        return (tasks + 1) * GroupedBootstrapCKA.state_nbytes(widths, pairs, groups) + finalize

    def __getstate__(self) -> dict:
        self._flush()
        return self.__dict__.copy()

    @property
    def n(self) -> int:
        return sum(m.n for m in self._moments.values()) + sum(len(rows) for _, rows in self._pending)

    def seek(self, row: int) -> None:
        """The global index of the next chunk's first row (the map task's range start)."""
        self._next_row = int(row)

    def update(self, blocks: Sequence[np.ndarray]) -> None:
        """Add one chunk: `blocks[b]` has shape (rows, block_widths[b]); float16/32 rows wait in
        the buffer as they are and are upcast before any product."""
        matrices = validated_blocks(blocks, self.block_widths, upcast=False)
        if len(matrices[0]):
            self._pending.append((self._next_row, np.concatenate([matrices[b] for b in self.used], axis=1)))
            self._next_row += len(matrices[0])
            buffered = sum(len(rows) for _, rows in self._pending)
            if buffered >= min(PENDING_ROWS_PER_GROUP * self.groups,
                               PENDING_BYTES // (FLOAT64_BYTES * sum(self.used_widths))):
                self._flush()

    def _flush(self) -> None:
        """Add the buffered rows to their groups' moments, one group at a time."""
        if not self._pending:
            return
        rows = np.concatenate([chunk for _, chunk in self._pending])
        index = np.concatenate([np.arange(first, first + len(chunk)) for first, chunk in self._pending])
        self._pending = []
        group = sample_groups(self.seed, index, self.groups)
        order = np.argsort(group, kind="stable")
        bounds = np.concatenate(([0], np.cumsum(np.bincount(group, minlength=self.groups))))
        for g in np.flatnonzero(np.diff(bounds)):
            moments = self._moments.setdefault(int(g), FeatureMoments(self.used_widths))
            moments.add_rows(rows[order[bounds[g]: bounds[g + 1]]].astype(np.float64))

    def merge(self, other: GroupedBootstrapCKA) -> GroupedBootstrapCKA:
        """Add `other`'s rows (in place; `other` is only read) and return self."""
        if (other.block_widths, other.pairs, other.replicates, other.groups, other.seed) != (
                self.block_widths, self.pairs, self.replicates, self.groups, self.seed):
            raise ValueError("cannot merge grouped-bootstrap CKA accumulators of different blocks, pairs, "
                             "replicates, groups or seeds")
        self._pending.extend(other._pending)
        self._flush()
        for g, moments in other._moments.items():
            if g in self._moments:
                self._moments[g].absorb(moments)
            else:
                self._moments[g] = copy.deepcopy(moments)
        return self

    def finalize(self) -> ResampledCKAStats:
        """The sample's CKA and the bootstrap replicates', per pair. The rows represented do not
        change; the buffer is flushed and every group's moments move to the sample's mean."""
        self._flush()
        if not self._moments:
            raise ValueError("no rows were added; CKA needs at least one sample")
        groups = sorted(self._moments)
        moments = [self._moments[g] for g in groups]
        counts = np.array([m.n for m in moments], dtype=np.float64)
        mean = sum(m.shift * m.n + m.row_sum for m in moments) / counts.sum()
        for m in moments:
            m.move_shift(mean)  # exact: every group's rows are now centred at the sample's mean
        weights = np.vstack([np.ones(len(groups)), group_poisson_weights(self.seed, self.replicates,
                                                                         self.groups)[:, groups]])
        size = weights @ counts
        starts = block_starts(self.used_widths)
        span = {b: slice(starts[k], starts[k] + self.used_widths[k]) for k, b in enumerate(self.used)}
        group_sums = {b: np.array([m.row_sum[span[b]] for m in moments]) for b in self.used}
        terms = {}
        for a, b in _products(self.pairs):
            ka, kb = self.used.index(a), self.used.index(b)
            parts = {"cross": np.array([m.cross_products.matrix()[span[a], span[b]] for m in moments]),
                     "sums_a": group_sums[a], "sums_b": group_sums[b],
                     "rho": np.array([m.norm_products[ka, kb] for m in moments]),
                     "norms_a": np.array([m.norm_sum[ka] for m in moments]),
                     "norms_b": np.array([m.norm_sum[kb] for m in moments]),
                     "u": np.array([m.norm_weighted_sum[ka, span[b]] for m in moments]),
                     "v": np.array([m.norm_weighted_sum[kb, span[a]] for m in moments])}
            terms[(a, b)] = _product_terms(parts, weights, size)
        cka = [np.stack([normalised(terms[tuple(sorted(p))][v], terms[(p[0], p[0])][v], terms[(p[1], p[1])][v])
                         for p in self.pairs], 1) for v in (0, 1)]
        empty = np.zeros((0, len(self.pairs)))
        return ResampledCKAStats(cka[0][0], cka[1][0], cka[0][1:], cka[1][1:], empty, empty, int(counts.sum()))


def _product_terms(parts: dict, weights: np.ndarray, size: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`||C(w)||_F^2` and the unbiased HSIC of one block product for every weight row, (R+1,) each,
    from its groups' centred moments: `cross` S_g (G, da, db), `sums_a` s_g, `sums_b` t_g, `rho`,
    `norms_a` tr(X_g^T X_g), `norms_b`, `u` = sum r y, `v` = sum q x (module docstring)."""
    cross = parts["cross"]
    groups = len(cross)
    flat = cross.reshape(groups, -1)
    quadratic = np.einsum("rg,rg->r", weights @ (flat @ flat.T), weights)  # w^T Q w
    tensor = np.einsum("gi,hik->ghk", parts["sums_a"], cross @ parts["sums_b"].T)  # T_ghk = s_g^T S_h t_k
    cubic = np.einsum("rhk,rh,rk->r", (weights @ tensor.reshape(groups, -1)).reshape(-1, groups, groups),
                      weights, weights)
    sums_a, sums_b = weights @ parts["sums_a"], weights @ parts["sums_b"]  # s(w), t(w)
    norm_a, norm_b = np.einsum("ri,ri->r", sums_a, sums_a), np.einsum("ri,ri->r", sums_b, sums_b)
    squared = weights * weights
    with np.errstate(divide="ignore", invalid="ignore"):
        biased = quadratic - 2 * cubic / size + norm_a * norm_b / size**2
        trace = quadratic - squared @ parts["rho"]
        total_a, total_b = norm_a - squared @ parts["norms_a"], norm_b - squared @ parts["norms_b"]
        row_dot = (cubic - np.einsum("rg,rg->r", squared, sums_b @ parts["u"].T)
                   - np.einsum("rg,rg->r", squared, sums_a @ parts["v"].T) + (squared * weights) @ parts["rho"])
        hsic = hsic_u_from_grams(trace, total_a, total_b, row_dot, size)
    return biased, np.where(size >= MIN_HSIC_SAMPLES, hsic, np.nan)
