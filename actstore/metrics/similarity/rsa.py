"""Representational similarity analysis: the correlation of two representational dissimilarity
matrices (Kriegeskorte, Mur & Bandettini 2008, "Representational similarity analysis - connecting
the branches of systems neuroscience").

For each representation, the RDM over the n samples is
- cosine: `D_ij = 1 - <x_i, x_j> / (||x_i|| ||x_j||)` (a zero row counts as cosine 0), or
- euclidean: `D_ij = ||x_i - x_j||_2` (from the Gram of the centred rows, clipped at 0);
RSA is the Pearson or Spearman correlation of the two RDMs' upper triangles (i < j, n(n-1)/2
entries); Spearman is Pearson on average ranks (ties share their mean rank). similarity-repository
identifiers `rsa-rdm={cosine,euclidean}-compare={pearson,spearman}`. Memory O(n^2): the caller
bounds n by the in-memory limit. Invariances (ReSi table 1): the cosine RDM to orthogonal maps and
isotropic scaling (not translation); the euclidean RDM to orthogonal maps, translation and
isotropic scaling (the correlation ignores the RDM's scale). NaN when an RDM is constant.
"""

from __future__ import annotations

import numpy as np

from .._numerics import as_float64_matrix, column_centered
from .inputs import paired

RDMS = ("cosine", "euclidean")
COMPARES = ("pearson", "spearman")


def rdm(x: np.ndarray, kind: str) -> np.ndarray:
    """The upper triangle (i < j, row-major) of the n x n RDM of the rows of x, float64."""
    matrix = as_float64_matrix(x, "x")
    if kind == "cosine":
        norms = np.linalg.norm(matrix, axis=1)
        unit = matrix / np.where(norms == 0, 1.0, norms)[:, None]
        full = 1.0 - unit @ unit.T
    elif kind == "euclidean":
        centred = column_centered(matrix)
        gram = centred @ centred.T
        squares = np.diag(gram)
        full = np.sqrt(np.maximum(squares[:, None] + squares[None, :] - 2.0 * gram, 0.0))
    else:
        raise ValueError(f"rdm must be one of {', '.join(RDMS)}, got {kind!r}")
    return full[np.triu_indices(len(matrix), k=1)]


def prepared_rdm(x: np.ndarray, kind: str, compare: str) -> np.ndarray:
    """What one side contributes: its RDM's upper triangle, as ranks for Spearman, then centred and
    scaled to unit norm, so that the correlation of two sides is their dot product (NaN vector when
    the RDM is constant)."""
    if compare not in COMPARES:
        raise ValueError(f"compare must be one of {', '.join(COMPARES)}, got {compare!r}")
    values = rdm(x, kind)
    if compare == "spearman":
        # imported here: scipy.stats costs every Ray worker that imports this package ~45 MiB
        # and ~0.5 s, and only Spearman RSA uses it
        from scipy.stats import rankdata

        values = rankdata(values)
    values = values - values.mean()
    norm = np.linalg.norm(values)
    return values / norm if norm > 0 else np.full_like(values, np.nan)


def correlate(prepared_a: np.ndarray, prepared_b: np.ndarray) -> float:
    """The correlation of two `prepared_rdm` vectors."""
    return float(np.clip(prepared_a @ prepared_b, -1.0, 1.0))


def rsa(x: np.ndarray, y: np.ndarray, rdm: str = "cosine", compare: str = "spearman") -> float:
    """RSA between two representations of the same samples (n >= 3 for a correlation)."""
    xs, ys = paired(x, y)
    if len(xs) < 3:
        raise ValueError(f"RSA needs n >= 3 samples (at least 3 dissimilarities), got n={len(xs)}")
    return correlate(prepared_rdm(xs, rdm, compare), prepared_rdm(ys, rdm, compare))
