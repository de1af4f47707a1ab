"""The similarity measures that need the n x n matrices (RSA, RBF-kernel CKA, CKNNA, the kNN
alignments): per layer a prepared form (an RDM, a centred kernel, the rows), per pair a cheap
comparison, so a layer's O(n^2 d) work is done once however many pairs it is in. The caller bounds
n (`nbytes_per_layer`); names are similarity-repository identifiers (`streamed_measures`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from . import kernel_cka, knn, rsa

RSA_MEASURES = tuple(f"rsa-rdm={r}-compare={c}" for r in rsa.RDMS for c in rsa.COMPARES)
RBF_MEASURES = ("cka-kernel=(rbf-sigma={sigma})-hsic=gretton-score", "cka-kernel=(rbf-sigma={sigma})-hsic=song-score")
KNN_MEASURES = ("mutual_knn-topk={topk}", "cycle_knn-topk={topk}", "cknna-topk={topk}")
IN_MEMORY_MEASURES = RSA_MEASURES + RBF_MEASURES + KNN_MEASURES


@dataclass(frozen=True)
class PairwiseMeasure:
    """`prepare(layer rows)` once per layer, `compare(prepared_a, prepared_b)` per pair;
    `square`: the prepared form holds an n x n matrix (else the rows themselves)."""

    identifier: str
    prepare: Callable[[np.ndarray], Any]
    compare: Callable[[Any, Any], float]
    square: bool = True


def _rows(z: np.ndarray) -> np.ndarray:
    return z.astype(np.float64)


def _rbf_gram(z: np.ndarray, sigma_fraction: float, centred: bool) -> np.ndarray:
    gram, _ = kernel_cka.rbf_gram(z, sigma_fraction)
    return kernel_cka.centred_unit_gram(gram) if centred else gram


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.vdot(a, b))


def pairwise_measure(name: str, sigma_fraction: float = 1.0, k: int = 10) -> PairwiseMeasure:
    """The `PairwiseMeasure` for one of `IN_MEMORY_MEASURES`, its parameters filled in."""
    if name in RSA_MEASURES:
        kind, compare = name.removeprefix("rsa-rdm=").split("-compare=")
        return PairwiseMeasure(name, partial(rsa.prepared_rdm, kind=kind, compare=compare), rsa.correlate)
    if name in RBF_MEASURES:
        gretton = "gretton" in name
        return PairwiseMeasure(name, partial(_rbf_gram, sigma_fraction=sigma_fraction, centred=gretton),
                               _dot if gretton else kernel_cka.debiased_from_grams)
    if name in KNN_MEASURES:
        function = {"mutual_knn": knn.mutual_knn, "cycle_knn": knn.cycle_knn, "cknna": knn.cknna}[name.split("-")[0]]
        return PairwiseMeasure(name.replace("{topk}", str(k)), _rows, partial(function, k=k), square=False)
    raise ValueError(f"measure {name!r} is not one of {', '.join(IN_MEMORY_MEASURES)}")


def nbytes_per_layer(measure: PairwiseMeasure, n: int, width: int) -> int:
    """Bytes one prepared layer holds: an n x n float64 matrix, or the float64 rows."""
    return 8 * n * n if measure.square else 8 * n * width


def nbytes_working(measure: PairwiseMeasure, n: int, width: int) -> int:
    """Bytes one preparation or comparison allocates at its peak (a few n x n float64 matrices)."""
    return 8 * n * n * 4 + 8 * n * width * 2
