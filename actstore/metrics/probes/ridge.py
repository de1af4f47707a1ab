"""The streamed ridge probe: per-fold float64 moments in one pass, every fold's fit from them.

METRICS.md, "Probes", Ridge. On the training part of fold f (every fold but f), with rows X and
targets Y centred at the training means, `W = (X^T X + alpha I)^{-1} X^T Y` and the intercept
`b = mean(Y) - mean(X) W`: scikit-learn's `Ridge(alpha, fit_intercept=True)`, and with targets
one-vs-rest in {-1, +1} (a single column for two classes, the second class positive) its
`RidgeClassifier`. All it needs are, per fold, the count, `sum x`, `sum x x^T`, `sum y`,
`sum x y^T` and `sum y^2`: `FoldMoments` accumulates them in one pass over the chunks in any
order, relative to a shift near the data (moved exactly when states merge), and each fold's
training moments are the totals minus its own. Memory O(folds x d^2), whatever n.

alpha: given, or picked per outer fold from a grid by an inner cross-validation on the training
part whose folds are the other outer folds (k-1 inner folds), by the held-out squared error of
the targets summed over their columns (the criterion of scikit-learn's efficient RidgeCV). One
eigendecomposition of each training part's `X^T X` serves the whole grid (the part without folds
f and g serves both (f, g) and (g, f): k(k-1)/2 of them, and k for the outer fits): with
`X^T X = V diag(l) V^T` and `Q = V^T X^T Y`, the weights at alpha are `W = V diag(1 / (l + alpha)) Q`,
and from a held-out part's moments about the training means (`Sxx`, `Sxy`, `Szz`) its squared
error of column t is `Szz_t - 2 (W^T Sxy)_tt + (W^T Sxx W)_tt`.
Ties in the error go to the larger alpha. Target columns can form groups that pick their alpha
apart (the real task and its control task share the rows' moments).

Standardise: each training part's columns are z-scored by its own means and population standard
deviations (scikit-learn's StandardScaler fitted on the training rows), applied to the moments
exactly; a constant column becomes 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._numerics import SymmetricSum

DEFAULT_ALPHAS = tuple(float(10.0 ** (k / 2)) for k in range(-6, 7))  # 1e-3 .. 1e3, 13 values


def class_targets(codes: np.ndarray, classes: int) -> np.ndarray:
    """One-vs-rest targets in {-1, +1} (scikit-learn's LabelBinarizer(neg_label=-1)): one column
    (class 1 positive) for two classes, one per class otherwise. `codes` < 0 give zero rows."""
    codes = np.asarray(codes)
    if classes == 2:
        return np.where(codes == 1, 1.0, -1.0)[:, None]
    targets = -np.ones((len(codes), classes))
    labelled = codes >= 0
    targets[np.flatnonzero(labelled), codes[labelled]] = 1.0
    return targets


def class_predictions(scores: np.ndarray) -> np.ndarray:
    """The class of each row of one-vs-rest scores: for one column, 1 where the score is > 0;
    otherwise the argmax (ties to the lower class), as RidgeClassifier.predict."""
    if scores.shape[1] == 1:
        return (scores[:, 0] > 0).astype(np.int64)
    return scores.argmax(axis=1)


@dataclass
class _Moments:
    """Summed moments of a set of rows about the accumulator's shift (u = x - shift)."""

    n: float
    row_sum: np.ndarray  # (d,)
    cross: np.ndarray  # (d, d)
    target_sum: np.ndarray  # (t,)
    cross_target: np.ndarray  # (d, t)
    target_squares: np.ndarray  # (t,)

    def __sub__(self, other: _Moments) -> _Moments:
        return _Moments(self.n - other.n, self.row_sum - other.row_sum, self.cross - other.cross,
                        self.target_sum - other.target_sum, self.cross_target - other.cross_target,
                        self.target_squares - other.target_squares)


@dataclass
class _Solver:
    """A training part, decomposed once: its means, column scale, eigenpairs and Q = V^T D X^T Y."""

    mean: np.ndarray
    target_mean: np.ndarray
    scale: np.ndarray
    eigenvalues: np.ndarray
    vectors: np.ndarray
    rotated: np.ndarray  # Q (d, t)

    @staticmethod
    def of(train: _Moments, standardize: bool) -> _Solver:
        mean, target_mean = train.row_sum / train.n, train.target_sum / train.n
        centred = train.cross - np.outer(train.row_sum, mean)
        cross_target = train.cross_target - np.outer(train.row_sum, target_mean)
        if standardize:
            std = np.sqrt(np.maximum(np.diag(centred), 0.0) / train.n)
            scale = np.where(std > 0, 1.0 / np.where(std > 0, std, 1.0), 0.0)
        else:
            scale = np.ones(len(mean))
        scaled = centred * scale[:, None] * scale[None, :]
        eigenvalues, vectors = np.linalg.eigh((scaled + scaled.T) / 2)
        rotated = vectors.T @ (cross_target * scale[:, None])
        return _Solver(mean, target_mean, scale, np.maximum(eigenvalues, 0.0), vectors, rotated)

    def squared_errors(self, held: _Moments, alphas: np.ndarray) -> np.ndarray:
        """Held-out squared error of each target column at each alpha, (t, grid), from `held`'s
        moments: its rows centred at this part's means and scaled like it, rotated into V."""
        mean, target_mean, scale = self.mean, self.target_mean, self.scale
        sxx = (held.cross - np.outer(held.row_sum, mean) - np.outer(mean, held.row_sum)
               + held.n * np.outer(mean, mean)) * scale[:, None] * scale[None, :]
        sxy = (held.cross_target - np.outer(held.row_sum, target_mean) - np.outer(mean, held.target_sum)
               + held.n * np.outer(mean, target_mean)) * scale[:, None]
        szz = held.target_squares - 2 * target_mean * held.target_sum + held.n * target_mean**2
        errors = np.empty((len(szz), len(alphas)))
        for j, alpha in enumerate(alphas):
            # W = V diag(a) Q: two (d x d) @ (d x t) products per alpha, no d x d x d one
            weights = self.vectors @ (self.rotated / (self.eigenvalues + alpha)[:, None])
            errors[:, j] = (szz - 2 * np.einsum("it,it->t", weights, sxy)
                            + np.einsum("it,it->t", weights, sxx @ weights))
        return errors

    def weights(self, alpha_of_column: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(W, b) in the shifted coordinates u = x - shift: predictions u W + b."""
        rotated_weights = self.rotated / (self.eigenvalues[:, None] + alpha_of_column[None, :])
        weights = (self.vectors @ rotated_weights) * self.scale[:, None]
        return weights, self.target_mean - self.mean @ weights


@dataclass
class RidgeFit:
    """Each outer fold's ridge fit over the kept columns `keep` of a layer: predictions for rows
    x are `(x[:, keep] - shift) @ weights[f] + intercepts[f]`. `alphas[f, g]`: the alpha of target
    group g in fold f; `inner_errors[f, g]`: its inner-CV mean squared error over the grid (NaN
    when alpha was given); `heldout_sse` / `heldout_sst` (folds, t): each fold's held-out squared
    error and its total sum of squares about the held-out mean (R^2 = 1 - sse / sst)."""

    keep: np.ndarray
    shift: np.ndarray
    weights: np.ndarray  # (folds, d_kept, t)
    intercepts: np.ndarray  # (folds, t)
    alphas: np.ndarray  # (folds, groups)
    grid: np.ndarray
    inner_errors: np.ndarray  # (folds, groups, grid)
    heldout_sse: np.ndarray
    heldout_sst: np.ndarray

    def scores(self, rows: np.ndarray, fold: np.ndarray) -> np.ndarray:
        """Each row's predictions by the fit of its own fold (rows of fold < 0: zeros)."""
        shifted = np.asarray(rows)[:, self.keep].astype(np.float64) - self.shift
        out = np.zeros((len(shifted), self.weights.shape[2]))
        for f in range(len(self.weights)):
            mine = fold == f
            if mine.any():
                out[mine] = shifted[mine] @ self.weights[f] + self.intercepts[f]
        return out


class FoldMoments:
    """Per-fold float64 moments of one layer's rows and their targets (see the module docstring).

    `update(rows, fold, targets)`: rows (m, d) of any float dtype, each row's fold (< 0: not in
    the probe, skipped) and its targets (m, t). `device` (None: numpy/BLAS) is where the d x d
    products run (`metrics.accumulator.OnDevice`)."""

    def __init__(self, width: int, folds: int, targets: int) -> None:
        self.width, self.folds, self.targets = width, folds, targets
        self.n = np.zeros(folds, dtype=np.int64)
        self.shift = np.zeros(width)
        self.row_sum = np.zeros((folds, width))
        self.cross = [SymmetricSum(width) for _ in range(folds)]
        self.target_sum = np.zeros((folds, targets))
        self.cross_target = np.zeros((folds, width, targets))
        self.target_squares = np.zeros((folds, targets))
        self.device: str | None = None

    @staticmethod
    def estimate_nbytes(width: int, folds: int, targets: int) -> int:
        return 8 * folds * (width * width + width * targets + width + 2 * targets) + 8 * width

    def update(self, rows: np.ndarray, fold: np.ndarray, targets: np.ndarray) -> None:
        fold = np.asarray(fold)
        inside = fold >= 0
        if not inside.all():
            rows, fold, targets = rows[inside], fold[inside], targets[inside]
        if not len(fold):
            return
        if not self.n.any():  # any shift is exact; one near the data keeps the sums centred
            self.shift = np.asarray(rows).mean(axis=0, dtype=np.float64)
        order = np.argsort(fold, kind="stable")
        shifted = np.subtract(np.asarray(rows)[order], self.shift, dtype=np.float64)
        values = np.asarray(targets, dtype=np.float64)[order]
        edges = np.searchsorted(fold[order], np.arange(self.folds + 1))
        for f in range(self.folds):
            a, b = edges[f], edges[f + 1]
            if a == b:
                continue
            part, y = shifted[a:b], values[a:b]
            self.cross[f].add(part, self.device)
            self.n[f] += b - a
            self.row_sum[f] += part.sum(axis=0)
            self.cross_target[f] += part.T @ y
            self.target_sum[f] += y.sum(axis=0)
            self.target_squares[f] += np.einsum("it,it->t", y, y)

    def move_shift(self, new_shift: np.ndarray) -> None:
        """Re-express every fold's moments about `new_shift`, exactly: with delta = new - old,
        `G' = G - S delta^T - delta S^T + n delta delta^T`, `XY' = XY - delta Sy^T`, `S' = S - n delta`."""
        delta = np.asarray(new_shift, dtype=np.float64) - self.shift
        if not delta.any():
            return
        for f in range(self.folds):
            self.cross[f].add_rank2(self.n[f] / 2 * delta - self.row_sum[f], delta)
            self.cross_target[f] -= np.outer(delta, self.target_sum[f])
            self.row_sum[f] -= self.n[f] * delta
        self.shift = self.shift + delta

    def merge(self, other: FoldMoments) -> FoldMoments:
        """Add another task's rows (`other` is only read: it may be a read-only buffer)."""
        if not other.n.any():
            return self
        if not self.n.any():
            self.shift = np.array(other.shift)
        self.move_shift(other.shift)
        self.n = self.n + other.n
        self.row_sum = self.row_sum + other.row_sum
        for mine, theirs in zip(self.cross, other.cross):
            mine.merge(theirs)
        self.target_sum = self.target_sum + other.target_sum
        self.cross_target = self.cross_target + other.cross_target
        self.target_squares = self.target_squares + other.target_squares
        return self

    def _fold(self, f: int, keep: np.ndarray) -> _Moments:
        cross = self.cross[f].matrix()
        return _Moments(float(self.n[f]), self.row_sum[f][keep], cross[np.ix_(keep, keep)], self.target_sum[f],
                        self.cross_target[f][keep], self.target_squares[f])

    def column_stats(self) -> tuple[np.ndarray, np.ndarray]:
        """(mean, population std) of every column over all rows: for the outlier rule."""
        n = self.n.sum()
        total = self.row_sum.sum(axis=0)
        squares = sum(np.diag(c.matrix()) for c in self.cross)
        mean_shifted = total / n
        variance = np.maximum(squares / n - mean_shifted**2, 0.0)
        return self.shift + mean_shifted, np.sqrt(variance)

    def finalize(self, groups: list[slice], alpha: float | None = None, alphas=DEFAULT_ALPHAS,
                 standardize: bool = False, keep: np.ndarray | None = None) -> RidgeFit:
        """Every outer fold's fit over columns `keep` (None: all), its alpha `alpha`, or per
        target group (`groups`: slices of the target columns) picked from `alphas` by the inner CV."""
        keep = np.arange(self.width) if keep is None else np.asarray(keep, dtype=np.int64)
        if (self.n == 0).any():
            raise ValueError(f"fold {int(np.argmin(self.n))} holds no rows")
        grid = np.asarray([alpha] if alpha is not None else sorted(alphas), dtype=np.float64)
        if len(grid) > 1 and self.folds < 3:
            raise ValueError("the inner cross-validation over a grid needs 3 or more folds (its inner folds are the "
                             "other outer folds)")
        parts = [self._fold(f, keep) for f in range(self.folds)]
        total = parts[0]
        for part in parts[1:]:
            total = _Moments(total.n + part.n, total.row_sum + part.row_sum, total.cross + part.cross,
                             total.target_sum + part.target_sum, total.cross_target + part.cross_target,
                             total.target_squares + part.target_squares)
        k, t = self.folds, self.targets
        weights, intercepts = np.empty((k, len(keep), t)), np.empty((k, t))
        chosen = np.empty((k, len(groups)))
        inner = np.full((k, len(groups), len(grid)), np.nan)
        sse, sst = np.empty((k, t)), np.empty((k, t))
        inner_parts: dict[tuple[int, int], _Solver] = {}  # all folds but f and g: the same part for (f, g) and (g, f)
        for f in range(k):
            train = total - parts[f]
            if len(grid) > 1:
                errors, count = np.zeros((t, len(grid))), 0.0
                for g in range(k):
                    if g != f:
                        pair = (min(f, g), max(f, g))
                        if pair not in inner_parts:
                            inner_parts[pair] = _Solver.of(total - parts[pair[0]] - parts[pair[1]], standardize)
                        errors += inner_parts[pair].squared_errors(parts[g], grid)
                        count += parts[g].n
                for index, group in enumerate(groups):
                    inner[f, index] = errors[group].sum(axis=0) / count
                    # ties to the larger alpha: argmin over the grid read from its top
                    chosen[f, index] = grid[len(grid) - 1 - int(np.argmin(inner[f, index][::-1]))]
            else:
                chosen[f] = grid[0]
            alpha_of_column = np.empty(t)
            for index, group in enumerate(groups):
                alpha_of_column[group] = chosen[f, index]
            solver = _Solver.of(train, standardize)
            weights[f], intercepts[f] = solver.weights(alpha_of_column)
            held = parts[f]
            sse[f] = _column_errors(solver, held, alpha_of_column)
            sst[f] = held.target_squares - held.target_sum**2 / held.n
        return RidgeFit(keep, self.shift[keep], weights, intercepts, chosen, grid, inner, sse, sst)


def _column_errors(solver: _Solver, held: _Moments, alpha_of_column: np.ndarray) -> np.ndarray:
    """Each target column's held-out squared error at its own alpha, (t,)."""
    out = np.empty(len(alpha_of_column))
    for alpha in np.unique(alpha_of_column):
        columns = alpha_of_column == alpha
        out[columns] = solver.squared_errors(held, np.asarray([alpha]))[columns, 0]
    return out


class FoldConfusion:
    """The second pass of a classification probe: each row predicted by its own fold's fit, the
    counts kept per target group and fold, `(groups, folds, classes, classes)` (true x predicted).
    `update(rows, fold, codes)`: `codes` (m, groups), each group's true class of the row."""

    def __init__(self, fit: RidgeFit, groups: list[slice], classes: int) -> None:
        self.fit, self.groups, self.classes = fit, groups, classes
        self.counts = np.zeros((len(groups), len(fit.weights), classes, classes), dtype=np.int64)

    def update(self, rows: np.ndarray, fold: np.ndarray, codes: np.ndarray) -> None:
        fold = np.asarray(fold)
        inside = fold >= 0
        if not inside.any():
            return
        rows, fold, codes = np.asarray(rows)[inside], fold[inside], np.asarray(codes)[inside]
        scores = self.fit.scores(rows, fold)
        for g, group in enumerate(self.groups):
            predicted = class_predictions(scores[:, group])
            cells = (fold * self.classes + codes[:, g]) * self.classes + predicted
            self.counts[g] += np.bincount(cells, minlength=self.counts[g].size).reshape(self.counts[g].shape)

    def merge(self, other: FoldConfusion) -> FoldConfusion:
        self.counts = self.counts + other.counts
        return self

    def finalize(self) -> np.ndarray:
        return self.counts
