"""Similarity between two representations of the same samples.

Implements METRICS.md, section "Similarity between two representations", one family per module:

- `cka`: linear CKA, biased (Kornblith et al. 2019) and debiased, and unbiased HSIC (Song et al.
  2007; the debiased CKA of Brown et al. 2023).
- `minibatch`: minibatch CKA (Nguyen, Raghu & Kornblith 2021), one-pass and streamed.
- `streaming`: the streaming exact CKA of many blocks at once (`SimilarityAccumulator`), over the
  feature-space `moments` or the stored rows and their `gram` strips.
- `cosine`: sample-wise cosine similarity, COS (Jiang et al. 2024), one-pass and streamed.
- `knn`: mutual kNN alignment, cycle kNN and CKNNA (Huh et al. 2024).
- `rsa`: RSA, the correlation of two RDMs; `kernel_cka`: RBF-kernel CKA (Kornblith et al. 2019);
  `in_memory_measures` names them (and the kNN family) for queries, O(n^2) each.
- `shape`: orthogonal Procrustes distances and the angular shape metric (Williams et al. 2021);
  `cca`: CCA, SVCCA, PWCCA; both from second moments, streamed by `streamed_measures`
  (`MomentMeasures`), named by the similarity-repository identifiers.
- `stats`: quantiles from streamed histograms. `inputs`: sample identity and block checks.

A "block" is one layer of one run: a matrix with one row per sample. Every product is formed from
float64, centred data. Callers import from this package (`from actstore.metrics import similarity
as sim`); the names below are its public surface.
"""

from __future__ import annotations

from .cca import cca_similarity
from .cka import hsic_unbiased, hsic_unbiased_gram, linear_cka, linear_cka_debiased
from .cosine import CosineAccumulator, CosineStats, samplewise_cosine
from .gram import GRAM_STRIP_BYTES, StoredRows, gram_strip_products, gram_strips
from .in_memory_measures import PairwiseMeasure
from .inputs import MIN_HSIC_SAMPLES, check_same_samples
from .kernel_cka import rbf_cka
from .knn import cknna, cycle_knn, mutual_knn
from .minibatch import MinibatchCKA, MinibatchCKAAccumulator, minibatch_cka
from .moments import FeatureMoments
from .rsa import rsa
from .shape import procrustes_distance, shape_metric
from .stats import QUANTILE_LEVELS, histogram_quantiles
from .streamed_measures import MomentMeasure, MomentMeasures
from .streaming import (
    CKAMatrices,
    SimilarityAccumulator,
    choose_cka_mode,
    cka_mode_costs,
)

DEFINITION_VERSION = 1

# The names these classes had in the single-module `actstore.metrics.similarity`: a CKA matrix
# job's checkpoint pickled before the split (`server/cka_job.py`, kept on cancel for a resume)
# refers to them by that path.
_FeatureMoments = FeatureMoments
_StoredRows = StoredRows

__all__ = [
    "DEFINITION_VERSION",
    "GRAM_STRIP_BYTES",
    "MIN_HSIC_SAMPLES",
    "QUANTILE_LEVELS",
    "CKAMatrices",
    "CosineAccumulator",
    "CosineStats",
    "MinibatchCKA",
    "MomentMeasure",
    "MomentMeasures",
    "PairwiseMeasure",
    "MinibatchCKAAccumulator",
    "SimilarityAccumulator",
    "check_same_samples",
    "choose_cka_mode",
    "cca_similarity",
    "cka_mode_costs",
    "cknna",
    "cycle_knn",
    "gram_strip_products",
    "gram_strips",
    "histogram_quantiles",
    "hsic_unbiased",
    "hsic_unbiased_gram",
    "linear_cka",
    "linear_cka_debiased",
    "minibatch_cka",
    "procrustes_distance",
    "rbf_cka",
    "rsa",
    "mutual_knn",
    "samplewise_cosine",
    "shape_metric",
]
