"""The built-in measures from streamed second moments: Procrustes, the angular shape metric, CCA,
SVCCA and PWCCA (formulas and sources: `metrics.similarity.shape`, `metrics.similarity.cca`)."""

from __future__ import annotations

from actstore.measures import MOMENTS, Measure, register
from actstore.options import SIMILARITY

FACTORIES = "actstore.metrics.similarity.streamed_measures"

register(Measure(
    "procrustes-distance=angular", "arccos of the Procrustes similarity ||Xc^T Yc||_* / (||Xc||_F ||Yc||_F)",
    MOMENTS, f"{FACTORIES}:procrustes_measure", distance=True, bounds=(0.0, None), arguments={"kind": "angular"},
    source="Williams et al. 2021"))
register(Measure(
    "procrustes-distance=euclidean", "min over rotations Q of ||Xc Q - Yc||_F", MOMENTS,
    f"{FACTORIES}:procrustes_measure", distance=True, bounds=(0.0, None), arguments={"kind": "euclidean"},
    source="Williams et al. 2021"))
register(Measure(
    "shape_metric-alpha={alpha}-distance=angular", "angular shape metric, partial whitening --alpha (1 = Procrustes)",
    MOMENTS, f"{FACTORIES}:shape_measure", distance=True, bounds=(0.0, None), options=(SIMILARITY.alpha,),
    fills={"alpha": "alpha"}, whitening="alpha", source="Williams et al. 2021"))
register(Measure(
    "cca-squared_score", "mean squared canonical correlation (Yanai's R^2_CCA)", MOMENTS,
    f"{FACTORIES}:cca_measure", bounds=(0.0, 1.0), arguments={"score": "squared"}, whitening="",
    source="Kornblith et al. 2019, table 1"))
register(Measure(
    "cca-score", "mean canonical correlation", MOMENTS, f"{FACTORIES}:cca_measure", bounds=(0.0, 1.0),
    arguments={"score": "mean"}, whitening="", source="Hotelling 1936; Raghu et al. 2017"))
register(Measure(
    "svcca-var=0.99-score", "CCA on the top principal directions (99% of the variance)", MOMENTS,
    f"{FACTORIES}:cca_measure", bounds=(0.0, 1.0), arguments={"score": "mean", "variance": 0.99}, whitening="",
    source="Raghu et al. 2017"))
register(Measure(
    "pwcca-score", "projection-weighted CCA (not symmetric)", MOMENTS, f"{FACTORIES}:cca_measure",
    bounds=(0.0, 1.0), arguments={"score": "pwcca"}, whitening="", symmetric=False, source="Morcos et al. 2018"))
