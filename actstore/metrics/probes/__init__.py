"""Probes: how well each layer's rows predict a label of their sample, on held-out folds
(METRICS.md, "Probes"; Alain and Bengio 2016, Belinkov 2022, Hewitt and Liang 2019).

- `folds`: the documented fold rule from the sample ids (stratified, groups kept whole) and the
  control task's seeded relabelling;
- `ridge`: the streamed ridge probe (per-fold float64 moments, every fold's fit from their totals,
  alpha by inner CV over a grid from one eigendecomposition per training part) and its second
  pass of predictions;
- `logistic`: the L2 logistic probe by L-BFGS over rows in memory (numpy, or torch on a GPU);
- `scores`: accuracy, macro-F1, log-loss, R^2, their summary over folds, baselines, the best
  layer, and the metric-vs-performance correlations of "Layer by Layer".
"""

from .folds import FOLD_RULE, assign_folds, control_labels
from .logistic import LogisticFit, fit_logistic
from .ridge import DEFAULT_ALPHAS, FoldConfusion, FoldMoments, RidgeFit, class_predictions, class_targets
from .scores import (
    FoldSummary,
    accuracy,
    best_layers,
    confusion,
    distance_correlation,
    log_loss,
    macro_f1,
    majority_baseline,
    pearson,
    r2,
    spearman,
    summarise,
)

DEFINITION_VERSION = 1

__all__ = ["DEFAULT_ALPHAS", "DEFINITION_VERSION", "FOLD_RULE", "FoldConfusion", "FoldMoments", "FoldSummary",
           "LogisticFit", "RidgeFit", "accuracy", "assign_folds", "best_layers", "class_predictions",
           "class_targets", "confusion", "control_labels", "distance_correlation", "fit_logistic", "log_loss",
           "macro_f1", "majority_baseline", "pearson", "r2", "spearman", "summarise"]
