"""What lossy storage did to each layer, measured where the exact values are (METRICS.md, "Error
bounds of lossy storage"): a streaming accumulator over the exact rows X and the stored rows Xhat
of every layer, fed shard by shard at capture, mergeable in any order.

Per layer, over all n rows:

* `rel_frobenius` = ||Xhat - X||_F / ||X||_F and `max_abs` = max |Xhat - X|;
* `cka_biased` = CKA(X, Xhat) (Kornblith et al. 2019) and `cka_debiased` = its debiased form
  (the unbiased HSIC of Song et al. 2007), from the streaming feature-space moments of the two
  blocks [X, Xhat] (`similarity.FeatureMoments`: X^T X, Xhat^T Xhat, X^T Xhat, the row norms and
  cross sums, float64);
* `angle_biased`, `angle_debiased` = arccos of those, the sure (deterministic) bound: linear CKA
  is the cosine of the angle between the centred Gram matrices, an angle in [0, pi/2] that obeys
  the triangle inequality, so |CKA(Xhat, Y) - CKA(X, Y)| <= angle(X, Xhat) for every Y; debiased
  CKA is a cosine in the U-centred inner product (Szekely and Rizzo 2014), and the same holds for
  it. Each angle is taken at a cosine lowered by `ROUNDING_ALLOWANCE` n (float64 accumulation
  over n rows), so rounding in the moments never makes the bound smaller than the true angle. A
  layer stored exactly has CKA 1 and angle 0; an angle is NaN where its CKA is undefined (n < 4
  for the debiased one), and so is any bound with it;
* `bound_biased`, `bound_debiased`: the statistical bound (`statistical_bound`), for any Y that
  does not depend on this layer's rounding draws, with probability at least `SIDE_CONFIDENCE`
  over them, and never above the angle (the smaller of two bounds is a bound). It rests on the
  stochastic rounding of `store.format.quantised` (errors of mean zero, independent given X,
  each in an interval one step wide) and shrinks like 1 / sqrt(n) where the angle does not
  shrink at all. With both sides of an answer stored lossily (independent draws), the sum of the
  two sides' bounds holds with probability at least `CONFIDENCE`;
* `gap_*`, `spread_*` (`SIDE_TERMS`): the coefficients of the same bound as a function of the
  pair's CKA c (gap |c| + spread sqrt(1 - c^2), on the same event), with which `answer_bound`
  makes an answer's bound finer from its own value: the side bound above is this at its worst
  c, and an answer near CKA 1 is off by far less than one near 0.
"""

from __future__ import annotations

import math

import numpy as np

from .similarity.cka import cka_matrix
from .similarity.inputs import MIN_HSIC_SAMPLES
from .similarity.moments import FeatureMoments

CODE_REACH = 128  # |code| <= 128: with the offset, a bound of a decoded value's magnitude

FIGURES = ("rows", "rel_frobenius", "max_abs", "cka_biased", "cka_debiased", "angle_biased", "angle_debiased",
           "bound_biased", "bound_debiased")
# The coefficients of `side_bound`, per layer: what an answer's bound is made finer with at query time
# (stored with the figures, not shown by `describe`).
SIDE_TERMS = ("gap_biased", "gap_debiased", "spread_biased", "spread_debiased")
ROUNDING_ALLOWANCE = 8 * np.finfo(np.float64).eps  # on the cosine, per row accumulated
CONFIDENCE = 0.999  # of an answer's bound, for each entry: both of its sides at once
SIDE_CONFIDENCE = 1 - (1 - CONFIDENCE) / 2  # of one side's bound (a union bound over the two sides)
# The float32 coding's own departures from ideal stochastic rounding, per value (store.format.quantised):
# a rounding probability off by 2^-24 plus fl((x - offset) / step) off by < 2^-16 codes shift the mean
# by < 2^-15 steps; the decode's multiply and add move a value by < 2^-22 of its magnitude bound.
DRAW_BIAS_STEPS = 2.0**-15
DECODE_ULPS = 2.0**-22


def statistical_bound(centred_grams: np.ndarray, cross_sq: np.ndarray, hsic: np.ndarray | None, n: int,
                      half_steps: np.ndarray, magnitudes: np.ndarray) -> tuple[tuple[float, float], ...]:
    """((bound, gap, spread) biased, (bound, gap, spread) debiased) of one layer: ``bound`` on
    |CKA(Xhat, Y) - CKA(X, Y)| for any fixed Y independent of the rounding draws, holding with
    probability >= `SIDE_CONFIDENCE` over them, and the two coefficients of the finer bound
    `side_bound` (``gap`` |c| + ``spread`` sqrt(1 - c^2), c = CKA(X, Y)) on the same event, of
    which ``bound`` = sqrt(gap^2 + spread^2) + allowance is the largest over c.

    ``centred_grams`` is the (2d, 2d) centred Gram of [X, Xhat] (blocks G = Xc^T Xc, Xc^T Xhat_c,
    Xhat_c^T Xhat_c), ``cross_sq`` and ``hsic`` the 2 x 2 `FeatureMoments.pairwise_statistics` of
    the pair, ``half_steps`` D_j = max over shards of step_j / 2 and ``magnitudes`` A_j = max over
    shards of |offset_j| + 128 step_j (a bound of |xhat|), per channel.

    With K = X X^T, Khat = K + Delta, Delta = X E^T + E X^T + E E^T (E = Xhat - X), a and ahat the
    centred (biased) or U-centred (debiased, Szekely and Rizzo 2014) K and Khat at unit norm in the
    matching inner product, N the norm of Khat's, and k the same of Y's: CKA(X, Y) = <a, k> = c and
    CKA(X, Xhat) = <a, ahat> = cos theta. Split k = c a + k_perp (||k_perp|| = sqrt(1 - c^2));
    ahat - a is orthogonal to k_perp but for Delta / N (a k_perp = 0), so, exactly,

        CKA(Xhat, Y) - CKA(X, Y) = <ahat - a, k> = c (cos theta - 1) + <Delta, k_perp> / N.

    The first term is at most |c| gap, gap = 1 - cos theta (measured, with the cosine lowered by
    the rounding allowance). The second, term by term (k_perp is symmetric, centred, and
    tr(k_perp^2) = 1 - c^2, so only centred X and E enter, and tr(k_perp^2 M) <= lambda_max(M)
    (1 - c^2) for M >= 0):

    * <E E^T, k_perp> <= ||Ec^T Ec||_F sqrt(1 - c^2) = F sqrt(1 - c^2): F measured;
    * <X E^T + E X^T, k_perp> = 2 sum_rj (k_perp Xc)_rj e_rj. Split e = z + b with z of mean
      zero (given X) and |b_rj| <= b_j = DRAW_BIAS_STEPS 2 D_j + DECODE_ULPS A_j: the b part is at
      most 2 ||k_perp Xc||_F ||b||_F <= 2 sqrt(lambda_max(G) (1 - c^2)) ||b||_F, and the z part is
      a sum of independent variables each in an interval of width 2 D_j + 2 DECODE_ULPS A_j =
      2 D'_j, so by Hoeffding's inequality it exceeds t with probability <= 2 exp(-t^2 / (2 V)),
      V = sum_rj (k_perp Xc)_rj^2 D'_j^2 = tr(k_perp^2 Xc D'^2 Xc^T) <= lambda_max(D' G D')
      (1 - c^2), whatever Y: t = sqrt(2 lambda_max(D' G D') log(2 / (1 - SIDE_CONFIDENCE))) sqrt(1 - c^2).

    spread = (2 t + 2 sqrt(lambda_max(G)) ||b||_F + F) / N (the factor sqrt(1 - c^2) taken out),
    and max_c (gap |c| + spread sqrt(1 - c^2)) = sqrt(gap^2 + spread^2). gap and spread each carry
    `ROUNDING_ALLOWANCE` n (float64 accumulation over n rows; |c| + sqrt(1 - c^2) >= 1, so the
    sum carries it at least once whatever c). Every value is NaN
    where N is zero or undefined (the debiased one needs n >= 4)."""
    width = len(half_steps)
    exact, cross, stored = (centred_grams[:width, :width], centred_grams[:width, width:],
                            centred_grams[width:, width:])
    error_gram = stored - cross - cross.T + exact  # Ec^T Ec
    spread = half_steps + DECODE_ULPS * magnitudes
    variance = float(np.linalg.eigvalsh(spread[:, None] * exact * spread[None, :])[-1])
    t = math.sqrt(2 * max(variance, 0.0) * math.log(2 / (1 - SIDE_CONFIDENCE)))
    bias = math.sqrt(n * float(np.sum((DRAW_BIAS_STEPS * 2 * half_steps + DECODE_ULPS * magnitudes) ** 2)))
    top = max(float(np.linalg.eigvalsh(exact)[-1]), 0.0)
    numerator = 2 * t + 2 * math.sqrt(top) * bias + float(np.linalg.norm(error_gram))
    norms = [(cross_sq, 1.0), (hsic, n * (n - 3)) if hsic is not None else (None, 1.0)]
    found = []
    for moments, scale in norms:
        if moments is None or not (moments[1, 1] > 0 and moments[0, 0] > 0):
            found.append((math.nan, math.nan, math.nan))
            continue
        cosine = moments[0, 1] / math.sqrt(moments[0, 0] * moments[1, 1])
        gap = min(1.0, max(0.0, 1 - cosine + ROUNDING_ALLOWANCE * n))
        width_term = numerator / math.sqrt(scale * moments[1, 1]) + ROUNDING_ALLOWANCE * n
        found.append((math.hypot(gap, width_term), gap, width_term))
    return tuple(found)


def side_bound(c: np.ndarray, half_width: np.ndarray, bound: np.ndarray, gap: np.ndarray,
               spread: np.ndarray, debiased: bool) -> np.ndarray:
    """One lossy side's bound on an answer whose exact CKA c (the pair's, with this side exact) lies
    within ``half_width`` of ``c``: the largest of gap |c'| + spread sqrt(1 - c'^2) over c' in that
    interval (clipped to [0, 1] biased, [-1, 1] debiased), never above ``bound`` (the side's bound
    for any Y; so a NaN gap or spread, as in runs stored before them, leaves ``bound``).

    The function of |c'| rises to its top at |c'| = gap / sqrt(gap^2 + spread^2) and falls after
    it, so its largest value over an interval of |c'| is at the point of it nearest that top."""
    lo, hi = c - half_width, c + half_width
    if debiased:  # |c'| over [lo, hi] within [-1, 1]
        lo, hi = np.maximum(lo, -1.0), np.minimum(hi, 1.0)
        low = np.where((lo <= 0) & (hi >= 0), 0.0, np.minimum(np.abs(lo), np.abs(hi)))
        high = np.maximum(np.abs(lo), np.abs(hi))
    else:
        low, high = np.clip(lo, 0.0, 1.0), np.clip(hi, 0.0, 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        top = gap / np.hypot(gap, spread)
        at = np.clip(np.where(np.isfinite(top), top, 0.0), low, np.maximum(low, high))
        finer = gap * at + spread * np.sqrt(np.maximum(0.0, 1 - at * at))
    return np.where(np.isfinite(finer), np.fmin(finer, bound), bound)


def angle_bound(cosine: float, n: int) -> float:
    """arccos of a measured CKA(X, Xhat), lowered first by the rounding allowance of n rows."""
    if not math.isfinite(cosine):
        return math.nan
    return math.acos(max(-1.0, min(1.0, cosine) - ROUNDING_ALLOWANCE * n))


class ErrorFigures:
    """The rounding of L+1 layers of `width` columns: `update(exact, stored, state)` with a shard's
    (L+1, rows, width) exact and stored values and its (2, L+1, width) steps and offsets (numpy, or
    torch tensors on any one device: the products then run there in float64), `merge` another's,
    `finalize` the figures per layer.

    Memory: one `FeatureMoments` of two blocks a layer, (2 width)^2 float64 each (4.7 MB at width
    384, 10.6 MB at 576), whatever n."""

    def __init__(self, num_states: int, width: int) -> None:
        self.width = width
        self.moments = [FeatureMoments((width, width)) for _ in range(num_states)]
        self.error_squares = np.zeros(num_states)
        self.exact_squares = np.zeros(num_states)
        self.max_abs = np.zeros(num_states)
        self.half_steps = np.zeros((num_states, width))  # max over shards of step / 2
        self.magnitudes = np.zeros((num_states, width))  # max over shards of |offset| + 128 step

    @staticmethod
    def estimate_nbytes(num_states: int, width: int) -> int:
        return num_states * FeatureMoments.estimate_nbytes((width, width))

    def update(self, exact, stored, state) -> None:
        if isinstance(exact, np.ndarray):
            steps, offsets = state[0].astype(np.float64), state[1].astype(np.float64)
            error = stored.astype(np.float64) - exact.astype(np.float64)
            self.error_squares += np.einsum("lrd,lrd->l", error, error)
            exact64 = exact.astype(np.float64)
            self.exact_squares += np.einsum("lrd,lrd->l", exact64, exact64)
            if error.shape[1]:
                self.max_abs = np.maximum(self.max_abs, np.abs(error).max(axis=(1, 2)))
            for layer, moments in enumerate(self.moments):
                moments.add_blocks([exact[layer], stored[layer]])
        else:
            steps, offsets = (part.double().cpu().numpy() for part in state)
            error = stored.double() - exact.double()
            self.error_squares += (error * error).sum(dim=(1, 2)).cpu().numpy()
            self.exact_squares += (exact.double() ** 2).sum(dim=(1, 2)).cpu().numpy()
            if error.shape[1]:
                self.max_abs = np.maximum(self.max_abs, error.abs().amax(dim=(1, 2)).cpu().numpy())
            for layer, moments in enumerate(self.moments):
                moments.add_tensors([exact[layer], stored[layer]])
        self.half_steps = np.maximum(self.half_steps, steps / 2)
        self.magnitudes = np.maximum(self.magnitudes, np.abs(offsets) + CODE_REACH * steps)

    def merge(self, other: ErrorFigures) -> ErrorFigures:
        for mine, theirs in zip(self.moments, other.moments):
            mine.absorb(theirs)
        self.error_squares += other.error_squares
        self.exact_squares += other.exact_squares
        self.max_abs = np.maximum(self.max_abs, other.max_abs)
        self.half_steps = np.maximum(self.half_steps, other.half_steps)
        self.magnitudes = np.maximum(self.magnitudes, other.magnitudes)
        return self

    def finalize(self) -> dict[str, list[float]]:
        """{figure: one value per layer} for every name in `FIGURES` and `SIDE_TERMS`."""
        figures: dict[str, list[float]] = {name: [] for name in FIGURES + SIDE_TERMS}
        for layer, moments in enumerate(self.moments):
            n = moments.n
            centred = moments.centred()
            cross_sq, hsic = centred.pairwise_statistics(with_hsic=n >= MIN_HSIC_SAMPLES, in_place=True)
            biased = float(cka_matrix(cross_sq)[0, 1])
            debiased = float(cka_matrix(hsic)[0, 1]) if hsic is not None else math.nan
            exact = self.exact_squares[layer]
            rel = math.sqrt(self.error_squares[layer] / exact) if exact > 0 else math.sqrt(self.error_squares[layer])
            if self.error_squares[layer] == 0:  # stored exactly (a constant layer, say): no error at all
                biased = debiased = 1.0
                angles = bounds = gaps = spreads = (0.0, 0.0)
            else:
                angles = (angle_bound(biased, n), angle_bound(debiased, n))
                found = statistical_bound(centred.cross_products.matrix(), cross_sq, hsic, n,
                                          self.half_steps[layer], self.magnitudes[layer])
                bounds = tuple(_smaller(terms[0], angle) for terms, angle in zip(found, angles))
                gaps, spreads = tuple(terms[1] for terms in found), tuple(terms[2] for terms in found)
            values = (n, rel, float(self.max_abs[layer]), biased, debiased, *angles, *bounds, *gaps, *spreads)
            for name, value in zip(FIGURES + SIDE_TERMS, values):
                figures[name].append(float(value))
        return figures


def completed(figures: dict[str, list]) -> dict[str, list]:
    """Stored figures with every name of `FIGURES` and `SIDE_TERMS`: a run captured before the
    statistical bound (rounded to nearest: no `bound_*` columns) takes its sure angles as its
    bounds, and one captured before the side terms has NaN ones (`side_bound` then gives its bounds)."""
    rows = len(figures["rows"])
    return {**{f"bound_{variant}": figures[f"angle_{variant}"] for variant in ("biased", "debiased")},
            **{name: [math.nan] * rows for name in SIDE_TERMS}, **figures}


def answer_bound(cka: np.ndarray, first: tuple | None, second: tuple | None, debiased: bool) -> np.ndarray:
    """The bound of CKA answers ``cka`` (the stored values' CKA(Xhat, Yhat), any shape) from their
    sides' (bound, gap, spread) arrays (broadcasting against ``cka``; None for a side stored
    exactly), with probability >= `CONFIDENCE` for each entry.

    Going from the exact pair to the stored one side at a time, |CKA(Xhat, Yhat) - CKA(X, Y)| <=
    |CKA(Xhat, Yhat) - CKA(X, Yhat)| + |CKA(X, Yhat) - CKA(X, Y)|, where the first side's c is
    CKA(X, Yhat), within bound_1 of the answer, and the second's is CKA(X, Y), within bound_1 +
    bound_2 of it (each side's draws independent of the other's values: `side_bound` holds for
    each on its side's event)."""
    cka = np.asarray(cka, dtype=np.float64)
    total, reach = np.zeros(cka.shape), np.zeros(cka.shape)
    for side in (first, second):
        if side is None:
            continue
        bound, gap, spread = (np.broadcast_to(np.asarray(part, dtype=np.float64), cka.shape) for part in side)
        reach = reach + bound
        total = total + side_bound(cka, reach, bound, gap, spread, debiased)
    return total


def _smaller(bound: float, angle: float) -> float:
    """The smaller of two bounds (either may be NaN: undefined, so not a bound)."""
    finite = [value for value in (bound, angle) if math.isfinite(value)]
    return min(finite) if finite else math.nan
