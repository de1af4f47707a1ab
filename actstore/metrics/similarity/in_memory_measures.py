"""The similarity measures that need the n x n matrices (RSA, RBF-kernel CKA, CKNNA, the kNN
alignments): per layer a prepared form (an RDM, a centred kernel, the rows), per pair a cheap
comparison, so a layer's O(n^2 d) work is done once however many pairs it is in. The caller bounds
n (`nbytes_per_layer`). The measure registry (`actstore.measures`) names them by their
similarity-repository identifiers and builds them with the factories here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from . import kernel_cka, knn, rsa


@dataclass(frozen=True)
class PairwiseMeasure:
    """`prepare(layer rows)` once per layer, `compare(prepared_a, prepared_b)` per pair;
    `square`: the prepared form holds an n x n matrix (else the rows themselves)."""

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


def rsa_measure(rdm: str, compare: str) -> PairwiseMeasure:
    """rsa-rdm={rdm}-compare={compare}: correlation of the two layers' dissimilarity matrices."""
    return PairwiseMeasure(partial(rsa.prepared_rdm, kind=rdm, compare=compare), rsa.correlate)


def rbf_cka_measure(sigma_fraction: float, debiased: bool) -> PairwiseMeasure:
    """cka-kernel=(rbf-sigma={sigma})-hsic=gretton-score, or hsic=song-score when `debiased`."""
    return PairwiseMeasure(partial(_rbf_gram, sigma_fraction=sigma_fraction, centred=not debiased),
                           kernel_cka.debiased_from_grams if debiased else _dot)


def knn_measure(kind: str, k: int) -> PairwiseMeasure:
    """mutual_knn-topk={topk}, cycle_knn-topk={topk} or cknna-topk={topk} with k neighbours."""
    function = {"mutual_knn": knn.mutual_knn, "cycle_knn": knn.cycle_knn, "cknna": knn.cknna}[kind]
    return PairwiseMeasure(_rows, partial(function, k=k), square=False)


def nbytes_per_layer(measure: PairwiseMeasure, n: int, width: int) -> int:
    """Bytes one prepared layer holds: an n x n float64 matrix, or the float64 rows."""
    return 8 * n * n if measure.square else 8 * n * width


def nbytes_working(measure: PairwiseMeasure, n: int, width: int) -> int:
    """Bytes one preparation or comparison allocates at its peak (a few n x n float64 matrices)."""
    return 8 * n * n * 4 + 8 * n * width * 2
