"""Linear CKA (biased and debiased) with a grouped Poisson bootstrap: the replicates cost O(G^3)
each, whatever the number of samples n.

Grouped Poisson bootstrap (Chamandy, Muralidharan, Najmi & Naidu 2012, "Estimating uncertainty for
massive data streams", who resample units coarser than a row; random groups as in the method of
random groups, Wolter 2007, "Introduction to Variance Estimation", ch. 2): row i belongs to group
`g(i) = hash(seed, i) mod G` (`resampling.sample_groups`), replicate r draws group g
`w_rg ~ Poisson(1)` times (`resampling.group_poisson_weights`), and every row of a group shares its
weight. Replicate r's CKA is that of the multiset in which row i appears `w_r,g(i)` times, and, in
both variants, no copy of a row pairs with another copy of it (each pairs with itself only). The
groups are random i.i.d. subsets, so for a smooth function of moments such as CKA the replicates
estimate the per-row bootstrap's sampling variance (times 1 - 1/G), with about G - 1 degrees of
freedom: the standard error's relative error from the grouping is about 1 / sqrt(2 (G - 1)).

Biased CKA differs from `uncertain_cka`'s plug-in of the multiset, whose copy pairs add a
duplication bias (~ width / n) that per-row weights keep nearly constant but whole repeated groups
make vary, widening the interval (1.35-1.7x at n = 1000, width 48; ~9x at n = 4096, width 384).
Here the copy pairs are left out and the weights scaled by `f = n / N(w)` (the sample's size, as
the multinomial bootstrap has): the biased HSIC numerator of the multiset of weights `f w_i`
whose same-row terms carry `f w_i` (a copy with itself) instead of `(f w_i)^2`. Its replicates
centre on the estimate and keep the exact bootstrap's width (tests/metrics/test_grouped_bootstrap.py).

State: per group and per block product (a, b) the pair and each used block with itself, float64
sums of the rows minus a fixed shift per block (the same in every task, e.g. the run's stored
means): count n_g, sums, `X_g^T Y_g` (self products: the upper triangle, one syrk), and the row
norms' sums below. Memory G x (sum of da db) whatever n; partial states simply add, in any order.
The products are independent until the CKA's normalisation, so accumulators fed the same rows can
share them out (`GroupedBootstrapCKA.split`: one pair's (a, b) beside its (a, a) and (b, b)).
The finalize centres every group's terms, exactly, at the sample's mean (the centre `uncertain_cka`
uses too) by algebra on the sums about the shift, without moving the d x d group products (`_centred`).
For a block pair (a, b) with group moments `S_g = X_g^T Y_g` (da x db), `s_g`, `t_g` (the column
sums of X_g, Y_g), `rho_g = sum_i r_i q_i`, `u_g = sum_i r_i y_i`, `v_g = sum_i q_i x_i` over the
group's rows (`r_i = ||x_i||^2`, `q_i = ||y_i||^2`), and per replicate `S(w) = sum_g w_g S_g`,
`s(w)`, `t(w)`, `N(w) = sum_g w_g n_g`:

- debiased (`cka.hsic_u_from_grams` with n -> N(w); the sum over i != j with multiplicities
  `w_i w_j` is the full sum minus `sum_i w_i^2` times the diagonal), with the G x G Frobenius
  Gram `Q_gh = <S_g, S_h>` and `T_ghk = s_g^T S_h t_k` (G x G x G), each ~ G^2 da db to form:
  `tr(K~ L~) = w^T Q w - sum_g w_g^2 rho_g`, `1^T K~ 1 = ||s(w)||^2 - sum_g w_g^2 tr(X_g^T X_g)`,
  `1^T K~ L~ 1 = T[w, w, w] - sum_g w_g^2 m_g + sum_g w_g^3 rho_g`, `m_g = u_g . t(w) + v_g . s(w)`;
- biased, with `w' = f w`: `tr' = f^2 tr(K~ L~) + sum_g w'_g rho_g`, `1^T K' 1 = f^2 1^T K~ 1 +
  sum_g w'_g tr(X_g^T X_g)`, `1^T K' L' 1 = f^3 (T[w, w, w] - sum_g w_g^2 m_g) + f^2 sum_g w_g m_g
  + sum_g w'_g (w'_g - 1)^2 rho_g`, and `HSIC_b = tr' - 2/n 1^T K' L' 1 + (1^T K' 1)(1^T L' 1)/n^2`
  (the 1/n^2 cancels in the CKA). At w = 1 this is the biased CKA of the sample.

Weights of all ones give the sample's CKA through the same formulas. Cost: the per-group moments
are the plain feature-space query's syrk, `n D^2 / 2`; the finalize ~ 2 G^2 da db per product
(Q and S_h t_k; half that for a block with itself, from its upper triangle) plus (B + 1) G^3 for
the replicates (`grouped_bootstrap_cost`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .._numerics import _add_gemm, _add_syrk_upper, _upper_triangular_products
from .cka import hsic_u_from_grams, normalised
from .inputs import FLOAT64_BYTES, MIN_HSIC_SAMPLES, validated_blocks, validated_widths
from .resampling import group_poisson_weights, sample_groups
from .uncertain_cka import ResampledCKAStats

PENDING_ROWS_PER_GROUP = 256  # rows are buffered until each group gets ~256 at once: one syrk per group
# (each product reads and writes the group's d x d sums, so few rows per product leave it memory-bound)
PENDING_BYTES = 32 << 20  # ... or until the buffer holds this much as float64
FAR_SHIFT = 2.0  # S is moved before the algebra when (sum ||x - shift||^2 / sum ||x - mean||^2) times y's passes this


def _products(pairs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The block products a set of pairs needs: each pair (sorted) and every used block with itself."""
    used = sorted({x for pair in pairs for x in pair})
    return sorted({tuple(sorted(p)) for p in pairs} | {(b, b) for b in used})


def _work(block_widths: Sequence[int], product: tuple[int, int]) -> float:
    """A product's share of the work, accumulation and finalize alike: da db, half that for a
    block with itself (syrk, and triangular products in the finalize)."""
    a, b = product
    return block_widths[a] * block_widths[b] / (2 if a == b else 1)


def grouped_bootstrap_cost(block_widths: Sequence[int], pairs: Sequence[tuple[int, int]], n: int,
                           replicates: int, groups: int) -> float:
    """Multiply-adds of the grouped bootstrap: the per-group syrk of the used blocks' rows
    (`n D^2 / 2`), then per product (a, b) `Q` and the `S_h t_k` of `T` (2 G^2 da db, half for
    a block with itself: `_work`), `T`'s contraction with the s_g (G^3 da) and the (B + 1)
    replicates' cubic forms (G^3)."""
    widths = validated_widths(block_widths)
    used_width = sum(widths[b] for b in sorted({x for pair in pairs for x in pair}))
    finalize = sum(2 * groups**2 * _work(widths, (a, b)) + groups**3 * (widths[a] + replicates + 1)
                   for a, b in _products(pairs))
    return n * used_width**2 / 2 + finalize


class GroupedBootstrapCKA:
    """Streaming CKA of the block `pairs` with `replicates` grouped-Poisson-bootstrap replicates
    over `groups` random groups, seeded by `seed`.

    Feed chunks with `seek(first_row)` + `update(blocks)`, `merge` partial accumulators in any
    order, then `finalize` (`GroupedTerms`; its `stats()` are the pairs' CKA, sample and replicates).
    `split` deals the block products between accumulators fed the same rows, whose terms join
    (the products are independent until the CKA's normalisation). Every sum is of the rows minus
    `shifts[b]` (one vector per block, the same in every task: e.g. the run's stored means, so the
    sums stay near the centred ones; default 0), so partial states simply add. Rows wait in a buffer
    (at most `PENDING_BYTES` as float64) so that each group's products take many rows at once;
    pickling (how a map task returns its accumulator) flushes it, so those products run in the
    single-threaded map tasks rather than in the reducer.
    """

    def __init__(self, block_widths: Sequence[int], pairs: Sequence[tuple[int, int]], replicates: int,
                 groups: int, seed: int = 0, shifts: Sequence[np.ndarray] | None = None,
                 products: Sequence[tuple[int, int]] | None = None) -> None:
        self.block_widths = validated_widths(block_widths)
        self.pairs = tuple((int(a), int(b)) for a, b in pairs)
        if not self.pairs or any(not (0 <= x < len(self.block_widths)) for pair in self.pairs for x in pair):
            raise ValueError(f"pairs must name blocks in 0..{len(self.block_widths) - 1}, got {self.pairs}")
        if replicates < 0 or groups < 1:
            raise ValueError(f"replicates must be >= 0 and groups >= 1, got {replicates} and {groups}")
        self.replicates, self.groups, self.seed = int(replicates), int(groups), int(seed)
        needed = _products(self.pairs)
        self.products = needed if products is None else sorted({tuple(sorted(map(int, p))) for p in products})
        if not self.products or not set(self.products) <= set(needed):
            raise ValueError(f"products must be some of {needed} (the pairs' own and each block's with itself)")
        self.used = sorted({x for product in self.products for x in product})
        shifts = [np.zeros(w) for w in self.block_widths] if shifts is None else shifts
        if [np.shape(v) for v in shifts] != [(w,) for w in self.block_widths]:
            raise ValueError(f"shifts must be one vector per block of widths {self.block_widths}")
        self.shifts = tuple(np.asarray(v, dtype=np.float64) for v in shifts)
        self._state: dict | None = None  # allocated at the first flush
        self._pending: list[tuple[int, np.ndarray]] = []
        self._next_row = 0

    @staticmethod
    def state_nbytes(block_widths: Sequence[int], pairs: Sequence[tuple[int, int]], groups: int) -> int:
        """Bytes of one accumulator's state: every group's sums and products plus the row buffer."""
        widths = validated_widths(block_widths)
        used = [widths[b] for b in sorted({x for pair in pairs for x in pair})]
        per_group = 1 + sum(w + 1 for w in used) + sum(widths[a] * widths[b] + widths[a] + widths[b] + 1
                                                         for a, b in _products(pairs))
        pending = min(PENDING_ROWS_PER_GROUP * groups * FLOAT64_BYTES * sum(used), PENDING_BYTES)
        return FLOAT64_BYTES * groups * per_group + pending

    @staticmethod
    def estimate_peak_nbytes(block_widths: Sequence[int], pairs: Sequence[tuple[int, int]], groups: int,
                             replicates: int, tasks: int) -> int:
        """Bytes held at the peak of a query's reduce and finalize: `tasks` partial states and
        their merge, plus the finalize's largest product: its G group blocks moved (a copy, only
        when the shift is far from the mean, `_centred`), the products with t' and along the
        diagonal (2 G^2 d), T with its temporaries and the replicates' contraction of T."""
        widths = validated_widths(block_widths)
        largest = max(widths[a] * widths[b] for a, b in _products(pairs))
        finalize = FLOAT64_BYTES * (groups * largest + 2 * groups**2 * (max(widths) + 1) + 4 * groups**3
                                    + (replicates + 1) * groups**2)
        return (tasks + 1) * GroupedBootstrapCKA.state_nbytes(widths, pairs, groups) + finalize

    def split(self, parts: int) -> list[GroupedBootstrapCKA]:
        """This accumulator's products dealt between at most `parts` new ones of near-equal work
        (`_work`; largest first, each to the least loaded), each forming only its own products
        from the same rows. Their finalized terms join: `first.stats(*others)`."""
        if self._state is not None or self._pending:
            raise ValueError("split an accumulator before adding rows")
        shares: list[list[tuple[int, int]]] = [[] for _ in range(max(1, min(parts, len(self.products))))]
        loads = [0.0] * len(shares)
        for product in sorted(self.products, key=lambda p: -_work(self.block_widths, p)):
            least = loads.index(min(loads))
            shares[least].append(product)
            loads[least] += _work(self.block_widths, product)
        return [GroupedBootstrapCKA(self.block_widths, self.pairs, self.replicates, self.groups, self.seed,
                                    self.shifts, share) for share in shares]

    def __getstate__(self) -> dict:
        self._flush()
        return self.__dict__.copy()

    @property
    def n(self) -> int:
        flushed = 0 if self._state is None else int(self._state["n"].sum())
        return flushed + sum(len(rows[0]) for _, rows in self._pending)

    def seek(self, row: int) -> None:
        """The global index of the next chunk's first row (the map task's range start)."""
        self._next_row = int(row)

    def update(self, blocks: Sequence[np.ndarray]) -> None:
        """Add one chunk: `blocks[b]` has shape (rows, block_widths[b]); float16/32 rows wait in
        the buffer as they are and are upcast before any product."""
        matrices = validated_blocks(blocks, self.block_widths, upcast=False)
        if len(matrices[0]):
            self._pending.append((self._next_row, [matrices[b] for b in self.used]))
            self._next_row += len(matrices[0])
            buffered = sum(len(rows[0]) for _, rows in self._pending)
            used_width = sum(self.block_widths[b] for b in self.used)
            if buffered >= min(PENDING_ROWS_PER_GROUP * self.groups, PENDING_BYTES // (FLOAT64_BYTES * used_width)):
                self._flush()

    def _allocate(self) -> dict:
        g, w = self.groups, self.block_widths
        return {"n": np.zeros(g), "sums": {b: np.zeros((g, w[b])) for b in self.used},
                "norms": {b: np.zeros(g) for b in self.used},
                "cross": {p: np.zeros((g, w[p[0]], w[p[1]])) for p in self.products},
                "rho": {p: np.zeros(g) for p in self.products},
                "u": {p: np.zeros((g, w[p[1]])) for p in self.products},
                "v": {p: np.zeros((g, w[p[0]])) for p in self.products}}

    def _flush(self) -> None:
        """Add the buffered rows to their groups' sums; one product per group and block pair."""
        if not self._pending:
            return
        index = np.concatenate([np.arange(first, first + len(rows[0])) for first, rows in self._pending])
        group = sample_groups(self.seed, index, self.groups)
        order = np.argsort(group, kind="stable")
        counts = np.bincount(group, minlength=self.groups)
        present = np.flatnonzero(counts)
        starts = np.concatenate(([0], np.cumsum(counts)))[present]
        x, r = {}, {}
        for k, b in enumerate(self.used):  # the rows of block b sorted by group, shifted, float64
            x[b] = np.concatenate([rows[k] for _, rows in self._pending])[order].astype(np.float64) - self.shifts[b]
            r[b] = np.einsum("ij,ij->i", x[b], x[b])
        self._pending = []
        state = self._state if self._state is not None else self._allocate()
        state["n"][present] += counts[present]
        for b in self.used:
            state["norms"][b][present] += np.add.reduceat(r[b], starts)
        for a, b in self.products:
            state["rho"][(a, b)][present] += np.add.reduceat(r[a] * r[b], starts)
        # per block c and group: the rows' sum and every `sum r_w x_c` a product needs (u of (w, c), v of
        # (c, w)) as one small product x_c^T [1, r_w, ...]
        weighting = {c: sorted({a for a, b in self.products if b == c} | {b for a, b in self.products if a == c})
                     for c in self.used}
        columns = {c: np.column_stack([np.ones(len(index))] + [r[w] for w in weighting[c]]) for c in self.used}
        for g, lo in zip(present, starts):
            rows = {c: x[c][lo: lo + counts[g]] for c in self.used}
            for c in self.used:
                moments = rows[c].T @ columns[c][lo: lo + counts[g]]  # (width, 1 + weights)
                state["sums"][c][g] += moments[:, 0]
                for j, w in enumerate(weighting[c], 1):
                    if (w, c) in state["u"]:
                        state["u"][(w, c)][g] += moments[:, j]
                    if (c, w) in state["v"]:
                        state["v"][(c, w)][g] += moments[:, j]
            for a, b in self.products:
                if a == b:  # symmetric: the upper triangle by one syrk (the finalize reads only it)
                    _add_syrk_upper(state["cross"][(a, b)][g], rows[a])
                else:
                    _add_gemm(state["cross"][(a, b)][g], rows[a], rows[b])
        self._state = state

    def merge(self, other: GroupedBootstrapCKA) -> GroupedBootstrapCKA:
        """Add `other`'s rows (in place; `other` is only read) and return self."""
        if (other.block_widths, other.pairs, other.products, other.replicates, other.groups, other.seed) != (
                self.block_widths, self.pairs, self.products, self.replicates, self.groups, self.seed) or not all(
                np.array_equal(mine, theirs) for mine, theirs in zip(self.shifts, other.shifts)):
            raise ValueError("cannot merge grouped-bootstrap CKA accumulators of different blocks, pairs, "
                             "products, replicates, groups, seeds or shifts")
        self._pending.extend(other._pending)
        if other._state is not None:
            if self._state is None:
                self._state = self._allocate()
            for key, value in other._state.items():
                if isinstance(value, dict):
                    for part, array in value.items():
                        self._state[key][part] += array
                else:
                    self._state[key] += value
        self._flush()
        return self

    def finalize(self) -> GroupedTerms:
        """Each product's HSIC terms for the sample and every replicate. Only reads the state (a
        partial from Ray's object store, read-only, can be finalized as it is) once the buffer
        is empty; otherwise the buffer is flushed into the groups first. A group without rows
        has all-zero moments and adds nothing to any term, whatever its weight."""
        self._flush()
        if self._state is None:
            raise ValueError("no rows were added; CKA needs at least one sample")
        state = self._state
        counts = state["n"]
        weights = np.vstack([np.ones(self.groups), group_poisson_weights(self.seed, self.replicates, self.groups)])
        size = weights @ counts
        delta = {b: state["sums"][b].sum(axis=0) / counts.sum() for b in self.used}  # mean - shift
        terms = {p: _product_terms(_centred(state, p, delta), weights, size) for p in self.products}
        return GroupedTerms(self.pairs, terms, int(counts.sum()))


@dataclass(frozen=True)
class GroupedTerms:
    """A grouped accumulator's finalized products: per block product (a, b), the biased HSIC
    numerator and the unbiased HSIC, (R+1,) each (row 0 the sample's, then the replicates')."""

    pairs: tuple[tuple[int, int], ...]
    products: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]
    n: int

    def stats(self, *others: GroupedTerms) -> ResampledCKAStats:
        """The pairs' CKA, sample and replicates (no null), from these products and `others'`
        (the other shares of one `split`)."""
        terms = dict(self.products)
        for other in others:
            terms.update(other.products)
        missing = sorted(set(_products(self.pairs)) - set(terms))
        if missing:
            raise ValueError(f"the products {missing} are missing: join every share of the split")
        cka = [np.stack([normalised(terms[tuple(sorted(p))][v], terms[(p[0], p[0])][v], terms[(p[1], p[1])][v])
                         for p in self.pairs], 1) for v in (0, 1)]
        empty = np.zeros((0, len(self.pairs)))
        return ResampledCKAStats(cka[0][0], cka[1][0], cka[0][1:], cka[1][1:], empty, empty, self.n)


def _centred(state: dict, product: tuple[int, int], delta: dict) -> dict:
    """One product's group terms at the sample's mean, from its sums about the shift, without
    moving any group's da x db matrix S_g (`da`, `db`: mean - shift; `ea = ||da||^2`). Per group
    `s' = s - n da`, `t' = t - n db` and `S' = S - P`, `P = s' db^T + da t^T` (rank two), so with
    `c_g = S_g db` and `e_g = S_g^T da`:

    - `Q'_gh = <S'_g, S'_h> = Q_gh - M_gh - M_hg + <P_g, P_h>`, `M_gh = <S_g, P_h> = c_g.s'_h + e_g.t_h`,
      `<P_g, P_h> = eb s'_g.s'_h + (s'_g.da)(t_h.db) + (t_g.db)(s'_h.da) + ea t_g.t_h`;
    - `T'_ghk = s'_g^T S'_h t'_k = s'_g^T S_h t'_k - (s'_g.s'_h)(db.t'_k) - (s'_g.da)(t_h.t'_k)`;
    - the other moments by `_moved_moments`.

    Each S_g is read three times (Q, one product for every `S_h t'_k` and c, one for e) and never
    copied. The subtractions are exact algebra, but Q' cancels about (|S| / |S'|)^2 of its
    leading digits where moving S first cancels |S| / |S'|: when the shift is far from the mean
    (`FAR_SHIFT`) the sums are moved to the mean first (`_reshifted`, a copy of S) and the algebra
    handles the rounding left over. The service's shift is the runs' stored means, not far.
    For a == b only the upper triangle U of S = U + U^T - diag(U) is summed (the lower is zero):
    `<S_g, S_h> = 2 <U_g, U_h> - diag(U_g).diag(U_h)` and
    `s'_g^T S_h s'_k = V_ghk + V_khg - sum_i s'_gi diag(U_h)_i s'_ki`, `V_ghk = s'_g^T U_h s'_k`."""
    a, b = product
    symmetric = a == b
    parts = {"n": state["n"], "cross": state["cross"][product], "sums_a": state["sums"][a],
             "sums_b": state["sums"][b], "norms_a": state["norms"][a], "norms_b": state["norms"][b],
             "rho": state["rho"][product], "u": state["u"][product], "v": state["v"][product]}
    da, db = delta[a], delta[b]
    total = parts["n"].sum()
    about_shift = [parts["norms_a"].sum(), parts["norms_b"].sum()]  # sum ||x - shift||^2, y's
    about_mean = [about_shift[0] - total * (da @ da), about_shift[1] - total * (db @ db)]
    if min(about_mean) <= 0 or about_shift[0] * about_shift[1] > FAR_SHIFT * about_mean[0] * about_mean[1]:
        parts = _reshifted(parts, da, db, symmetric)
        da, db = parts["sums_a"].sum(axis=0) / total, parts["sums_b"].sum(axis=0) / total  # rounding left
    cross, n, t = parts["cross"], parts["n"], parts["sums_b"]
    groups, rows, _ = cross.shape
    diagonal = np.diagonal(cross, axis1=1, axis2=2).copy() if symmetric else None
    moved_t = t - np.outer(n, db)
    c, e, cross_t = _cross_products(cross, moved_t, da, db, diagonal)
    moved = _moved_moments(parts, da, db, c, e)
    moved_s = moved["sums_a"]
    tensor = np.matmul(moved_s, cross_t).transpose(1, 0, 2)  # [g, h, k] = s'_g^T S_h t'_k (U_h when symmetric)
    if symmetric:
        gram = np.zeros((groups, groups))
        for i in range(rows):  # row i of every U_g from its diagonal on: a syrk of half the entries in all
            entries = cross[:, i, i:]
            gram += entries @ entries.T
        gram = 2 * gram - diagonal @ diagonal.T
        along_diagonal = (moved_s[:, None, :] * diagonal[None]).reshape(groups * groups, rows) @ moved_s.T
        tensor = tensor + tensor.transpose(2, 1, 0) - along_diagonal.reshape(groups, groups, groups)
    else:
        flat = cross.reshape(groups, -1)
        gram = flat @ flat.T  # a syrk: numpy sees the transpose of its own operand
    moved_s_da, t_db, outer_s = moved_s @ da, t @ db, moved_s @ moved_s.T
    mixed = c @ moved_s.T + e @ t.T  # M_gh
    gram = (gram - mixed - mixed.T + (db @ db) * outer_s + np.outer(moved_s_da, t_db) + np.outer(t_db, moved_s_da)
            + (da @ da) * (t @ t.T))
    tensor -= outer_s[:, :, None] * (moved_t @ db)[None, None, :] + moved_s_da[:, None, None] * (t @ moved_t.T)[None]
    return {**moved, "gram": gram, "tensor": tensor}


def _cross_products(cross: np.ndarray, moved_t: np.ndarray, da: np.ndarray, db: np.ndarray,
                    diagonal: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`c_g = S_g db`, `e_g = S_g^T da` and `S_h t'_k` as (G, da, K) for the K rows of `moved_t`, in
    two passes over the stacked S (the first one product for all of `[t'_1 .. t'_K, db]`). For a
    symmetric product (`diagonal` given: the U_g's) S = U + U^T - diag(U) gives c = e; the third is
    then `U_h t'_k` (triangular products: half the multiply-adds)."""
    groups, rows, cols = cross.shape
    right = np.column_stack([moved_t.T, db])
    if diagonal is None:
        right = (cross.reshape(groups * rows, cols) @ right).reshape(groups, rows, -1)
    else:
        right = _upper_triangular_products(cross, right)
    c, e = right[:, :, -1], np.matmul(da, cross)
    if diagonal is not None:
        c = e = c + e - diagonal * db
    return c, e, right[:, :, :-1]


def _moved_moments(parts: dict, da: np.ndarray, db: np.ndarray, c: np.ndarray, e: np.ndarray) -> dict:
    """`parts` with its sums, norms, rho, u and v moved, exactly, from the shift to shift + (da, db)
    (`c_g = S_g db`, `e_g = S_g^T da`): with `x' = x - da`, `y' = y - db`, `r' = r - 2 da.x + ea`,
    per group `s' = s - n da`, `R' = R - 2 da.s + n ea`, `u' = u - R db - 2 e + 2 (da.s) db + ea t - n ea db`
    (v likewise with c), and
    `rho' = rho - 2 db.u - 2 da.v + 4 da^T S db + eb R_a + ea R_b - 2 eb da.s - 2 ea db.t + n ea eb`."""
    n, s, t, u, v = parts["n"], parts["sums_a"], parts["sums_b"], parts["u"], parts["v"]
    norms_a, norms_b = parts["norms_a"], parts["norms_b"]
    ea, eb = da @ da, db @ db
    s_da, t_db = s @ da, t @ db
    rho = (parts["rho"] - 2 * u @ db - 2 * v @ da + 4 * e @ db + eb * norms_a + ea * norms_b - 2 * eb * s_da
           - 2 * ea * t_db + n * ea * eb)
    return {**parts, "sums_a": s - np.outer(n, da), "sums_b": t - np.outer(n, db), "rho": rho,
            "norms_a": norms_a - 2 * s_da + n * ea, "norms_b": norms_b - 2 * t_db + n * eb,
            "u": u - np.outer(norms_a, db) - 2 * e + np.outer(2 * s_da, db) + ea * t - np.outer(n * ea, db),
            "v": v - np.outer(norms_b, da) - 2 * c + np.outer(2 * t_db, da) + eb * s - np.outer(n * eb, da)}


def _reshifted(parts: dict, da: np.ndarray, db: np.ndarray, symmetric: bool) -> dict:
    """`parts` moved to shift + (da, db), S_g included (a copy): `S' = S - s' db^T - da t^T`; for a
    symmetric product only on the upper triangle, so the lower stays zero."""
    diagonal = np.diagonal(parts["cross"], axis1=1, axis2=2) if symmetric else None
    c, e, _ = _cross_products(parts["cross"], np.zeros((0, len(db))), da, db, diagonal)
    moved = _moved_moments(parts, da, db, c, e)
    cross = parts["cross"].copy()
    upper = np.triu(np.ones(cross.shape[1:], dtype=bool)) if symmetric else True
    for matrix, sum_a, sum_b in zip(cross, moved["sums_a"], parts["sums_b"]):  # one d x d temporary at a time
        matrix -= (np.outer(sum_a, db) + np.outer(da, sum_b)) * upper
    return {**moved, "cross": cross}


def _product_terms(parts: dict, weights: np.ndarray, size: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The biased HSIC numerator (no copy pairs, weights scaled to total n) and the unbiased HSIC
    of one block product for every weight row, (R+1,) each, from its groups' centred terms:
    `gram` Q, `tensor` T, `sums_a` s_g, `sums_b` t_g, `rho`, `norms_a` tr(X_g^T X_g), `norms_b`,
    `u` = sum r y, `v` = sum q x (module docstring). Row 0 (weights all 1) is the sample's."""
    groups = len(weights[0])
    quadratic = np.einsum("rg,rg->r", weights @ parts["gram"], weights)  # w^T Q w
    cubic = np.einsum("rhk,rh,rk->r", (weights @ parts["tensor"].reshape(groups, -1)).reshape(-1, groups, groups),
                      weights, weights)
    sums_a, sums_b = weights @ parts["sums_a"], weights @ parts["sums_b"]  # s(w), t(w)
    norm_a, norm_b = np.einsum("ri,ri->r", sums_a, sums_a), np.einsum("ri,ri->r", sums_b, sums_b)
    mixed = sums_b @ parts["u"].T + sums_a @ parts["v"].T  # (R+1, G): u_g . t(w) + v_g . s(w)
    squared = weights * weights
    with np.errstate(divide="ignore", invalid="ignore"):
        trace = quadratic - squared @ parts["rho"]
        total_a, total_b = norm_a - squared @ parts["norms_a"], norm_b - squared @ parts["norms_b"]
        row_dot = cubic - np.einsum("rg,rg->r", squared, mixed) + (squared * weights) @ parts["rho"]
        hsic = hsic_u_from_grams(trace, total_a, total_b, row_dot, size)
        # biased (module docstring): weights f w, f = n / N(w); a row's copies pair only with themselves
        f, n = size[0] / size, size[0]
        linear = f[:, None] * weights
        trace_b = f**2 * trace + linear @ parts["rho"]
        total_a_b = f**2 * total_a + linear @ parts["norms_a"]
        total_b_b = f**2 * total_b + linear @ parts["norms_b"]
        row_dot_b = (f**3 * (cubic - np.einsum("rg,rg->r", squared, mixed))
                     + f**2 * np.einsum("rg,rg->r", weights, mixed) + (linear * (linear - 1) ** 2) @ parts["rho"])
        biased = trace_b - 2 * row_dot_b / n + total_a_b * total_b_b / n**2
    return biased, np.where(size >= MIN_HSIC_SAMPLES, hsic, np.nan)
