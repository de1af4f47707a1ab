"""RSA, RBF-kernel CKA and the kNN family (mutual kNN, cycle kNN, CKNNA): equal to independent
formulas (scipy's pdist/cdist, pearsonr/spearmanr, Python-set neighbourhoods, the explicit unbiased
HSIC), the per-layer prepare + per-pair compare form equal to the one-call functions, and their
invariances."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import ortho_group

from actstore import measures
from actstore.errors import InvalidArgument
from actstore.metrics import similarity as sim
from tests.measure_formulas import knn_reference, rbf_cka_reference, rsa_reference


def _pair(seed: int = 0, n: int = 80) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    latent = rng.normal(size=(n, 5))
    x = latent @ rng.normal(size=(5, 10)) + 0.4 * rng.normal(size=(n, 10)) + 1.0
    y = np.tanh(latent @ rng.normal(size=(5, 7))) + 0.3 * rng.normal(size=(n, 7)) - 0.5
    return x, y


def pairwise_measure(name: str, **params):
    """The registered measure's computation, given the parameters it takes of `params`."""
    spec = measures.get(name, needs=measures.ROWS)
    return spec.build(spec.resolve({o.name: params[o.name] for o in spec.options if o.name in params}))


def _via_registry(name: str, x: np.ndarray, y: np.ndarray, **params) -> float:
    measure = pairwise_measure(name, **params)
    return measure.compare(measure.prepare(x), measure.prepare(y))


def test_the_registry_holds_every_in_memory_measure_and_refuses_others():
    rows = [m.identifier for m in measures.measures(measures.ROWS)]
    assert len(rows) == 9 and len(set(rows)) == 9
    with pytest.raises(InvalidArgument, match="not one of"):
        pairwise_measure("rsa-rdm=correlation-compare=kendall")


@pytest.mark.parametrize("rdm", ["cosine", "euclidean"])
@pytest.mark.parametrize("compare", ["pearson", "spearman"])
def test_rsa_equals_scipy(rdm, compare):
    x, y = _pair()
    expected = rsa_reference(x, y, rdm, compare)
    assert sim.rsa(x, y, rdm, compare) == pytest.approx(expected, rel=1e-9)
    assert _via_registry(f"rsa-rdm={rdm}-compare={compare}", x, y) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("fraction", [0.4, 1.0])
@pytest.mark.parametrize("debiased", [False, True])
def test_rbf_cka_equals_kornbliths_formula(fraction, debiased):
    x, y = _pair(1)
    expected = rbf_cka_reference(x, y, fraction, debiased)
    assert sim.rbf_cka(x, y, fraction, debiased) == pytest.approx(expected, rel=1e-9)
    name = f"cka-kernel=(rbf-sigma={{sigma}})-hsic={'song' if debiased else 'gretton'}-score"
    assert _via_registry(name, x, y, sigma_fraction=fraction) == pytest.approx(expected, rel=1e-9)


def test_rbf_cka_of_a_layer_with_itself_is_one_and_a_constant_layer_is_nan():
    x, _ = _pair(2)
    assert sim.rbf_cka(x, x) == pytest.approx(1.0, abs=1e-12)
    assert np.isnan(sim.rbf_cka(x, np.ones((len(x), 3))))


@pytest.mark.parametrize("kind", ["mutual_knn", "cycle_knn", "cknna"])
@pytest.mark.parametrize("k", [3, 10])
def test_knn_family_equals_the_set_formulas(kind, k):
    x, y = _pair(3, n=50)
    expected = knn_reference(x, y, k, kind)
    assert getattr(sim, kind)(x, y, k) == pytest.approx(expected, rel=1e-9)
    measure = pairwise_measure(f"{kind}-topk={{topk}}", k=k)
    assert measures.get(f"{kind}-topk={{topk}}").filled({"k": k}) == f"{kind}-topk={k}"
    assert measure.compare(measure.prepare(x), measure.prepare(y)) == pytest.approx(expected, rel=1e-9)


def test_cknna_with_itself_is_one():
    x, _ = _pair(4, n=40)
    assert sim.cknna(x, x, 5) == pytest.approx(1.0, rel=1e-12)


def _orthogonal(m, seed):
    return m @ ortho_group.rvs(m.shape[1], random_state=seed)


TRANSFORMS = {
    "translation": lambda m, seed: m + np.random.default_rng(seed).normal(size=m.shape[1]) * 3,
    "isotropic scaling": lambda m, seed: m * (2.5 + seed),
    "orthogonal": _orthogonal,
}
INVARIANT = {  # ReSi table 1 (cosine RDMs and cosine neighbourhoods move with the origin)
    "rsa-rdm=cosine-compare=pearson": {"isotropic scaling", "orthogonal"},
    "rsa-rdm=cosine-compare=spearman": {"isotropic scaling", "orthogonal"},
    "rsa-rdm=euclidean-compare=pearson": set(TRANSFORMS),
    "rsa-rdm=euclidean-compare=spearman": set(TRANSFORMS),
    "cka-kernel=(rbf-sigma={sigma})-hsic=gretton-score": set(TRANSFORMS),
    "cka-kernel=(rbf-sigma={sigma})-hsic=song-score": set(TRANSFORMS),
    "mutual_knn-topk={topk}": {"isotropic scaling", "orthogonal"},
    "cycle_knn-topk={topk}": {"isotropic scaling", "orthogonal"},
    "cknna-topk={topk}": {"isotropic scaling", "orthogonal"},
}


@pytest.mark.parametrize("name", list(INVARIANT))
@pytest.mark.parametrize("transform", list(TRANSFORMS))
def test_invariances(name, transform):
    x, y = _pair(5, n=60)
    before = _via_registry(name, x, y, k=5)
    after = _via_registry(name, TRANSFORMS[transform](x, 1), TRANSFORMS[transform](y, 2), k=5)
    if transform in INVARIANT[name]:
        assert after == pytest.approx(before, rel=1e-7, abs=1e-9)
    elif name.startswith("rsa"):  # the cosine RDM changes when the origin moves
        assert abs(after - before) > 1e-4


def test_spearman_rsa_ignores_monotone_changes_of_the_dissimilarities():
    x, y = _pair(6)
    # squaring euclidean distances is monotone: Spearman unchanged, Pearson changes
    from scipy.spatial.distance import pdist
    from scipy.stats import pearsonr

    assert sim.rsa(x, y, "euclidean", "spearman") == pytest.approx(rsa_reference(x, y, "sqeuclidean", "spearman"))
    assert sim.rsa(x, y, "euclidean", "pearson") != pytest.approx(
        float(pearsonr(pdist(x, "sqeuclidean"), pdist(y, "sqeuclidean"))[0]), rel=1e-3)
