"""`actstore similarity MEASURE RUN_A [RUN_B]`: the similarity measures beyond CKA (streamed:
Procrustes, shape metric, CCA, SVCCA, PWCCA; in memory: RSA, RBF CKA, the kNN family), named by
their similarity-repository identifiers (definitions with sources: docs/metrics.md)."""

from __future__ import annotations

from actstore.cli.common import add_option, connect
from actstore.cli.compare import _pair_args, show_matrix
from actstore.options import SIMILARITY

DESCRIPTION = """\
A measure between every layer of run A (rows) and every layer of run B (columns; default A),
named by its nacloos/similarity-repository identifier so results compare across tools:

  procrustes-distance=angular     arccos of the Procrustes similarity (Williams et al. 2021)
  procrustes-distance=euclidean   min over rotations of ||Xc Q - Yc||_F
  shape_metric-alpha={alpha}-distance=angular
                                  angular shape metric, partial whitening --alpha (1 = Procrustes)
  cca-squared_score, cca-score    mean squared / mean canonical correlation
  svcca-var=0.99-score            CCA on the top principal directions (99% of the variance)
  pwcca-score                     projection-weighted CCA (Morcos et al. 2018)

These come from streamed second moments (any n, memory O(d^2)). In memory (n up to the
server's matrix limit, O(n^2)):

  rsa-rdm={cosine,euclidean}-compare={pearson,spearman}
                                  correlation of two dissimilarity matrices (RSA)
  cka-kernel=(rbf-sigma={sigma})-hsic=gretton-score (or hsic=song-score, debiased)
                                  RBF-kernel CKA, sigma = --sigma-fraction x median distance
  mutual_knn-topk={topk}, cycle_knn-topk={topk}, cknna-topk={topk}
                                  nearest-neighbour alignment (Huh et al. 2024), -k neighbours

Distances are 0 for identical representations (up to the measure's invariances); scores are 1.

Examples:
  actstore similarity procrustes-distance=angular RUN_A RUN_B --plot procrustes.png
  actstore similarity 'shape_metric-alpha={alpha}-distance=angular' RUN --alpha 0.5
  actstore cka-matrix RUN1 RUN2 --measure cca-squared_score     (every layer of every run, one job)
"""


def cmd_similarity(args) -> int:
    with connect(args) as client:
        result = client.measure(args.measure, args.run_a, args.run_b, layers_a=args.layers_a,
                                layers_b=args.layers_b, alpha=args.alpha,
                                sigma_fraction=args.sigma_fraction, k=args.k, refresh=args.refresh)
    name = result.provenance.metric
    if "-distance=" in name:
        bounds = (0.0, None)
    elif name.endswith("score") and "hsic=song" not in name:  # debiased CKA can go below 0
        bounds = (0.0, 1.0)
    else:  # correlations (RSA), debiased CKA, kNN fractions: the colour scale follows the values
        bounds = (None, None)
    show_matrix(name, result.values, result.layers_a, result.layers_b, result.provenance, result.notes, args,
                f"{name}, n={int(result.scalars['n'])}", bounds)
    return 0


def add_commands(command) -> None:
    p = command("similarity", cmd_similarity, "Procrustes, CCA, SVCCA, PWCCA, RSA, RBF CKA, CKNNA ... by identifier",
                DESCRIPTION)
    add_option(p, SIMILARITY, "measure", "measure", metavar="MEASURE", help="the measure's identifier (see above)")
    _pair_args(p)
    add_option(p, SIMILARITY, "alpha")
    add_option(p, SIMILARITY, "sigma_fraction")
    add_option(p, SIMILARITY, "k", "-k")
