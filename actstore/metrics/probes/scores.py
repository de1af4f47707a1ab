"""A probe's scores: per-fold accuracy, macro-F1, log-loss and R^2, their summary over folds, the
baselines, the best layer; and the correlations of "Layer by Layer" (METRICS.md, "Probes").

The interval over folds is the corrected resampled t interval of Nadeau and Bengio (2003):
`mean +- t_{k-1, (1+ci)/2} * sqrt((1/k + n_test/n_train) * s^2)` with s the standard deviation of
the k fold scores (ddof 1). Fold scores share training rows, so the plain `s / sqrt(k)` would be
too narrow; the correction widens it by the test/train ratio.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats


def confusion(true: np.ndarray, predicted: np.ndarray, classes: int) -> np.ndarray:
    """(classes, classes) counts: row = true class, column = predicted class."""
    return np.bincount(np.asarray(true) * classes + np.asarray(predicted), minlength=classes * classes
                       ).reshape(classes, classes)


def accuracy(matrix: np.ndarray) -> float:
    return float(np.trace(matrix) / matrix.sum())


def macro_f1(matrix: np.ndarray) -> float:
    """The unweighted mean over the classes of `2 TP / (2 TP + FP + FN)` (0 where a class is
    neither true nor predicted), scikit-learn's f1_score(average="macro") over all the classes."""
    tp = np.diag(matrix).astype(np.float64)
    denominator = matrix.sum(axis=0) + matrix.sum(axis=1)
    return float(np.mean(np.where(denominator > 0, 2 * tp / np.where(denominator > 0, denominator, 1), 0.0)))


def log_loss(log_proba: np.ndarray, true: np.ndarray) -> float:
    """Mean of -log p(true class | row)."""
    return float(-np.mean(log_proba[np.arange(len(true)), true]))


def r2(sse: float, sst: float) -> float:
    """1 - SSE / SST about the held-out mean (NaN for a constant held-out target)."""
    return float(1.0 - sse / sst) if sst > 0 else float("nan")


@dataclass(frozen=True)
class FoldSummary:
    mean: float
    std: float
    low: float
    high: float


def summarise(values: np.ndarray, test_fraction: float, ci: float = 0.95) -> FoldSummary:
    """Mean, std (ddof 1) and the corrected resampled t interval (module docstring) of k fold
    scores; `test_fraction` is n_test / n_train of one fold (about 1 / (k - 1))."""
    values = np.asarray(values, dtype=np.float64)
    k = len(values)
    mean = float(values.mean())
    std = float(values.std(ddof=1)) if k > 1 else float("nan")
    half = float(stats.t.ppf((1 + ci) / 2, k - 1) * np.sqrt((1 / k + test_fraction) * std**2)) if k > 1 else np.nan
    return FoldSummary(mean, std, mean - half, mean + half)


def majority_baseline(train_counts: np.ndarray, test_true: list[np.ndarray], classes: int) -> tuple[float, float]:
    """(accuracy, macro-F1) of predicting each fold's training majority class on its held-out
    part, averaged over the folds; `train_counts` (folds, classes)."""
    accuracies, f1s = [], []
    for counts, true in zip(train_counts, test_true):
        predicted = np.full(len(true), int(np.argmax(counts)))
        matrix = confusion(true, predicted, classes)
        accuracies.append(accuracy(matrix))
        f1s.append(macro_f1(matrix))
    return float(np.mean(accuracies)), float(np.mean(f1s))


def best_layers(means: np.ndarray, tolerance: float) -> tuple[int, int]:
    """(index of the best mean score, index of the first score within `tolerance` of it); NaN
    scores are never best."""
    means = np.asarray(means, dtype=np.float64)
    if np.isnan(means).all():
        return -1, -1
    best = int(np.nanargmax(means))
    within = np.flatnonzero(means >= means[best] - tolerance)
    return best, int(within[0])


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson's r (NaN when either side is constant)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    a, b = a - a.mean(), b - b.mean()
    denominator = np.sqrt((a @ a) * (b @ b))
    return float(a @ b / denominator) if denominator > 0 else float("nan")


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rho: Pearson's r of the ranks (ties share their average rank)."""
    return pearson(stats.rankdata(a), stats.rankdata(b))


def distance_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """The V-statistic distance correlation of two samples (Szekely, Rizzo and Bakirov 2007):
    with A, B the double-centred matrices of |a_i - a_j| and |b_i - b_j|,
    `dCor = sqrt(mean(A B) / sqrt(mean(A A) mean(B B)))`, 0 when either side is constant."""
    def centred(x):
        x = np.asarray(x, dtype=np.float64)
        distances = np.abs(x[:, None] - x[None, :])
        return distances - distances.mean(axis=0) - distances.mean(axis=1)[:, None] + distances.mean()

    first, second = centred(a), centred(b)
    covariance, variances = (first * second).mean(), (first * first).mean() * (second * second).mean()
    return float(np.sqrt(max(covariance, 0.0) / np.sqrt(variances))) if variances > 0 else 0.0
