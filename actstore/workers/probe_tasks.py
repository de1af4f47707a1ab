"""The Ray tasks of a probe: read ranges of samples (a token-level run's rows pooled per sample),
feed each layer's accumulator with the rows' folds and targets; finalize a layer's ridge fits;
fit and score one layer's logistic probe in memory.

A task reads one shard's samples of each layer at a time, so a streamed pass holds one chunk per
layer plus the accumulators, whatever n is. The per-sample side arrays (fold, targets or codes)
come through Ray's object store once, shared by every task.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from actstore.metrics import probes
from actstore.metrics.outliers import DimensionStats, outlier_dimensions
from actstore.store.array_store import RunReader
from actstore.store.handle import StoreHandle
from actstore.workers.heap import unmap_large_frees
from actstore.workers.metric_tasks import PerLayer, task_device


def pool_rows(tokens: np.ndarray, offsets: np.ndarray, how: str) -> np.ndarray:
    """One row per sample of a token block: the mean (float64), the last or the first token of
    each span `offsets[i]..offsets[i+1]` (offsets local to the block, starting at 0)."""
    if how == "last":
        return tokens[offsets[1:] - 1]
    if how == "cls":
        return tokens[offsets[:-1]]
    sums = np.add.reduceat(np.asarray(tokens, dtype=np.float64), offsets[:-1], axis=0)
    return sums / np.diff(offsets)[:, None]


def sample_rows(arrays: RunReader, run_key: str, layers: list[int], start: int, stop: int, pool: str | None,
                offsets: np.ndarray | None) -> list[np.ndarray]:
    """Samples start..stop of each layer: the stored rows of a pooled run, or a token-level run's
    tokens pooled per sample by `pool`."""
    if offsets is None:
        return list(arrays.read_layers(run_key, layers, start, stop))
    first, last = int(offsets[start]), int(offsets[stop])
    local = offsets[start: stop + 1] - first
    return [pool_rows(block, local, pool) for block in arrays.read_layers(run_key, layers, first, last)]


def accumulate_samples(store: StoreHandle, run_key: str, layers: list[int], ranges: list[tuple[int, int]],
                       pool: str | None, offsets: np.ndarray | None, fold: np.ndarray, side: np.ndarray,
                       accumulator: PerLayer, device_policy: str = "cpu") -> PerLayer:
    """Feed samples [start, stop) of every range to the layers' accumulators (`PerLayer`: layer j's
    rows to accumulator j, each with `fold[start:stop]` and `side[start:stop]`)."""
    unmap_large_frees()
    arrays = store.open()
    accumulator = copy.deepcopy(accumulator)  # Ray hands arguments over as read-only buffers
    accumulator.device = task_device(device_policy)
    for start, stop in ranges:
        accumulator.update(sample_rows(arrays, run_key, layers, start, stop, pool, offsets), fold[start:stop],
                           side[start:stop])
    return accumulator


@dataclass(frozen=True)
class Features:
    """Which columns a probe keeps: all but `exclude`, and (with `outliers`) but each layer's
    outlier dimensions by `outlier_sigmas` (`metrics.outliers.outlier_dimensions`, over the probed
    rows); z-scored by each training part when `standardize`."""

    exclude: tuple[int, ...] = ()
    outliers: bool = False
    outlier_sigmas: float = 3.0
    standardize: bool = False

    def kept(self, width: int, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
        dropped = np.zeros(width, dtype=bool)
        dropped[list(self.exclude)] = True
        if self.outliers:
            stats = DimensionStats(0, mean, std, np.full(width, np.nan))
            dropped[outlier_dimensions(stats, self.outlier_sigmas)] = True
        return np.flatnonzero(~dropped)


def finalize_ridge(features: Features, groups: list[slice], alpha: float | None, alphas: Sequence[float],
                   moments: probes.FoldMoments) -> probes.RidgeFit:
    """Every fold's fit of one layer from its merged moments."""
    unmap_large_frees()
    keep = features.kept(moments.width, *moments.column_stats())
    return moments.finalize(groups, alpha, alphas, features.standardize, keep)


@dataclass(frozen=True)
class LogisticScores:
    """One layer's logistic probe, per fold: held-out confusion counts and log-loss of the task (and
    of the control task), the iterations taken and whether L-BFGS converged."""

    counts: np.ndarray  # (groups, folds, classes, classes)
    log_loss: np.ndarray  # (groups, folds)
    iterations: np.ndarray  # (groups, folds)
    converged: np.ndarray  # (groups, folds)


def logistic_layer(store: StoreHandle, run_key: str, layer: int, pool: str | None, offsets: np.ndarray | None,
                   fold: np.ndarray, codes: np.ndarray, classes: int, features: Features, C: float, tol: float,
                   max_iter: int, device_policy: str = "cpu") -> LogisticScores:
    """Fit and score the logistic probe of one layer: its labelled rows in memory, one fit per fold
    and target (codes (n, groups): the task's and the control's classes; fold < 0: unlabelled)."""
    unmap_large_frees()
    arrays = store.open()
    device = task_device(device_policy)
    labelled = np.flatnonzero(fold >= 0)
    n = len(fold)
    rows = np.concatenate([sample_rows(arrays, run_key, [layer], start, min(start + 4096, n), pool, offsets)[0]
                           for start in range(0, n, 4096)]).astype(np.float64)[labelled]
    rows = rows[:, features.kept(rows.shape[1], rows.mean(axis=0), rows.std(axis=0))]
    folds, targets = fold[labelled], codes[labelled]
    k, groups = int(fold.max()) + 1, codes.shape[1]
    counts = np.zeros((groups, k, classes, classes), dtype=np.int64)
    losses, iterations, converged = np.zeros((groups, k)), np.zeros((groups, k)), np.zeros((groups, k))
    for f in range(k):
        train, test = rows[folds != f], rows[folds == f]
        if features.standardize:  # the training part's own means and population stds (StandardScaler)
            mean, std = train.mean(axis=0), train.std(axis=0)
            scale = np.where(std > 0, 1.0 / np.where(std > 0, std, 1.0), 0.0)
            train, test = (train - mean) * scale, (test - mean) * scale
        for g in range(groups):
            fit = probes.fit_logistic(train, targets[folds != f, g], classes, C, tol, max_iter, device)
            true = targets[folds == f, g]
            counts[g, f] = probes.confusion(true, fit.predict(test), classes)
            losses[g, f] = probes.log_loss(fit.log_proba(test), true)
            iterations[g, f], converged[g, f] = fit.iterations, fit.converged
    return LogisticScores(counts, losses, iterations, converged)
