"""Logit lens, saturation, effective depth, multi-exit, NC1 and residual norm ratio.

Source: "Tracing Representation Progression" (sec. 2.2, Definition 3.1, sec. 3 multi-exit,
footnote 5, Appendix B.2), with saturation events from Geva et al. 2022 and NC1 from Papyan et
al. 2020; METRICS.md, "Logit lens, saturation and depth". Layers are numbered 0..L: 0 is the
embedding output, L the last block's output (the HF `hidden_states` convention). Per-layer
arrays have shape (L+1, n), rows indexed by layer.

Layer 0 is a lens layer (accuracy and saturation are reported for it) but never a depth: the
paper numbers the layers of an L-layer transformer 1..L, its speed-up sums over layers 1..L (an
exit at 0 would cost nothing), and Definition 3.1 asks for the minimal number of layers that
reaches the accuracy. So `effective_depth` and the multi-exit count layers 1..L only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Self

import numpy as np

from ._numerics import SymmetricSum, as_float64_matrix

DEFINITION_VERSION = 1

# Accuracies are multiples of 1/n while `1 - epsilon` and `acc_L - epsilon` carry rounding error;
# this slack keeps an exact tie (acc_l == 1 - epsilon in exact arithmetic) on the eligible side.
_TIE_SLACK = 1e-12


def argmax_and_confidence(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Top-1 class and its probability `max softmax(z)` over the last axis of `logits`.

    Ties go to the lowest class index (numpy argmax). The confidence is
    `1 / sum_j exp(z_j - max z)`, which cannot overflow.
    """
    z = np.asarray(logits, dtype=np.float64)
    top = z.max(axis=-1, keepdims=True)
    confidence = 1.0 / np.exp(z - top).sum(axis=-1)
    return z.argmax(axis=-1), confidence


def _check_layer_table(table: np.ndarray, name: str) -> np.ndarray:
    array = np.asarray(table)
    if array.ndim != 2 or array.shape[0] < 2 or array.shape[1] < 1:
        raise ValueError(
            f"{name} must have shape (L+1, n) with L >= 1 and n >= 1, got {array.shape}"
        )
    return array


def _check_labels(labels: np.ndarray, n: int) -> np.ndarray:
    array = np.asarray(labels)
    if array.shape != (n,):
        raise ValueError(f"labels must have shape ({n},), got {array.shape}")
    return array


def layer_accuracy(preds: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """`acc_l = mean_i 1[argmax z_l(i) = y_i]` for l = 0..L (eq. 2 of the paper).

    preds: (L+1, n) lens argmaxes; labels: (n,) targets (the next token for LMs).
    """
    table = _check_layer_table(preds, "preds")
    return np.mean(table == _check_labels(labels, table.shape[1]), axis=1)


def saturation_layers(preds: np.ndarray) -> np.ndarray:
    """Saturation layer of every sample (Geva et al. 2022, as used in sec. 2.2 of the paper).

    The smallest l in 0..L such that `argmax z_l'(i) = argmax z_L(i)` for every l' >= l, i.e. one
    past the last layer whose top-1 differs from the final one (0 if none differs).
    """
    table = _check_layer_table(preds, "preds")
    last = table.shape[0] - 1
    differs = table != table[-1]
    from_top = np.argmax(differs[::-1], axis=0)
    return np.where(differs.any(axis=0), last - from_top + 1, 0)


def saturation_distribution(sat: np.ndarray, num_layers: int) -> tuple[np.ndarray, np.ndarray]:
    """Counts of samples per saturation layer 0..L, and their running sum.

    The cumulative counts (samples saturated at or before l) are what Figure 1(c) plots.
    """
    counts = np.bincount(np.asarray(sat, dtype=np.int64), minlength=num_layers + 1)
    if counts.size != num_layers + 1:
        raise ValueError(f"saturation layers exceed num_layers={num_layers}")
    return counts, np.cumsum(counts)


def effective_depth(
    acc: np.ndarray, epsilon: float, variant: Literal["absolute", "relative"] = "absolute"
) -> int:
    """epsilon-effective depth (Definition 3.1 of the paper).

    absolute: the smallest l in 1..L with `acc_l >= 1 - epsilon` (the paper's definition);
    relative: the smallest l in 1..L with `acc_l >= acc_L - epsilon`. L if no layer qualifies.
    Layer 0 (the embedding) is never a depth, whatever its accuracy (see the module docstring).
    """
    accuracy = np.asarray(acc, dtype=np.float64)
    if accuracy.ndim != 1 or accuracy.size < 2:
        raise ValueError(f"acc must have shape (L+1,) with L >= 1, got {accuracy.shape}")
    if variant == "absolute":
        threshold = 1.0 - epsilon
    elif variant == "relative":
        threshold = accuracy[-1] - epsilon
    else:
        raise ValueError(f"variant must be 'absolute' or 'relative', got {variant!r}")
    eligible = np.flatnonzero(accuracy[1:] >= threshold - _TIE_SLACK)
    return int(eligible[0]) + 1 if eligible.size else accuracy.size - 1


@dataclass(frozen=True, eq=False)
class ExitRow:
    """One threshold of the multi-exit sweep.

    exits[l-1] = m_l, the samples exiting at layer l = 1..L; accuracy of the exited predictions;
    speedup = `sum_l L*m_l / sum_l l*m_l`.
    """

    tau: float
    exits: np.ndarray
    accuracy: float
    speedup: float


def _exit_layers(confidences: np.ndarray, tau: float) -> np.ndarray:
    """First layer l in 1..L with confidence >= tau, or L."""
    confident = confidences[1:] >= tau
    confident[-1] = True
    return np.argmax(confident, axis=0) + 1


def _exit_stats(
    confidences: np.ndarray, preds: np.ndarray, labels: np.ndarray, taus: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per tau: exits per layer 1..L (T, L), and the number of correct exited predictions (T,)."""
    num_layers = preds.shape[0] - 1
    samples = np.arange(preds.shape[1])
    exits = np.zeros((taus.size, num_layers), dtype=np.int64)
    correct = np.zeros(taus.size, dtype=np.int64)
    for t, tau in enumerate(taus):
        layer = _exit_layers(confidences, tau)
        exits[t] = np.bincount(layer - 1, minlength=num_layers)
        correct[t] = np.count_nonzero(preds[layer, samples] == labels)
    return exits, correct


def _exit_rows(taus: np.ndarray, exits: np.ndarray, correct: np.ndarray) -> list[ExitRow]:
    num_layers = exits.shape[1]
    depth = np.arange(1, num_layers + 1)
    return [
        ExitRow(
            tau=float(tau),
            exits=m,
            accuracy=float(c / m.sum()),
            speedup=float(num_layers * m.sum() / (depth @ m)),
        )
        for tau, m, c in zip(taus, exits, correct, strict=True)
    ]


def _check_lens_chunk(
    preds: np.ndarray, confidences: np.ndarray, labels: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    table = _check_layer_table(preds, "preds")
    conf = np.asarray(confidences, dtype=np.float64)
    if conf.shape != table.shape:
        raise ValueError(
            f"confidences must have the shape of preds {table.shape}, got {conf.shape}"
        )
    return table, conf, _check_labels(labels, table.shape[1])


def multi_exit_sweep(
    confidences: np.ndarray, preds: np.ndarray, labels: np.ndarray, taus: np.ndarray
) -> list[ExitRow]:
    """Multi-exit by confidence with the shared last-layer classifier (sec. 3 of the paper).

    Sample i exits at the first l in 1..L with `max softmax(z_l(i)) >= tau`, or at L. For each
    tau: m_l, the accuracy of the exited predictions, and the speed-up
    `sum_{l=1}^L L*m_l / sum_{l=1}^L l*m_l`. confidences, preds: (L+1, n); row 0 is ignored.
    """
    table, conf, target = _check_lens_chunk(preds, confidences, labels)
    grid = np.asarray(taus, dtype=np.float64).ravel()
    return _exit_rows(grid, *_exit_stats(conf, table, target, grid))


@dataclass(frozen=True, eq=False)
class LensSummary:
    """Everything one pass of `LensAccumulator` gives; arrays are indexed by layer 0..L."""

    accuracy: np.ndarray
    saturation_counts: np.ndarray
    saturation_cumulative: np.ndarray
    exits: list[ExitRow]


class LensAccumulator:
    """Streams lens outputs chunk by chunk: layer accuracy, saturation, multi-exit sweep.

    Each `update` takes, for a chunk of samples, the per-layer argmaxes and max-softmax
    confidences (both (L+1, b), from `argmax_and_confidence` of each layer's lens logits) and
    the (b,) labels. It keeps integer counts only: correct per layer, samples per saturation
    layer, and per tau the exits per layer and the correct exits. Chunks may come in any order
    and accumulators of disjoint chunks merge, giving exactly the one-pass result.
    """

    def __init__(self, num_layers: int, taus: np.ndarray) -> None:
        self.num_layers = num_layers
        self.taus = np.asarray(taus, dtype=np.float64).ravel()
        self.n = 0
        self.correct = np.zeros(num_layers + 1, dtype=np.int64)
        self.saturation = np.zeros(num_layers + 1, dtype=np.int64)
        self.exits = np.zeros((self.taus.size, num_layers), dtype=np.int64)
        self.exit_correct = np.zeros(self.taus.size, dtype=np.int64)

    def update(self, preds: np.ndarray, confidences: np.ndarray, labels: np.ndarray) -> Self:
        table, conf, target = _check_lens_chunk(preds, confidences, labels)
        if table.shape[0] != self.num_layers + 1:
            raise ValueError(f"expected {self.num_layers + 1} layers, got {table.shape[0]}")
        exits, correct = _exit_stats(conf, table, target, self.taus)
        self.n += table.shape[1]
        self.correct += np.count_nonzero(table == target, axis=1)
        self.saturation += saturation_distribution(saturation_layers(table), self.num_layers)[0]
        self.exits += exits
        self.exit_correct += correct
        return self

    def merge(self, other: LensAccumulator) -> Self:
        if other.num_layers != self.num_layers or not np.array_equal(other.taus, self.taus):
            raise ValueError("can only merge lens accumulators with the same layers and taus")
        self.n += other.n
        self.correct += other.correct
        self.saturation += other.saturation
        self.exits += other.exits
        self.exit_correct += other.exit_correct
        return self

    def finalize(self) -> LensSummary:
        if self.n == 0:
            raise ValueError("no samples were accumulated")
        return LensSummary(
            accuracy=self.correct / self.n,
            saturation_counts=self.saturation.copy(),
            saturation_cumulative=np.cumsum(self.saturation),
            exits=_exit_rows(self.taus, self.exits, self.exit_correct),
        )


class NC1Accumulator:
    """Class statistics for NC1, streamed in float64 (Papyan et al. 2020; footnote 5 of the paper).

    Keeps per class the count and mean, and the pooled within-class scatter
    `sum_c sum_{i in c} (h_i - mu_c)(h_i - mu_c)^T` (one d x d matrix, not one per class). Each
    chunk is centred on its own class means before any product, and chunks and accumulators
    combine with Chan et al.'s pairwise update
    `M = M_a + M_b + (n_a n_b / (n_a + n_b)) (mu_b - mu_a)(mu_b - mu_a)^T` per class, so the
    result does not depend on chunking or order beyond rounding.
    """

    def __init__(self, device: str | None = None) -> None:
        self.classes: np.ndarray | None = None
        self.counts: np.ndarray | None = None
        self.means: np.ndarray | None = None
        # The pooled scatter is `chunk_scatter` (each chunk's rows about its own class means,
        # summed on `device`, None for the host) plus `corrections` (Chan's terms, merged
        # accumulators' scatters), so the O(n d^2) part never leaves the device mid-task.
        self.chunk_scatter: SymmetricSum | None = None
        self.corrections: np.ndarray | None = None
        self.device = device

    @property
    def scatter(self) -> np.ndarray | None:
        """`sum_c sum_{i in c} (h_i - mu_c)(h_i - mu_c)^T` over all rows so far (host, float64)."""
        if self.chunk_scatter is None:
            return None
        return self.chunk_scatter.matrix() + self.corrections

    def update(self, features: np.ndarray, labels: np.ndarray) -> Self:
        x = as_float64_matrix(features, "features")
        y = _check_labels(labels, x.shape[0])
        classes, index, counts = np.unique(y, return_inverse=True, return_counts=True)
        means = np.zeros((classes.size, x.shape[1]))
        np.add.at(means, index, x)
        means /= counts[:, None]
        self._absorb(classes, counts, means, None)
        self.chunk_scatter.add(x - means[index], self.device)
        return self

    def merge(self, other: NC1Accumulator) -> Self:
        if other.chunk_scatter is None:
            return self
        return self._absorb(other.classes, other.counts, other.means, other.scatter)

    def _absorb(
        self,
        classes: np.ndarray,
        counts: np.ndarray,
        means: np.ndarray,
        scatter: np.ndarray | None,
    ) -> Self:
        """Add a group's class counts and means and (if given) its pooled scatter, with Chan's
        correction for the moved class means."""
        width = means.shape[1]
        if self.chunk_scatter is None:
            self.chunk_scatter, self.corrections = SymmetricSum(width), np.zeros((width, width))
            self.classes, self.counts, self.means = classes[:0], counts[:0], means[:0]
        if width != len(self.corrections):
            raise ValueError(f"feature width {width} != {len(self.corrections)}")
        merged = np.union1d(self.classes, classes)
        old, new = np.searchsorted(merged, self.classes), np.searchsorted(merged, classes)
        merged_counts = np.zeros(merged.size, dtype=np.int64)
        merged_counts[old] = self.counts
        merged_means = np.zeros((merged.size, width))
        merged_means[old] = self.means
        before = merged_counts[new].astype(np.float64)
        delta = means - merged_means[new]
        weight = before * counts / (before + counts)
        self.corrections = self.corrections + (delta * weight[:, None]).T @ delta
        if scatter is not None:
            self.corrections += scatter
        merged_means[new] += delta * (counts / (before + counts))[:, None]
        merged_counts[new] += counts
        self.classes, self.counts, self.means = merged, merged_counts, merged_means
        return self

    def scatter_matrices(self) -> tuple[np.ndarray, np.ndarray]:
        """`Sigma_W = (1/N) sum_i (h_i - mu_c(i))(h_i - mu_c(i))^T` and
        `Sigma_B = (1/C) sum_c (mu_c - mu_G)(mu_c - mu_G)^T`, mu_G the unweighted mean of the
        C class means."""
        if self.chunk_scatter is None or self.classes.size < 2:
            raise ValueError("needs at least two classes")
        between = self.means - self.means.mean(axis=0)
        return self.scatter / self.counts.sum(), between.T @ between / self.classes.size

    def finalize(self, rcond: float = 1e-10) -> float:
        """`NC1 = (1/C) tr(Sigma_W Sigma_B^+)`.

        Sigma_B^+ is the pseudo-inverse over the eigenvalues of Sigma_B above
        `rcond * max eigenvalue` (rank <= C-1, found by the threshold, never fixed).
        """
        sigma_w, sigma_b = self.scatter_matrices()
        eigenvalues, eigenvectors = np.linalg.eigh(sigma_b)
        keep = eigenvalues > rcond * eigenvalues[-1]
        basis = eigenvectors[:, keep]
        within = np.einsum("ij,ij->j", basis, sigma_w @ basis)
        return float(np.sum(within / eigenvalues[keep]) / self.classes.size)


def nc1(features: np.ndarray, labels: np.ndarray, rcond: float = 1e-10) -> float:
    """`NC1 = (1/C) tr(Sigma_W Sigma_B^+)` of (n, d) features with (n,) class labels.

    Definitions as in `NC1Accumulator`; this is its one-chunk form.
    """
    return NC1Accumulator().update(features, labels).finalize(rcond)


def residual_norm_ratio(h_l: np.ndarray, h_next: np.ndarray) -> np.ndarray:
    """`||h_l|| / ||h_{l+1} - h_l||` per sample (Appendix B.2 of the paper).

    The paper's ratio is `||h^(l)|| / ||f_theta(h^(l))||` with `h^(l+1) = h^(l) + f_theta(h^(l))`
    (eq. 1): the skip connection over the residual branch, on the raw (uncentred) features.
    A sample the block leaves unchanged gives inf. For the last step of GPT-2/Llama-style HF
    models, `hidden_states[L]` includes the final norm, so that step is not a residual branch.
    """
    a = as_float64_matrix(h_l, "h_l")
    b = as_float64_matrix(h_next, "h_next")
    if a.shape != b.shape:
        raise ValueError(f"h_l {a.shape} and h_next {b.shape} must have the same shape")
    # an unchanged sample divides by zero: inf (or nan for a zero h_l) is the honest ratio
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.linalg.norm(a, axis=1) / np.linalg.norm(b - a, axis=1)


class ResidualNormAccumulator:
    """Streaming distribution of the residual norm ratio `||h_l|| / ||h_{l+1} - h_l||` per layer
    ("Tracing Representation Progression", Appendix B.2).

    `update(blocks)` takes the layers as consecutive pairs: blocks[2k] = h_l, blocks[2k+1] = h_{l+1}.
    Memory is independent of n: a histogram of log10(ratio) over [-4, 6] with `bins` bins, plus the
    exact count, mean, min and max, so quantiles are within a factor 10**(10/bins) of exact.
    A sample whose two layers are equal has an infinite ratio; it is counted in `unchanged`.
    """

    LOW, HIGH = -4.0, 6.0

    def __init__(self, num_pairs: int, bins: int = 4000) -> None:
        self.bins = bins
        self.n = 0
        self.counts = np.zeros((num_pairs, bins), dtype=np.int64)
        self.total = np.zeros(num_pairs)
        self.lowest = np.full(num_pairs, np.inf)
        self.highest = np.full(num_pairs, -np.inf)
        self.unchanged = np.zeros(num_pairs, dtype=np.int64)

    def update(self, blocks: list[np.ndarray]) -> None:
        ratios = np.stack([residual_norm_ratio(blocks[2 * k], blocks[2 * k + 1])
                           for k in range(len(self.counts))])  # (P, rows)
        finite = np.isfinite(ratios)
        self.unchanged += (~finite).sum(axis=1)
        logs = np.log10(np.where(finite & (ratios > 0), ratios, 1.0))
        index = np.clip(np.floor((logs - self.LOW) * self.bins / (self.HIGH - self.LOW)), 0, self.bins - 1)
        for p in range(len(self.counts)):
            self.counts[p] += np.bincount(index[p][finite[p]].astype(np.int64), minlength=self.bins)
            if finite[p].any():
                self.total[p] += ratios[p][finite[p]].sum()
                self.lowest[p] = min(self.lowest[p], logs[p][finite[p]].min())
                self.highest[p] = max(self.highest[p], logs[p][finite[p]].max())
        self.n += ratios.shape[1]

    def merge(self, other: ResidualNormAccumulator) -> ResidualNormAccumulator:
        self.n += other.n
        self.counts += other.counts
        self.total += other.total
        self.lowest = np.minimum(self.lowest, other.lowest)
        self.highest = np.maximum(self.highest, other.highest)
        self.unchanged += other.unchanged
        return self

    def finalize(self) -> tuple[np.ndarray, np.ndarray]:
        """(mean (P,), quantiles (P, len(QUANTILE_LEVELS))) of the finite ratios."""
        from actstore.metrics.similarity import histogram_quantiles

        finite_n = self.counts.sum(axis=1)
        quantiles = np.stack([
            10.0 ** histogram_quantiles(self.counts[p:p + 1], self.lowest[p:p + 1], self.highest[p:p + 1],
                                        int(finite_n[p]), self.bins, self.LOW, self.HIGH)[0]
            if finite_n[p] else np.full(7, np.nan)
            for p in range(len(self.counts))])
        return self.total / np.maximum(finite_n, 1), quantiles
