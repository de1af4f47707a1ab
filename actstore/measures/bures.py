"""Normalized Bures similarity (`nbs-score`), streamed from the second moments.

    NBS(X, Y) = ||Xc^T Yc||_* / (||Xc||_F ||Yc||_F)

with Xc, Yc the column-centred n x d_x and n x d_y rows of the two layers and ||.||_* the nuclear
norm (the sum of singular values). It is the Bures fidelity of the centred linear kernels,
F(Kx, Ky) = tr (Kx^1/2 Ky Kx^1/2)^1/2 / sqrt(tr Kx tr Ky) with K = Xc Xc^T (Harvey, Lipshutz &
Williams 2023, "Duality of Bures and shape distances with implications for comparing neural
representations"; Tang et al. 2020, "Similarity of neural networks with gradients", the nbs of
amzn/xfer `nn_similarity_index`), and the cosine of the angular Procrustes distance (Williams et al.
2021): arccos(NBS) = procrustes-distance=angular. From the moments: C_ab = Xc^T Yc, and
||Xc||_F^2 = tr C_aa, so each block is prepared as sqrt(tr C_bb) and a pair costs one SVD of C_ab.

Range [0, 1], 1 between a layer and itself; invariant to translation, isotropic scaling and
orthogonal maps of either side (not to general invertible maps); symmetric. NaN when a layer is
constant over the samples.
"""

from __future__ import annotations

import numpy as np

from actstore.measures import MOMENTS, Measure, register


def nbs_measure():
    """The `MomentMeasure` of nbs-score."""
    from actstore.metrics.similarity import MomentMeasure

    return MomentMeasure(prepare=_root_trace, compare=_nbs)


def _root_trace(cov: np.ndarray) -> float:
    return float(np.sqrt(max(np.trace(cov), 0.0)))  # ||Xc||_F; rounding can leave a constant's trace at -0


def _nbs(norm_a: float, norm_b: float, cross: np.ndarray) -> float:
    if norm_a == 0.0 or norm_b == 0.0:
        return float("nan")
    nuclear = float(np.linalg.svd(cross, compute_uv=False).sum())
    return min(nuclear / (norm_a * norm_b), 1.0)  # Cauchy-Schwarz bounds it by 1: only rounding goes over


register(Measure(
    "nbs-score", "normalized Bures similarity ||Xc^T Yc||_* / (||Xc||_F ||Yc||_F) = cos(Procrustes angle)",
    MOMENTS, f"{__name__}:nbs_measure", bounds=(0.0, 1.0),
    source="Harvey et al. 2023; Tang et al. 2020"))
