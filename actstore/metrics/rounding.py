"""What lossy storage did to each layer, measured where the exact values are (METRICS.md, "Error
bounds of lossy storage"): a streaming accumulator over the exact rows X and the stored rows Xhat
of every layer, fed shard by shard at capture, mergeable in any order.

Per layer, over all n rows:

* `rel_frobenius` = ||Xhat - X||_F / ||X||_F and `max_abs` = max |Xhat - X|;
* `cka_biased` = CKA(X, Xhat) (Kornblith et al. 2019) and `cka_debiased` = its debiased form
  (the unbiased HSIC of Song et al. 2007), from the streaming feature-space moments of the two
  blocks [X, Xhat] (`similarity.FeatureMoments`: X^T X, Xhat^T Xhat, X^T Xhat, the row norms and
  cross sums, float64);
* `angle_biased`, `angle_debiased` = arccos of those, the deterministic bound: linear CKA is the
  cosine of the angle between the centred Gram matrices, an angle in [0, pi/2] that obeys the
  triangle inequality, so |CKA(Xhat, Y) - CKA(X, Y)| <= angle(X, Xhat) for every Y, and the sum
  of both sides' angles when both are stored lossily; debiased CKA is a cosine in the U-centred
  inner product (Szekely and Rizzo 2014), and the same holds for it. Each angle is taken at a
  cosine lowered by `ROUNDING_ALLOWANCE` n (float64 accumulation over n rows), so rounding in
  the moments never makes the bound smaller than the true angle. A layer stored exactly has
  CKA 1 and angle 0; otherwise an angle is NaN where its CKA is undefined (n < 4 for the
  debiased one), and so is any bound with it.
"""

from __future__ import annotations

import math

import numpy as np

from .similarity.cka import cka_matrix
from .similarity.inputs import MIN_HSIC_SAMPLES
from .similarity.moments import FeatureMoments

FIGURES = ("rows", "rel_frobenius", "max_abs", "cka_biased", "cka_debiased", "angle_biased", "angle_debiased")
ROUNDING_ALLOWANCE = 8 * np.finfo(np.float64).eps  # on the cosine, per row accumulated


def angle_bound(cosine: float, n: int) -> float:
    """arccos of a measured CKA(X, Xhat), lowered first by the rounding allowance of n rows."""
    if not math.isfinite(cosine):
        return math.nan
    return math.acos(max(-1.0, min(1.0, cosine) - ROUNDING_ALLOWANCE * n))


class ErrorFigures:
    """The rounding of L+1 layers of `width` columns: `update(exact, stored)` with a shard's
    (L+1, rows, width) exact and stored values (numpy, or torch tensors on any one device: the
    products then run there in float64), `merge` another's, `finalize` the figures per layer.

    Memory: one `FeatureMoments` of two blocks a layer, (2 width)^2 float64 each (4.7 MB at width
    384, 10.6 MB at 576), whatever n."""

    def __init__(self, num_states: int, width: int) -> None:
        self.width = width
        self.moments = [FeatureMoments((width, width)) for _ in range(num_states)]
        self.error_squares = np.zeros(num_states)
        self.exact_squares = np.zeros(num_states)
        self.max_abs = np.zeros(num_states)

    @staticmethod
    def estimate_nbytes(num_states: int, width: int) -> int:
        return num_states * FeatureMoments.estimate_nbytes((width, width))

    def update(self, exact, stored) -> None:
        if isinstance(exact, np.ndarray):
            error = stored.astype(np.float64) - exact.astype(np.float64)
            self.error_squares += np.einsum("lrd,lrd->l", error, error)
            exact64 = exact.astype(np.float64)
            self.exact_squares += np.einsum("lrd,lrd->l", exact64, exact64)
            if error.shape[1]:
                self.max_abs = np.maximum(self.max_abs, np.abs(error).max(axis=(1, 2)))
            for layer, moments in enumerate(self.moments):
                moments.add_blocks([exact[layer], stored[layer]])
            return
        error = stored.double() - exact.double()
        self.error_squares += (error * error).sum(dim=(1, 2)).cpu().numpy()
        self.exact_squares += (exact.double() ** 2).sum(dim=(1, 2)).cpu().numpy()
        if error.shape[1]:
            self.max_abs = np.maximum(self.max_abs, error.abs().amax(dim=(1, 2)).cpu().numpy())
        for layer, moments in enumerate(self.moments):
            moments.add_tensors([exact[layer], stored[layer]])

    def merge(self, other: ErrorFigures) -> ErrorFigures:
        for mine, theirs in zip(self.moments, other.moments):
            mine.absorb(theirs)
        self.error_squares += other.error_squares
        self.exact_squares += other.exact_squares
        self.max_abs = np.maximum(self.max_abs, other.max_abs)
        return self

    def finalize(self) -> dict[str, list[float]]:
        """{figure: one value per layer} for every name in `FIGURES`."""
        figures: dict[str, list[float]] = {name: [] for name in FIGURES}
        for layer, moments in enumerate(self.moments):
            n = moments.n
            cross_sq, hsic = moments.pairwise_statistics(with_hsic=n >= MIN_HSIC_SAMPLES)
            biased = float(cka_matrix(cross_sq)[0, 1])
            debiased = float(cka_matrix(hsic)[0, 1]) if hsic is not None else math.nan
            if self.error_squares[layer] == 0:  # stored exactly (a constant layer, say): no angle at all
                biased = debiased = 1.0
            exact = self.exact_squares[layer]
            rel = math.sqrt(self.error_squares[layer] / exact) if exact > 0 else math.sqrt(self.error_squares[layer])
            for name, value in zip(FIGURES, (n, rel, float(self.max_abs[layer]), biased, debiased,
                                             angle_bound(biased, n), angle_bound(debiased, n))):
                figures[name].append(float(value))
        for name in ("angle_biased", "angle_debiased"):  # exactly stored: 0, not the allowance
            figures[name] = [0.0 if e == 0 else a for e, a in zip(self.error_squares, figures[name])]
        return figures
