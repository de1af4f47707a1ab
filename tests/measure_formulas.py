"""Independent float64 formulas for the measures beyond CKA, written from the papers on the n x d
data (QR and SVD of the samples, scipy's orthogonal Procrustes solver), never from actstore's
moment forms: the tests compare the streamed answers with these."""

from __future__ import annotations

import numpy as np
import scipy.linalg


def _centred_pair(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    xc, yc = x - x.mean(axis=0), y - y.mean(axis=0)
    width = max(xc.shape[1], yc.shape[1])  # zero-pad the narrower side (netrep, ReSi)
    pad = lambda m: np.hstack([m, np.zeros((len(m), width - m.shape[1]))])  # noqa: E731
    return pad(xc), pad(yc)


def procrustes_reference(x: np.ndarray, y: np.ndarray, kind: str) -> float:
    """scipy.linalg.orthogonal_procrustes on the centred data: the aligned residual's norm
    (euclidean) or the angle between Xc R and Yc (angular, Williams et al. 2021)."""
    xc, yc = _centred_pair(x, y)
    rotation, _ = scipy.linalg.orthogonal_procrustes(xc, yc)
    aligned = xc @ rotation
    if kind == "euclidean":
        return float(np.linalg.norm(aligned - yc))
    cosine = np.sum(aligned * yc) / (np.linalg.norm(xc) * np.linalg.norm(yc))
    return float(np.arccos(np.clip(cosine, -1, 1)))


def shape_metric_reference(x: np.ndarray, y: np.ndarray, alpha: float) -> float:
    """Williams et al. 2021: partially whiten each centred side by `alpha I + (1 - alpha) C^(-1/2)`
    (scipy's fractional matrix power), then the angular Procrustes distance."""
    def whiten(m: np.ndarray) -> np.ndarray:
        mc = m - m.mean(axis=0)
        cov = mc.T @ mc
        power = np.real(scipy.linalg.fractional_matrix_power(cov, -0.5))
        return mc @ (alpha * np.eye(len(cov)) + (1 - alpha) * power)

    return procrustes_reference(whiten(x), whiten(y), "angular")


def canonical_reference(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Björck & Golub 1973: orthonormal bases Qx, Qy of the centred columns (QR), then
    `Qx^T Qy = U diag(rho) W^T`. Returns (rho, the canonical variates of X, Qx U)."""
    qx, _ = np.linalg.qr(x - x.mean(axis=0))
    qy, _ = np.linalg.qr(y - y.mean(axis=0))
    u, rho, _ = np.linalg.svd(qx.T @ qy, full_matrices=False)
    return rho, qx @ u, qy


def cca_reference(x: np.ndarray, y: np.ndarray, squared: bool) -> float:
    rho = canonical_reference(x, y)[0]
    return float(np.mean(rho**2 if squared else rho))


def svcca_reference(x: np.ndarray, y: np.ndarray, variance: float = 0.99) -> float:
    """Raghu et al. 2017: SVD of each centred side, keep the fewest directions explaining
    `variance` of the variance, mean canonical correlation of the projections."""
    def reduce(m: np.ndarray) -> np.ndarray:
        mc = m - m.mean(axis=0)
        _, s, vt = np.linalg.svd(mc, full_matrices=False)
        keep = int(np.argmax(np.cumsum(s**2) / np.sum(s**2) >= variance)) + 1
        return mc @ vt[:keep].T

    return cca_reference(reduce(x), reduce(y), squared=False)


def pwcca_reference(x: np.ndarray, y: np.ndarray) -> float:
    """Morcos et al. 2018: canonical variates h_i (unit norm) of the narrower side, weights
    `a_i = sum_j |<h_i, x_j>|` over its centred neurons x_j, score `sum a_i rho_i / sum a_i`."""
    if x.shape[1] > y.shape[1]:
        x, y = y, x
    rho, variates, _ = canonical_reference(x, y)
    weights = np.abs(variates[:, : len(rho)].T @ (x - x.mean(axis=0))).sum(axis=1)
    return float(weights @ rho / weights.sum())


def rsa_reference(x: np.ndarray, y: np.ndarray, rdm: str, compare: str) -> float:
    """scipy's pdist RDMs ('cosine' or 'euclidean'), compared by scipy.stats' pearsonr/spearmanr."""
    from scipy.spatial.distance import pdist
    from scipy.stats import pearsonr, spearmanr

    correlation = pearsonr if compare == "pearson" else spearmanr
    return float(correlation(pdist(x, rdm), pdist(y, rdm))[0])


def rbf_cka_reference(x: np.ndarray, y: np.ndarray, fraction: float, debiased: bool) -> float:
    """Kornblith et al. 2019's notebook written out: scipy's cdist, the median over the full matrix
    of squared distances, an explicit centring matrix (biased) or the zero-diagonal unbiased HSIC."""
    from scipy.spatial.distance import cdist

    from tests.formulas import hsic_u_numpy

    def gram(m: np.ndarray) -> np.ndarray:
        squares = cdist(m, m, "sqeuclidean")
        return np.exp(-squares / (2 * fraction**2 * np.median(squares)))

    k, l_ = gram(x), gram(y)
    if debiased:
        return hsic_u_numpy(k, l_) / np.sqrt(hsic_u_numpy(k, k) * hsic_u_numpy(l_, l_))
    h = np.eye(len(x)) - 1.0 / len(x)
    kc, lc = h @ k @ h, h @ l_ @ h
    return float(np.sum(kc * lc) / np.sqrt(np.sum(kc * kc) * np.sum(lc * lc)))


def _knn_sets(m: np.ndarray, k: int) -> list[set[int]]:
    """Each row's k most cosine-similar other rows, by a full sort (no ties in random data)."""
    unit = m / np.linalg.norm(m, axis=1, keepdims=True)
    similarity = unit @ unit.T
    return [set(int(j) for j in np.argsort(-np.where(np.arange(len(m)) == i, -np.inf, row))[:k])
            for i, row in enumerate(similarity)]


def knn_reference(x: np.ndarray, y: np.ndarray, k: int, kind: str) -> float:
    """Huh et al. 2024 written out with Python sets: mutual kNN, cycle kNN, or CKNNA (the masked
    kernels' CKA with the explicit zero-diagonal unbiased HSIC)."""
    from tests.formulas import hsic_u_numpy

    a_sets, b_sets = _knn_sets(x, k), _knn_sets(y, k)
    n = len(x)
    if kind == "mutual_knn":
        return float(np.mean([len(a_sets[i] & b_sets[i]) / k for i in range(n)]))
    if kind == "cycle_knn":
        return float(np.mean([any(i in a_sets[j] for j in b_sets[i]) for i in range(n)]))
    ka = (x / np.linalg.norm(x, axis=1, keepdims=True)) @ (x / np.linalg.norm(x, axis=1, keepdims=True)).T
    kb = (y / np.linalg.norm(y, axis=1, keepdims=True)) @ (y / np.linalg.norm(y, axis=1, keepdims=True)).T
    mask = lambda sets: np.array([[j in sets[i] for j in range(n)] for i in range(n)], float)  # noqa: E731
    ma, mb = mask(a_sets), mask(b_sets)
    both = ma * mb
    return hsic_u_numpy(both * ka, both * kb) / np.sqrt(hsic_u_numpy(ma * ka, ma * ka) * hsic_u_numpy(mb * kb, mb * kb))
