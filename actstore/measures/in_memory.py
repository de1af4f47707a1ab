"""The built-in measures that need each layer's n x n form in memory: RSA, RBF-kernel CKA and the
nearest-neighbour family (formulas and sources: `metrics.similarity.rsa`, `kernel_cka`, `knn`)."""

from __future__ import annotations

from actstore.measures import ROWS, Measure, register
from actstore.options import SIMILARITY

FACTORIES = "actstore.metrics.similarity.in_memory_measures"

for rdm in ("cosine", "euclidean"):
    for compare in ("pearson", "spearman"):
        register(Measure(
            f"rsa-rdm={rdm}-compare={compare}", f"{compare} correlation of the two {rdm} dissimilarity matrices",
            ROWS, f"{FACTORIES}:rsa_measure", bounds=(-1.0, 1.0), arguments={"rdm": rdm, "compare": compare},
            source="Kriegeskorte et al. 2008"))
register(Measure(
    "cka-kernel=(rbf-sigma={sigma})-hsic=gretton-score",
    "RBF-kernel CKA, sigma = --sigma-fraction x the median distance", ROWS, f"{FACTORIES}:rbf_cka_measure",
    bounds=(0.0, 1.0), options=(SIMILARITY.sigma_fraction,), arguments={"debiased": False},
    source="Kornblith et al. 2019"))
register(Measure(
    "cka-kernel=(rbf-sigma={sigma})-hsic=song-score", "RBF-kernel CKA, debiased (can go below 0)", ROWS,
    f"{FACTORIES}:rbf_cka_measure", options=(SIMILARITY.sigma_fraction,), arguments={"debiased": True},
    source="Song et al. 2007; Kornblith et al. 2019"))
for kind, summary in (("mutual_knn", "mutual nearest-neighbour alignment"),
                      ("cycle_knn", "cycle nearest-neighbour alignment"),
                      ("cknna", "centred kernel nearest-neighbour alignment")):
    register(Measure(
        f"{kind}-topk={{topk}}", f"{summary}, -k neighbours", ROWS, f"{FACTORIES}:knn_measure", bounds=(0.0, 1.0),
        options=(SIMILARITY.k,), fills={"topk": "k"}, arguments={"kind": kind}, below_rows=("k",),
        source="Huh et al. 2024"))
