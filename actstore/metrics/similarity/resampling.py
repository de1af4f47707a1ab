"""Seeded resampling that does not depend on how the rows were chunked: Poisson bootstrap weights,
permutations of the row index, percentile intervals and the null-calibrated score.

- Poisson bootstrap (Hanley & MacGibbon 2006; Chamandy et al. 2012, "Estimating uncertainty for
  massive data streams"): replicate r gives row i the weight `w_ri ~ Poisson(1)`, the number of
  times the row is drawn, so the replicate is a resampled multiset of about n rows and every
  replicate's statistics are sums over rows: streamable and mergeable. Here `w_ri` is a pure
  function of (seed, r, global row index i), through a SplitMix64 hash (Steele, Lea & Flood 2014)
  and the Poisson(1) inverse CDF, so neither chunking nor merge order changes any replicate.
- Grouped Poisson bootstrap (Chamandy et al. 2012): row i belongs to group
  `g(i) = hash(seed, i) mod G`, replicate r gives group g the weight `w_rg ~ Poisson(1)` (a
  function of (seed, r, g)) and every row of the group shares it; own hash streams keep groups
  and group weights apart from the per-row weights.
- Permutation null: permutation p orders the rows by a hash of (seed, p, i), a seeded bijection of
  the global row index.
- Percentile interval (Efron & Tibshirani 1993, ch. 13): the (1-ci)/2 and (1+ci)/2 quantiles of
  the replicates (np.quantile's linear rule).
- Calibrated score: `(s - mean_null) / (1 - mean_null)`, the observed similarity rescaled so that the
  null's mean maps to 0 and a perfect score stays 1, in the spirit of the permutation-based
  null calibration of Groeger, Wen & Brbic 2026 (arXiv 2602.14486); see docs/metrics.md.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)
_BOOTSTRAP_STREAM = 0x426F6F74  # "Boot": keeps the weights' hashes apart from the permutations'
_NULL_STREAM = 0x4E756C6C  # "Null"
_GROUP_STREAM = 0x47727570  # "Grup": which group a row belongs to
_GROUP_WEIGHT_STREAM = 0x47576774  # "GWgt": the groups' weights
# P(Poisson(1) <= k) for k = 0..19; beyond 19 the tail is below 2^-53, the uniforms' resolution.
_POISSON_CDF = np.cumsum([math.exp(-1) / math.factorial(k) for k in range(20)])


def _splitmix64(values: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (Steele, Lea & Flood 2014) on uint64 arrays, wrapping mod 2^64."""
    z = values + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX_1
    z = (z ^ (z >> np.uint64(27))) * _MIX_2
    return z ^ (z >> np.uint64(31))


def _hashes(seed: int, stream: int, draws: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """(len(draws), len(rows)) uint64 hashes of (seed, stream, draw, row), independent of each other."""
    keys = _splitmix64(np.asarray([(int(seed) << 32) ^ stream], dtype=np.uint64))
    keys = _splitmix64(keys ^ np.asarray(draws, dtype=np.uint64))  # one key per replicate/permutation
    rows = _splitmix64(np.asarray(rows, dtype=np.uint64) * _MIX_2)
    return _splitmix64(keys[:, None] ^ rows[None, :])


def _poisson(hashes: np.ndarray) -> np.ndarray:
    """Poisson(1) counts (int64) from uint64 hashes: their top 53 bits as a uniform, inverse CDF."""
    uniforms = (hashes >> np.uint64(11)) * 2.0**-53
    return np.searchsorted(_POISSON_CDF, uniforms, side="right").astype(np.int64)


def poisson_weights(seed: int, replicates: int, rows: np.ndarray) -> np.ndarray:
    """Bootstrap weights `w[r, i] ~ Poisson(1)` (int64, shape (replicates, len(rows))) of the rows
    with global indices `rows`: each a function of (seed, r, rows[i]) alone."""
    return _poisson(_hashes(seed, _BOOTSTRAP_STREAM, np.arange(replicates), rows))


def sample_groups(seed: int, rows: np.ndarray, groups: int) -> np.ndarray:
    """The group (0..groups-1, int64) of each global row index in `rows`: `hash(seed, row) mod
    groups`, so a row's group does not depend on how the rows were chunked."""
    hashes = _hashes(seed, _GROUP_STREAM, [0], rows)[0]
    return (hashes % np.uint64(groups)).astype(np.int64)


def group_poisson_weights(seed: int, replicates: int, groups: int) -> np.ndarray:
    """Grouped-bootstrap weights `w[r, g] ~ Poisson(1)` (int64, (replicates, groups)), each a
    function of (seed, r, g) alone."""
    return _poisson(_hashes(seed, _GROUP_WEIGHT_STREAM, np.arange(replicates), np.arange(groups)))


def null_permutation(seed: int, permutation: int, n: int) -> np.ndarray:
    """Permutation `permutation` of 0..n-1 for the seeded null: the rows ordered by a hash of
    (seed, permutation, row)."""
    return np.argsort(_hashes(seed, _NULL_STREAM, [permutation], np.arange(n))[0], kind="stable")


def percentile_interval(replicates: np.ndarray, ci: float) -> np.ndarray:
    """The percentile interval at level `ci` over axis 0: shape (2, ...) = (low, high). NaN
    replicates (an undefined CKA) are left out; all-NaN gives NaN."""
    values = np.asarray(replicates, dtype=np.float64)
    with warnings.catch_warnings():  # an all-NaN column is NaN, as documented, not a warning
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanquantile(values, [(1 - ci) / 2, (1 + ci) / 2], axis=0)


def calibrated_score(observed: np.ndarray, null_mean: np.ndarray) -> np.ndarray:
    """`(s - mean_null) / (1 - mean_null)`: 0 at the null's mean, 1 for a perfect score, negative
    below chance; NaN where the null's mean is 1 (no room above chance) or undefined."""
    observed, null_mean = np.asarray(observed, dtype=np.float64), np.asarray(null_mean, dtype=np.float64)
    room = 1.0 - null_mean
    defined = np.abs(room) > 0
    return np.where(defined, (observed - null_mean) / np.where(defined, room, 1.0), np.nan)


def permutation_p_value(observed: np.ndarray, null: np.ndarray) -> np.ndarray:
    """One-sided permutation p-value `(1 + #{null >= observed}) / (P + 1)` over axis 0 of `null`
    (Phipson & Smyth 2010: never 0)."""
    null = np.asarray(null, dtype=np.float64)
    return (1 + (null >= np.asarray(observed)[None]).sum(axis=0)) / (len(null) + 1)
