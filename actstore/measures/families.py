"""The metrics the query families serve: CKA, COS, minibatch CKA and mutual kNN (the similarity
planner), the entropy family, the residual norm, the logit lens, NC1, stitching and the probe
(formulas and sources: docs/metrics.md and `metrics/`). Their computation is their family's planner on the
server, so they name no factory; the generic `Measure` RPC, `Client.metric` and `actstore
measures` take them as they take the registry's own measures, and the older RPCs (Similarity,
Entropy, ResidualNorm, Lens, NeuralCollapse, Stitch) reach the same typed queries."""

from __future__ import annotations

from actstore.measures import FIT, GRAMS, HEAD, LAYER, PAIRS, ROWS, Measure, register
from actstore.options import ENTROPY, LENS, PROBE, SIMILARITY, STITCH

ALIGN = (SIMILARITY.align, SIMILARITY.word_pool)  # CKA and COS across tokenizers

register(Measure(
    "cka", "linear CKA, biased (HSIC Gretton) and debiased (Song / Lange) in one answer", GRAMS, query="similarity",
    bounds=(0.0, 1.0), options=ALIGN, source="Kornblith et al. 2019; similarity repository "
    "cka-kernel=linear-hsic=gretton-score and ...-hsic=lange-score"))
register(Measure(
    "cos", "sample-wise cosine of the two runs' vectors, its distribution over samples", PAIRS, query="similarity",
    bounds=(-1.0, 1.0), options=(SIMILARITY.center, *ALIGN), source="Jiang, Zhou & Zhu 2024"))
register(Measure(
    "minibatch_cka", "linear CKA averaged over batches of --batch-size rows", GRAMS, query="similarity",
    bounds=(0.0, 1.0), options=(SIMILARITY.batch_size, SIMILARITY.remainder), source="Nguyen et al. 2021"))
register(Measure(
    "mutual_knn", "mutual nearest-neighbour alignment = mutual_knn-topk={topk}, under the Similarity RPC's "
    "result keys (kept for older clients and caches)", ROWS, query="similarity", bounds=(0.0, 1.0),
    options=(SIMILARITY.k,), source="Huh et al. 2024"))

# The entropy family over one run's layers: each metric's own options (in the ENTROPY table's
# order), the pipeline's (preset, align, word_pool), and where the preset applies, what it fixes.
PIPELINE = (ENTROPY.preset, ENTROPY.align, ENTROPY.word_pool)
PRESET_FIXES = (ENTROPY.alpha, ENTROPY.normalization, ENTROPY.clamp, ENTROPY.abs_cos)
PRESET_ASKS = tuple(option.name for option in PRESET_FIXES)  # a preset fixes these: read to refuse others
ENTROPY_USES: dict[str, tuple[str, ...]] = {}  # the options that name each entropy metric's result


def entropy_metric(metric: str, summary: str, uses: tuple[str, ...], preset: bool, source: str) -> None:
    """Register an entropy metric: `uses` its own options, `preset` whether the preset covers it."""
    ENTROPY_USES[metric] = uses
    own = tuple(ENTROPY[name] for name in uses)
    fixed = tuple(option for option in PRESET_FIXES if preset and option not in own)
    register(Measure(metric, summary, LAYER, query="entropy", runs=1, options=(*own, *fixed, *PIPELINE),
                     source=source, curve="values"))


RENYI = ("alpha", "normalization", "clamp")
entropy_metric("dataset_entropy", "matrix Renyi entropy of the mean-pooled prompt vectors", RENYI, True,
               "Skean et al. 2025")
entropy_metric("prompt_entropy", "matrix Renyi entropy of each prompt's token matrix, averaged over prompts", RENYI,
               True, "Skean et al. 2025")
entropy_metric("effective_rank", "exp(S_1) of the normalised rows' spectrum (Diff-eRank or Roy-Vetterli)",
               ("convention",), False, "Roy & Vetterli 2007; Garrido et al. 2023")
entropy_metric("curvature", "mean angle between consecutive token steps of a prompt, averaged over prompts",
               ("abs_cos",), True, "Hosseini & Fedorenko 2023; Skean et al. 2025")
entropy_metric("infonce", "InfoNCE loss between two augmentations of each prompt, and 1 - L / log n",
               ("temperature",), False, "Oord et al. 2018")
entropy_metric("dime", "mean over permutations P of S(K_a o P K_b P^T) - S(K_a o K_b), two augmentation sets",
               ("alpha", "permutations", "seed"), False, "Skean et al. 2023")
entropy_metric("lidar", "entropy of Sigma_w^-1/2 Sigma_b Sigma_w^-1/2 over augmentations of each prompt",
               ("alpha", "exp"), False, "Thilak et al. 2023")

register(Measure(
    "residual_norm", "||h_l|| / ||h_{l+1} - h_l|| per sample, layer l to l+1, as a distribution", LAYER,
    query="residual_norm", runs=1, bounds=(0.0, None), source="Jiang, Zhou & Zhu 2024", curve="mean"))
register(Measure(
    "nc1", "within-class over between-class variability (1/C) tr(Sigma_W Sigma_B^+) per layer", LAYER,
    query="neural_collapse", runs=1, bounds=(0.0, None), options=(LENS.rcond,), source="Papyan et al. 2020",
    curve="values"))
register(Measure(
    "lens", "logit lens: each layer through the model's head, saturation and effective depth", HEAD, query="lens",
    runs=1, options=(LENS.epsilon, LENS.taus, LENS.heads), source="nostalgebraist 2020; Jiang, Zhou & Zhu 2024",
    curve="accuracy"))
register(Measure(
    "stitch", "stitching penalty: B's held-out loss through an affine map from A's layer, minus its own", FIT,
    query="stitch", options=tuple(STITCH.values()), source="Bansal et al. 2021; Brown et al. 2023"))
register(Measure(
    "probe", "held-out score per layer of a linear probe of a label set (ridge or logistic), with baselines, "
    "selectivity and metric-vs-score correlations", LAYER, query="probe", runs=1, bounds=(None, 1.0),
    options=tuple(PROBE.values()), source="Alain & Bengio 2016; Hewitt & Liang 2019; Skean et al. 2025",
    curve="score"))
