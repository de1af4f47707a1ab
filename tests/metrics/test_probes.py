"""The probe numerics against scikit-learn and independent float64 formulas (METRICS.md, "Probes")."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from sklearn.linear_model import LogisticRegression, Ridge, RidgeClassifier
from sklearn.metrics import f1_score
from sklearn.metrics import log_loss as sklearn_log_loss
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from actstore.metrics import probes
from tests.probe_formulas import folds_by_the_documented_rule

ALPHAS = tuple(float(10.0 ** (k / 2)) for k in range(-6, 7))


def data(n=600, d=24, classes=3, seed=0, offset=40.0):
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=(n, d)) * rng.uniform(0.5, 4, size=d) + offset).astype(np.float16)
    scores = (x.astype(np.float64) - offset) @ rng.normal(size=(d, classes)) + rng.normal(size=(n, classes)) * 8
    codes = scores.argmax(axis=1)
    assert np.bincount(codes, minlength=classes).min() >= n // (4 * classes)  # every class well represented
    return x, codes, [f"s{i}" for i in range(n)]


def streamed(x, fold, targets, k, chunk=64, order=None):
    """FoldMoments over chunks in `order`, each chunk its own map task, merged in that order."""
    total = probes.FoldMoments(x.shape[1], k, targets.shape[1])
    starts = list(range(0, len(x), chunk))
    for s in order(starts) if order else starts:
        part = probes.FoldMoments(x.shape[1], k, targets.shape[1])
        part.update(x[s:s + chunk], fold[s:s + chunk], targets[s:s + chunk])
        total.merge(part)
    return total


# ---- folds ----------------------------------------------------------------------------------------
def test_folds_follow_the_documented_rule_and_are_stratified():
    _, codes, ids = data(n=503)
    fold = probes.assign_folds(ids, 5, codes)
    np.testing.assert_array_equal(fold, folds_by_the_documented_rule(ids, 5, codes))
    assert np.ptp(np.bincount(fold)) <= 1  # sizes differ by at most one overall
    for c in np.unique(codes):
        assert np.ptp(np.bincount(fold[codes == c], minlength=5)) <= 1  # every class in floor/ceil per fold
    # the same ids and labels in another order give every sample the same fold
    order = np.random.default_rng(1).permutation(len(ids))
    again = probes.assign_folds([ids[i] for i in order], 5, codes[order])
    np.testing.assert_array_equal(again, fold[order])


def test_groups_never_straddle_folds():
    ids = [f"v{i}" for i in range(90)]
    groups = np.repeat(np.arange(30), 3)
    classes = np.repeat(np.arange(30) % 2, 3)
    fold = probes.assign_folds(ids, 4, classes, groups)
    assert all(len(set(fold[groups == g])) == 1 for g in range(30))
    np.testing.assert_array_equal(fold, folds_by_the_documented_rule(ids, 4, classes, groups))


def test_control_labels_keep_the_class_sizes_and_are_seeded():
    _, codes, ids = data(n=300)
    control = probes.control_labels(codes, ids, seed=3)
    np.testing.assert_array_equal(np.bincount(control), np.bincount(codes))
    np.testing.assert_array_equal(control, codes[np.random.default_rng(3).permutation(300)])
    assert not np.array_equal(control, probes.control_labels(codes, ids, seed=4))
    groups = np.repeat(np.arange(100), 3)
    grouped = probes.control_labels(np.repeat(np.arange(100) % 4, 3), [f"g{i}" for i in range(300)], 0, groups)
    assert all(len(set(grouped[groups == g])) == 1 for g in range(100))


# ---- ridge ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("classes", [2, 3])
def test_ridge_classifier_equals_scikit_learn(classes):
    x, codes, ids = data(classes=classes)
    k, alpha = 5, 2.5
    fold = probes.assign_folds(ids, k, codes)
    fit = streamed(x, fold, probes.class_targets(codes, classes), k).finalize([slice(None)], alpha=alpha,
                                                                               alphas=ALPHAS)
    rows = x.astype(np.float64)
    for f in range(k):
        train, test = fold != f, fold == f
        model = RidgeClassifier(alpha=alpha).fit(rows[train], codes[train])
        ours = fit.scores(x[test], fold[test])
        theirs = model.decision_function(rows[test]).reshape(len(ours), -1)
        np.testing.assert_allclose(ours, theirs, atol=1e-8, rtol=0)
        assert (probes.class_predictions(ours) == model.predict(rows[test])).all()


def test_ridge_regression_and_its_r2_from_moments_equal_scikit_learn():
    x, _, ids = data()
    rng = np.random.default_rng(5)
    y = x.astype(np.float64) @ rng.normal(size=x.shape[1]) + rng.normal(size=len(x)) * 3
    k = 4
    fold = probes.assign_folds(ids, k)
    for standardize in (False, True):
        fit = streamed(x, fold, y[:, None], k).finalize([slice(None)], alpha=0.7, alphas=ALPHAS,
                                                         standardize=standardize)
        for f in range(k):
            train, test = fold != f, fold == f
            model = Ridge(alpha=0.7)
            if standardize:
                model = make_pipeline(StandardScaler(), model)
            model.fit(x[train].astype(np.float64), y[train])
            predicted = model.predict(x[test].astype(np.float64))
            np.testing.assert_allclose(fit.scores(x[test], fold[test])[:, 0], predicted, atol=1e-8, rtol=0)
            r2 = probes.r2(fit.heldout_sse[f, 0], fit.heldout_sst[f, 0])
            assert r2 == pytest.approx(model.score(x[test].astype(np.float64), y[test]), abs=1e-10)


def test_the_streamed_moments_do_not_depend_on_the_chunking_or_its_order():
    x, codes, ids = data()
    fold = probes.assign_folds(ids, 5, codes)
    targets = probes.class_targets(codes, 3)
    one = streamed(x, fold, targets, 5, chunk=len(x)).finalize([slice(None)], alpha=1.0, alphas=ALPHAS)
    shuffled = streamed(x, fold, targets, 5, chunk=37,
                        order=lambda s: list(np.random.default_rng(2).permutation(s))).finalize(
        [slice(None)], alpha=1.0, alphas=ALPHAS)
    np.testing.assert_allclose(shuffled.weights, one.weights, rtol=1e-9, atol=1e-12)
    # the intercepts are relative to each state's shift (its first chunk's mean): the predictions agree
    np.testing.assert_allclose(shuffled.scores(x, fold), one.scores(x, fold), rtol=0, atol=1e-9)


def test_inner_cross_validation_picks_the_alpha_a_brute_force_search_picks():
    """For each outer fold: refit scikit-learn's Ridge on every inner training part (the other outer
    folds but one) at every alpha of the grid, and pick the alpha of the least summed held-out
    squared error of the one-vs-rest targets (ties to the larger alpha)."""
    x, codes, ids = data(n=300, d=12, seed=4)
    k = 4
    fold = probes.assign_folds(ids, k, codes)
    targets = probes.class_targets(codes, 3)
    grid = (0.01, 1.0, 30.0, 1000.0, 30000.0)
    fit = streamed(x, fold, targets, k).finalize([slice(None)], alpha=None, alphas=grid)
    rows = x.astype(np.float64)
    for f in range(k):
        errors = []
        for alpha in grid:
            sse = 0.0
            for g in set(range(k)) - {f}:
                train = (fold != f) & (fold != g)
                model = Ridge(alpha=alpha).fit(rows[train], targets[train])
                sse += float(((model.predict(rows[fold == g]) - targets[fold == g]) ** 2).sum())
            errors.append(sse)
        errors = np.asarray(errors)
        np.testing.assert_allclose(fit.inner_errors[f, 0] * (fold != f).sum(), errors, rtol=1e-8)
        assert fit.alphas[f, 0] == grid[len(grid) - 1 - int(np.argmin(errors[::-1]))]


def test_columns_and_target_groups():
    """Kept columns are the only ones fitted; two target groups (a task and its control) pick their
    alphas apart and each equals the fit of that group alone."""
    x, codes, ids = data(n=300, d=10)
    fold = probes.assign_folds(ids, 3, codes)
    task, control = probes.class_targets(codes, 3), probes.class_targets(np.roll(codes, 7), 3)
    keep = np.array([0, 2, 3, 7, 9])
    both = streamed(x, fold, np.hstack([task, control]), 3).finalize([slice(0, 3), slice(3, 6)], alphas=ALPHAS,
                                                                    keep=keep)
    alone = streamed(x, fold, control, 3).finalize([slice(None)], alphas=ALPHAS, keep=keep)
    np.testing.assert_array_equal(both.alphas[:, 1], alone.alphas[:, 0])
    np.testing.assert_allclose(both.weights[:, :, 3:], alone.weights, rtol=1e-9, atol=1e-12)
    rows = x.astype(np.float64)[:, keep]
    model = RidgeClassifier(alpha=float(both.alphas[0, 0])).fit(rows[fold != 0], codes[fold != 0])
    np.testing.assert_allclose(both.scores(x[fold == 0], fold[fold == 0])[:, :3],
                               model.decision_function(rows[fold == 0]), atol=1e-8)


def test_a_fold_without_rows_is_refused():
    x, codes, ids = data(n=40)
    fold = np.where(np.arange(40) < 20, 0, 1)
    moments = probes.FoldMoments(x.shape[1], 3, 1)
    moments.update(x, fold, probes.class_targets(codes, 2))
    with pytest.raises(ValueError, match="fold 2 holds no rows"):
        moments.finalize([slice(None)], alpha=1.0, alphas=ALPHAS)


# ---- logistic -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("classes", "C"), [(2, 0.3), (3, 1.0), (4, 10.0)])
def test_logistic_equals_scikit_learn(classes, C):
    x, codes, _ = data(n=800, d=16, classes=classes, offset=0.0, seed=classes)
    rows = x.astype(np.float64)
    train, test = np.arange(800) % 5 != 0, np.arange(800) % 5 == 0
    ours = probes.fit_logistic(rows[train], codes[train], classes, C=C, tol=1e-6, max_iter=5000)
    theirs = LogisticRegression(C=C, tol=1e-6, max_iter=5000).fit(rows[train], codes[train])
    assert ours.converged
    agree = (ours.predict(rows[test]) == theirs.predict(rows[test])).mean()
    assert agree >= 0.999
    assert abs((ours.predict(rows[test]) == codes[test]).mean() - theirs.score(rows[test], codes[test])) <= 1e-3
    np.testing.assert_allclose(np.exp(ours.log_proba(rows[test])), theirs.predict_proba(rows[test]), atol=1e-4)
    assert probes.log_loss(ours.log_proba(rows[test]), codes[test]) == pytest.approx(
        sklearn_log_loss(codes[test], theirs.predict_proba(rows[test]), labels=list(range(classes))), abs=1e-4)


def test_logistic_on_torch_agrees_with_numpy():
    x, codes, _ = data(n=300, d=8, offset=0.0)
    rows = x.astype(np.float64)
    host = probes.fit_logistic(rows, codes, 3, C=1.0, tol=1e-8, max_iter=2000)
    torch_cpu = probes.fit_logistic(rows, codes, 3, C=1.0, tol=1e-8, max_iter=2000, device="cpu")
    np.testing.assert_allclose(torch_cpu.weights, host.weights, atol=1e-5)


# ---- scores ---------------------------------------------------------------------------------------
def test_accuracy_and_macro_f1_equal_scikit_learn():
    rng = np.random.default_rng(0)
    true, predicted = rng.integers(0, 4, size=200), rng.integers(0, 4, size=200)
    predicted[predicted == 3] = 2  # a class never predicted
    matrix = probes.confusion(true, predicted, 4)
    assert probes.accuracy(matrix) == pytest.approx((true == predicted).mean(), abs=1e-15)
    assert probes.macro_f1(matrix) == pytest.approx(f1_score(true, predicted, average="macro", labels=[0, 1, 2, 3],
                                                             zero_division=0), abs=1e-12)


def test_the_fold_summary_is_the_corrected_resampled_t_interval():
    values = np.array([0.8, 0.82, 0.79, 0.85, 0.81])
    summary = probes.summarise(values, test_fraction=0.25)
    s = values.std(ddof=1)
    half = stats.t.ppf(0.975, 4) * np.sqrt((1 / 5 + 0.25) * s * s)
    assert (summary.mean, summary.std) == (pytest.approx(values.mean()), pytest.approx(s))
    assert (summary.low, summary.high) == (pytest.approx(values.mean() - half), pytest.approx(values.mean() + half))


def test_best_layer_and_the_smallest_within_tolerance():
    assert probes.best_layers(np.array([0.5, 0.79, 0.8, np.nan, 0.7]), 0.02) == (2, 1)
    assert probes.best_layers(np.array([np.nan, np.nan]), 0.01) == (-1, -1)


def test_correlations_equal_independent_formulas():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=13), rng.normal(size=13)
    b[3] = b[4]  # a tie
    assert probes.pearson(a, b) == pytest.approx(np.corrcoef(a, b)[0, 1], abs=1e-12)
    assert probes.spearman(a, b) == pytest.approx(stats.spearmanr(a, b).statistic, abs=1e-12)

    def dcor(x, y):  # Szekely, Rizzo & Bakirov 2007, eq. 2.8-2.10, with explicit loops
        n = len(x)
        def centred(v):
            d = [[abs(v[i] - v[j]) for j in range(n)] for i in range(n)]
            row = [sum(r) / n for r in d]
            total = sum(row) / n
            return [[d[i][j] - row[i] - row[j] + total for j in range(n)] for i in range(n)]
        A, B = centred(x), centred(y)
        v = lambda P, Q: sum(P[i][j] * Q[i][j] for i in range(n) for j in range(n)) / n**2  # noqa: E731
        return np.sqrt(v(A, B) / np.sqrt(v(A, A) * v(B, B)))

    assert probes.distance_correlation(a, b) == pytest.approx(dcor(a, b), abs=1e-12)
    assert probes.distance_correlation(a, a**2 + 1) == pytest.approx(dcor(a, a**2 + 1), abs=1e-12)
    assert probes.distance_correlation(a, np.ones(13)) == 0.0
    assert np.isnan(probes.pearson(a, np.ones(13)))
