"""Linear-regression R^2 (`linear_regression-r2`, and `linear_regression-r2-reverse`), streamed
from the second moments.

B predicted from A by least squares: W = argmin ||Yc - Xc W||_F (the minimum-norm solution when
Xc is rank deficient), and

    R^2(A -> B) = 1 - ||Yc - Xc W||_F^2 / ||Yc||_F^2 = tr(C_ba C_aa^+ C_ab) / tr C_bb

with C_aa = Xc^T Xc, C_ab = Xc^T Yc, C_bb = Yc^T Yc from the column-centred rows (an intercept is
fitted: centring is the intercept). This is the in-sample R^2 of the multivariate regression
(Klabunde et al. 2023, "Similarity of neural network models: a survey of functional and
representational measures", sec. 3.4; ReSi's LinearRegression; the similarity repository's
linear_regression-r2, without cross-validation). `linear_regression-r2` predicts the columns'
layer (B) from the rows' (A); `-reverse` predicts A from B. C_aa^+ keeps the eigen-directions
above 1e-10 of the largest eigenvalue (`metrics.similarity.shape.Spectrum`), so
tr(C_ba C_aa^+ C_ab) = ||diag(l^-1/2) V^T C_ab||_F^2.

Range [0, 1], 1 between a layer and itself, and 1 by construction when the predicting layer spans
every direction of the samples (n - 1 <= its width). Invariant to translation of both sides, any
invertible linear map of the predictor A, and orthogonal maps and isotropic scaling of the target
B; not symmetric. NaN when the target is constant; 0 when only the predictor is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from actstore.measures import MOMENTS, Measure, register


@dataclass(frozen=True)
class Side:
    """A block as predictor (its kept spectrum) and as target (tr C)."""

    values: np.ndarray
    vectors: np.ndarray
    total: float


def regression_measure(reverse: bool):
    """The `MomentMeasure` of linear_regression-r2 (A predicts B), or of the reverse."""
    from actstore.metrics.similarity import MomentMeasure

    compare = _r2_reverse if reverse else _r2
    return MomentMeasure(prepare=_side, compare=compare, symmetric=False)


def _side(cov: np.ndarray) -> Side:
    from actstore.metrics.similarity.shape import Spectrum

    spectrum = Spectrum.of(cov)
    return Side(spectrum.values, spectrum.vectors, float(np.trace(cov)))


def _explained(predictor: Side, target: Side, cross: np.ndarray) -> float:
    """tr(C_ba C_aa^+ C_ab) / tr C_bb, `cross` = C_ab (predictor rows, target columns)."""
    if target.total <= 0.0:
        return float("nan")
    projected = predictor.vectors.T @ cross
    return float(np.sum(projected**2 / predictor.values[:, None]) / target.total)


def _r2(side_a: Side, side_b: Side, cross: np.ndarray) -> float:
    return _explained(side_a, side_b, cross)


def _r2_reverse(side_a: Side, side_b: Side, cross: np.ndarray) -> float:
    return _explained(side_b, side_a, cross.T)


register(Measure(
    "linear_regression-r2", "R^2 of the columns' layer B predicted from the rows' layer A by least squares",
    MOMENTS, f"{__name__}:regression_measure", bounds=(0.0, 1.0), arguments={"reverse": False}, whitening="",
    symmetric=False, source="Klabunde et al. 2023"))
register(Measure(
    "linear_regression-r2-reverse", "R^2 of the rows' layer A predicted from the columns' layer B",
    MOMENTS, f"{__name__}:regression_measure", bounds=(0.0, 1.0), arguments={"reverse": True}, whitening="",
    symmetric=False, source="Klabunde et al. 2023"))
