"""Metric-engine queries through gRPC against independent float64 numpy formulas.

Every expected value is computed here, from activations read back with `read_activations`, with
the formulas of METRICS.md written out explicitly (Gram-space HSIC, eigenvalues of Gram matrices,
explicit loops over batches and prompts), never with actstore's own metric functions.
"""

from __future__ import annotations

import re
from itertools import pairwise

import numpy as np
import pytest

from actstore.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from tests.conftest import make_settings
from tests.factories import save_tiny_model, sentences
from tests.formulas import debiased_numpy, hsic_u_numpy


# ---- independent float64 formulas -------------------------------------------------------------
def centred_gram(x: np.ndarray) -> np.ndarray:
    xc = x - x.mean(0)
    return xc @ xc.T


def minibatch_cka_np(x: np.ndarray, y: np.ndarray, batch_size: int, remainder: str) -> float:
    n = len(x)
    full, short = divmod(n, batch_size)
    bounds = [(b * batch_size, (b + 1) * batch_size) for b in range(full)]
    if short and remainder == "merge":
        bounds[-1] = (bounds[-1][0], n)
    kl = kk = ll = 0.0
    for start, stop in bounds:
        k, l_ = centred_gram(x[start:stop]), centred_gram(y[start:stop])  # each batch centred on its own
        kl += hsic_u_numpy(k, l_)
        kk += hsic_u_numpy(k, k)
        ll += hsic_u_numpy(l_, l_)
    return kl / np.sqrt(kk * ll)


def unit_rows(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def knn_sets(x: np.ndarray, k: int) -> list[set[int]]:
    u = unit_rows(x)
    s = u @ u.T
    np.fill_diagonal(s, -np.inf)
    order = np.argsort(-s, axis=1, kind="stable")
    # the k-th and (k+1)-th neighbours must not tie, or the expected value would be ambiguous
    kth, next_ = np.take_along_axis(s, order[:, k - 1:k + 1], axis=1).T
    assert np.all(kth - next_ > 1e-12), "a tie at the k-th neighbour makes mutual kNN ambiguous"
    return [set(row[:k].tolist()) for row in order]


def mutual_knn_np(x: np.ndarray, y: np.ndarray, k: int) -> float:
    a, b = knn_sets(x, k), knn_sets(y, k)
    return float(np.mean([len(sa & sb) / k for sa, sb in zip(a, b)]))


def normalize(z: np.ndarray) -> np.ndarray:
    """METRICS.md preprocessing: subtract the mean over the set, L2-normalise each row."""
    return unit_rows(z - z.mean(0))


def renyi_from_eigs(eigs: np.ndarray, alpha: float = 1.0) -> float:
    lam = eigs[eigs > 1e-12 * eigs.max()]
    p = lam / lam.sum()
    if alpha == 1:
        return float(-np.sum(p * np.log(p)))
    return float(np.log(np.sum(p ** alpha)) / (1 - alpha))


def matrix_entropy_np(z: np.ndarray, alpha: float = 1.0) -> float:
    zn = normalize(z)
    return renyi_from_eigs(np.linalg.eigvalsh(zn @ zn.T), alpha)  # always the n x n Gram here


def effective_rank_np(z: np.ndarray, convention: str) -> float:
    sigma = np.linalg.svd(normalize(z), compute_uv=False)
    sigma = sigma[sigma > 1e-12 * sigma.max()]
    p = sigma**2 / np.sum(sigma**2) if convention == "diff-erank" else sigma / np.sum(sigma)
    return float(np.exp(-np.sum(p * np.log(p))))


def prompt_entropy_np(tokens: np.ndarray, offsets: np.ndarray, alpha: float = 1.0) -> float:
    values = [matrix_entropy_np(tokens[a:b], alpha) for a, b in pairwise(offsets) if b - a >= 2]
    return float(np.mean(values))


def curvature_np(tokens: np.ndarray, offsets: np.ndarray, abs_cos: bool = False) -> float:
    per_prompt = []
    for a, b in pairwise(offsets):
        if b - a < 3:
            continue
        v = np.diff(tokens[a:b], axis=0)
        dots = np.sum(v[1:] * v[:-1], axis=1)
        scale = np.linalg.norm(v[1:], axis=1) * np.linalg.norm(v[:-1], axis=1)
        # a zero-length step (a repeated token at the embedding layer of a model without position
        # embeddings) has no direction: its angle counts as 0, the documented convention
        cos = np.ones_like(dots)
        np.divide(dots, scale, out=cos, where=scale > 0)
        cos = np.abs(cos) if abs_cos else cos
        per_prompt.append(np.mean(np.arccos(np.clip(cos, -1.0, 1.0))))
    return float(np.mean(per_prompt))


def infonce_score_np(a: np.ndarray, b: np.ndarray, temperature: float = 0.1) -> float:
    logits = unit_rows(a) @ unit_rows(b).T / temperature
    m = logits.max(axis=1, keepdims=True)
    lse = (m + np.log(np.exp(logits - m).sum(axis=1, keepdims=True))).ravel()
    loss = np.mean(lse - np.diag(logits))
    return float(1 - loss / np.log(len(a)))


def gram_entropy_np(k: np.ndarray, alpha: float = 1.0) -> float:
    return renyi_from_eigs(np.linalg.eigvalsh(k), alpha)


def dime_np(a: np.ndarray, b: np.ndarray, permutations: int = 10, seed: int = 0, alpha: float = 1.0) -> float:
    za, zb = normalize(a), normalize(b)
    ka, kb = za @ za.T, zb @ zb.T
    rng = np.random.default_rng(seed)  # the documented seeded permutations
    shuffled = []
    for _ in range(permutations):
        p = rng.permutation(len(a))
        shuffled.append(gram_entropy_np(ka * kb[p][:, p], alpha))
    return float(np.mean(shuffled) - gram_entropy_np(ka * kb, alpha))


def lidar_np(z: np.ndarray, groups: np.ndarray, exp: bool = False, delta: float = 1e-4) -> float:
    names = sorted(set(groups.tolist()))
    means = np.stack([z[groups == g].mean(0) for g in names])
    mu = means.mean(0)
    sigma_b = (means - mu).T @ (means - mu) / len(names)
    within = z - means[[names.index(g) for g in groups.tolist()]]
    sigma_w = within.T @ within / len(z) + delta * np.eye(z.shape[1])
    w, v = np.linalg.eigh(sigma_w)
    inv_root = v @ np.diag(w ** -0.5) @ v.T
    entropy = gram_entropy_np(inv_root @ sigma_b @ inv_root)
    return float(np.exp(entropy)) if exp else entropy


def residual_ratios_np(h: np.ndarray, h_next: np.ndarray) -> np.ndarray:
    return np.linalg.norm(h, axis=1) / np.linalg.norm(h_next - h, axis=1)


# ---- shared runs, captured once ----------------------------------------------------------------
def unique_sentences(n: int, seed: int) -> list[str]:
    """n distinct sentences (duplicates would tie in kNN and make groups degenerate)."""
    out: list[str] = []
    for text in sentences(4 * n, seed=seed):
        if text not in out:
            out.append(text)
    assert len(out) >= n
    return out[:n]


TEXTS = unique_sentences(60, seed=11)
AUG_TEXTS = unique_sentences(30, seed=4)


@pytest.fixture(scope="module")
def client(module_client):
    return module_client


@pytest.fixture(scope="module")
def runs(client, tiny_models):
    for name in ("gpt2", "bert", "llama"):
        client.register_model(tiny_models[name], name=name)
    client.register_dataset(texts=TEXTS, name="toy")
    client.register_dataset(texts=AUG_TEXTS, name="aug", augment_views=2)
    specs = {"gpt2": ("gpt2", "toy", "mean"), "bert": ("bert", "toy", "mean"),
             "llama_tok": ("llama", "toy", "tokens"), "gpt2_tok": ("gpt2", "toy", "tokens"),
             "aug": ("gpt2", "aug", "mean")}
    # submitted together, so the three models' capture replicas start side by side
    jobs = {name: client.submit_capture(m, d, pooling=p) for name, (m, d, p) in specs.items()}
    return {name: client.wait(job.job_id).target for name, job in jobs.items()}


_LAYERS: dict[str, list[np.ndarray]] = {}


def layers_of(client, run: str) -> list[np.ndarray]:
    """Every layer of a run, read back through gRPC, as float64 (cached per run)."""
    if run not in _LAYERS:
        info = client.describe(run)
        _LAYERS[run] = [client.read_activations(run, layer)[0].astype(np.float64)
                        for layer in range(info.num_layers + 1)]
    return _LAYERS[run]


def token_offsets(tiny_models, model: str, texts: list[str], max_len: int) -> np.ndarray:
    """Prompt boundaries of a token-level run, rebuilt from the model's own tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_models[model])
    counts = [len(tok(t, truncation=True, max_length=max_len)["input_ids"]) for t in texts]
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


@pytest.fixture(scope="module")
def offsets(client, runs, tiny_models):
    info = client.describe(runs["gpt2_tok"])
    result = token_offsets(tiny_models, "gpt2", TEXTS, info.max_len)
    assert info.pooling == "tokens" and result[-1] == info.rows, "token offsets do not cover the run's rows"
    assert np.array_equal(result, token_offsets(tiny_models, "llama", TEXTS, info.max_len))
    return result


def view_groups(client, run: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(groups, rows of view 0, rows of view 1) from the augmented run's ids "<id>#aug<k>"."""
    _, ids = client.read_activations(run, 0)
    originals = [i.split("#aug")[0] for i in ids]
    views = [int(i.split("#aug")[1]) for i in ids]
    names = list(dict.fromkeys(originals))
    groups = np.array([names.index(o) for o in originals])
    first = np.array([next(r for r, (o, v) in enumerate(zip(originals, views)) if o == g and v == 0) for g in names])
    second = np.array([next(r for r, (o, v) in enumerate(zip(originals, views)) if o == g and v == 1)
                       for g in names])
    return groups, first, second


# ---- minibatch CKA ------------------------------------------------------------------------------
MINIBATCH_CASES = {
    # name: (run a, run b, layers a, layers b, batch size)
    "pooled-gpt2-vs-bert": ("gpt2", "bert", [0, 1, 3], [0, 2, 3], 16),
    "tokens-gpt2-vs-llama": ("gpt2_tok", "llama_tok", [1, 3], [0, 2], 48),
    "augmented-within": ("aug", "aug", [0, 3], [1, 2, 3], 14),
}


@pytest.mark.parametrize("case", list(MINIBATCH_CASES))
@pytest.mark.parametrize("remainder", ["drop", "merge"])
def test_minibatch_cka_matches_numpy(client, runs, case, remainder):
    name_a, name_b, la, lb, batch = MINIBATCH_CASES[case]
    xs, ys = layers_of(client, runs[name_a]), layers_of(client, runs[name_b])
    n = len(xs[0])
    assert n % batch, "the case must leave a short final batch to drop or merge"
    result = client.minibatch_cka(runs[name_a], runs[name_b], batch_size=batch, layers_a=la, layers_b=lb,
                                  remainder=remainder)
    expected = np.array([[minibatch_cka_np(xs[i], ys[j], batch, remainder) for j in lb] for i in la])
    assert result.values.shape == (len(la), len(lb))
    np.testing.assert_allclose(result.values, expected, rtol=0, atol=1e-9)
    assert result.scalars["batches"] == n // batch and result.scalars["batch_size"] == batch
    assert any(("dropped" if remainder == "drop" else "merged") in note for note in result.notes), result.notes


def test_minibatch_drop_and_merge_differ(client, runs):
    """The remainder option reaches the computation (a short batch of 12 rows out of 60)."""
    drop = client.minibatch_cka(runs["gpt2"], runs["bert"], batch_size=16, layers_a=[1], layers_b=[2])
    merge = client.minibatch_cka(runs["gpt2"], runs["bert"], batch_size=16, layers_a=[1], layers_b=[2],
                                 remainder="merge")
    assert drop.provenance.result_key != merge.provenance.result_key
    assert abs(drop.values[0, 0] - merge.values[0, 0]) > 1e-9


@pytest.mark.parametrize("pair", [("gpt2", "bert"), ("gpt2_tok", "llama_tok")])
def test_minibatch_with_one_batch_equals_debiased_cka(client, runs, pair):
    a, b = runs[pair[0]], runs[pair[1]]
    n = client.describe(a).rows
    one_batch = client.minibatch_cka(a, b, batch_size=n)
    debiased = client.cka(a, b).debiased
    assert one_batch.scalars["batches"] == 1
    np.testing.assert_allclose(one_batch.values, debiased, rtol=0, atol=1e-9)
    xs, ys = layers_of(client, a), layers_of(client, b)
    np.testing.assert_allclose(one_batch.values[2, 1], debiased_numpy(xs[2], ys[1]), rtol=0, atol=1e-9)


# ---- mutual kNN ---------------------------------------------------------------------------------
@pytest.mark.parametrize("pair,k", [(("gpt2", "bert"), 5), (("gpt2", "gpt2"), 10), (("bert", "gpt2"), 3)])
def test_mutual_knn_matches_numpy(client, runs, pair, k):
    a, b = runs[pair[0]], runs[pair[1]]
    xs, ys = layers_of(client, a), layers_of(client, b)
    result = client.mutual_knn(a, b, k=k)
    expected = np.array([[mutual_knn_np(x, y, k) for y in ys] for x in xs])
    np.testing.assert_allclose(result.values, expected, rtol=0, atol=1e-12)
    if a == b:
        np.testing.assert_allclose(np.diag(result.values), 1.0)
    assert result.scalars["k"] == k and result.scalars["n"] == len(xs[0])


# ---- matrix entropy family ----------------------------------------------------------------------
@pytest.mark.parametrize("run", ["gpt2", "bert", "aug"])
def test_dataset_entropy_and_effective_rank_match_numpy(client, runs, run):
    zs = layers_of(client, runs[run])
    n, d = zs[0].shape
    shannon = client.entropy("dataset_entropy", runs[run])
    np.testing.assert_allclose(shannon.values, [matrix_entropy_np(z) for z in zs], rtol=1e-9, atol=1e-10)
    renyi2 = client.entropy("dataset_entropy", runs[run], alpha=2.0)
    np.testing.assert_allclose(renyi2.values, [matrix_entropy_np(z, 2.0) for z in zs], rtol=1e-9, atol=1e-10)
    assert np.all(renyi2.values <= shannon.values + 1e-12)  # Renyi entropy decreases with alpha
    scaled = client.entropy("dataset_entropy", runs[run], normalization="maxEntropy", layers=[1, 2])
    np.testing.assert_allclose(scaled.values, [matrix_entropy_np(zs[x]) / np.log(min(n, d)) for x in (1, 2)],
                               rtol=1e-9)
    for convention in ("diff-erank", "roy-vetterli"):
        erank = client.entropy("effective_rank", runs[run], convention=convention)
        np.testing.assert_allclose(erank.values, [effective_rank_np(z, convention) for z in zs], rtol=1e-9)
    # the Diff-eRank convention is exp of the Shannon dataset entropy
    np.testing.assert_allclose(client.entropy("effective_rank", runs[run]).values, np.exp(shannon.values),
                               rtol=1e-9)


@pytest.mark.parametrize("alpha", [1.0, 2.0])
def test_prompt_entropy_matches_numpy(client, runs, offsets, alpha):
    zs = layers_of(client, runs["gpt2_tok"])
    result = client.entropy("prompt_entropy", runs["gpt2_tok"], alpha=alpha)
    np.testing.assert_allclose(result.values, [prompt_entropy_np(z, offsets, alpha) for z in zs],
                               rtol=1e-9, atol=1e-10)
    lengths = np.diff(offsets)
    assert result.scalars["prompts"] == np.sum(lengths >= 2)


@pytest.mark.parametrize("abs_cos", [False, True])
def test_curvature_matches_numpy(client, runs, offsets, abs_cos):
    for run in ("gpt2_tok", "llama_tok"):
        zs = layers_of(client, runs[run])
        result = client.entropy("curvature", runs[run], abs_cos=abs_cos)
        np.testing.assert_allclose(result.values, [curvature_np(z, offsets, abs_cos) for z in zs],
                                   rtol=1e-9, atol=1e-10)
        assert result.scalars["prompts"] == np.sum(np.diff(offsets) >= 3)


def test_augmented_dataset_ids_and_groups(client, runs):
    info = client.describe(runs["aug"])
    assert info.n == 2 * len(AUG_TEXTS)
    groups, first, second = view_groups(client, runs["aug"])
    assert len(first) == len(second) == len(AUG_TEXTS)
    assert np.all(np.bincount(groups) == 2)


def test_infonce_dime_lidar_match_numpy(client, runs):
    zs = layers_of(client, runs["aug"])
    groups, first, second = view_groups(client, runs["aug"])
    infonce = client.entropy("infonce", runs["aug"])
    np.testing.assert_allclose(infonce.values, [infonce_score_np(z[first], z[second]) for z in zs], rtol=1e-9)
    warmer = client.entropy("infonce", runs["aug"], temperature=0.5, layers=[2])
    np.testing.assert_allclose(warmer.values, [infonce_score_np(zs[2][first], zs[2][second], 0.5)], rtol=1e-9)
    dime = client.entropy("dime", runs["aug"])
    np.testing.assert_allclose(dime.values, [dime_np(z[first], z[second]) for z in zs], rtol=1e-9, atol=1e-10)
    dime_seeded = client.entropy("dime", runs["aug"], permutations=4, seed=7, layers=[1])
    np.testing.assert_allclose(dime_seeded.values, [dime_np(zs[1][first], zs[1][second], 4, 7)], rtol=1e-9)
    lidar = client.entropy("lidar", runs["aug"])
    np.testing.assert_allclose(lidar.values, [lidar_np(z, groups) for z in zs], rtol=1e-9, atol=1e-10)
    lidar_exp = client.entropy("lidar", runs["aug"], exp=True)
    np.testing.assert_allclose(lidar_exp.values, [lidar_np(z, groups, exp=True) for z in zs], rtol=1e-9)


# ---- residual norm ratio ------------------------------------------------------------------------
@pytest.mark.parametrize("run", ["gpt2", "bert"])
def test_residual_norm_ratio_matches_numpy(client, runs, run):
    hs = layers_of(client, runs[run])
    result = client.residual_norm(runs[run])
    assert result.layers == list(range(len(hs) - 1))
    levels = list(result.quantile_levels)
    for layer in result.layers:
        ratios = residual_ratios_np(hs[layer], hs[layer + 1])
        assert np.isfinite(ratios).all()
        np.testing.assert_allclose(result.mean[layer], ratios.mean(), rtol=1e-9)
        # the histogram has 4000 bins over 10 decades of log10(ratio): one bin is 0.0025 decades
        median = result.quantiles[layer, levels.index(0.5)]
        assert abs(np.log10(median) - np.log10(np.median(ratios))) <= 10 / 4000 + 1e-9
        np.testing.assert_allclose(result.quantiles[layer, levels.index(0.0)], ratios.min(), rtol=1e-9)
        np.testing.assert_allclose(result.quantiles[layer, levels.index(1.0)], ratios.max(), rtol=1e-9)


# ---- cache --------------------------------------------------------------------------------------
def _cache_cases(runs):
    return {
        "minibatch": lambda c, **kw: c.minibatch_cka(runs["gpt2"], runs["bert"], batch_size=8, remainder="merge",
                                                     **kw).values,
        "knn": lambda c, **kw: c.mutual_knn(runs["gpt2"], runs["bert"], k=4, **kw).values,
        "dataset_entropy": lambda c, **kw: c.entropy("dataset_entropy", runs["bert"], alpha=3.0, **kw).values,
        "effective_rank": lambda c, **kw: c.entropy("effective_rank", runs["gpt2"], convention="roy-vetterli",
                                                    **kw).values,
        "prompt_entropy": lambda c, **kw: c.entropy("prompt_entropy", runs["llama_tok"], **kw).values,
        "curvature": lambda c, **kw: c.entropy("curvature", runs["llama_tok"], **kw).values,
        "infonce": lambda c, **kw: c.entropy("infonce", runs["aug"], **kw).values,
        "dime": lambda c, **kw: c.entropy("dime", runs["aug"], permutations=3, **kw).values,
        "lidar": lambda c, **kw: c.entropy("lidar", runs["aug"], **kw).values,
        "residual_norm": lambda c, **kw: c.residual_norm(runs["bert"], **kw).quantiles,
    }


@pytest.mark.parametrize("name", ["minibatch", "knn", "dataset_entropy", "effective_rank", "prompt_entropy",
                                  "curvature", "infonce", "dime", "lidar", "residual_norm"])
def test_cached_results_equal_recomputed(client, runs, name):
    ask = _cache_cases(runs)[name]
    first = ask(client)
    cached = ask(client)
    np.testing.assert_array_equal(cached, first)
    refreshed = ask(client, refresh=True)
    np.testing.assert_allclose(refreshed, first, rtol=0, atol=1e-12)


def test_cache_provenance(client, runs):
    first = client.entropy("dataset_entropy", runs["gpt2"], alpha=0.5, refresh=True)
    again = client.entropy("dataset_entropy", runs["gpt2"], alpha=0.5)
    assert not first.provenance.cached and again.provenance.cached
    assert again.provenance.result_key == first.provenance.result_key
    assert first.provenance.options["alpha"] == 0.5 and first.provenance.run_keys == [runs["gpt2"]]
    other = client.entropy("dataset_entropy", runs["gpt2"], alpha=0.5, normalization="logN")
    assert other.provenance.result_key != first.provenance.result_key
    np.testing.assert_allclose(other.values, first.values / np.log(client.describe(runs["gpt2"]).rows), rtol=1e-12)


# ---- errors -------------------------------------------------------------------------------------
def test_query_errors(client, runs):
    with pytest.raises(InvalidArgument, match="--pooling tokens"):
        client.entropy("prompt_entropy", runs["gpt2"])
    with pytest.raises(InvalidArgument, match="--pooling tokens"):
        client.entropy("curvature", runs["bert"])
    with pytest.raises(FailedPrecondition, match="--augment-views"):
        client.entropy("infonce", runs["gpt2"])
    with pytest.raises(FailedPrecondition, match="--augment-views"):
        client.entropy("lidar", runs["bert"])
    with pytest.raises(InvalidArgument, match="layer 7 is out of range"):
        client.entropy("dataset_entropy", runs["gpt2"], layers=[1, 7])
    with pytest.raises(InvalidArgument, match="batch_size 2"):
        client.minibatch_cka(runs["gpt2"], runs["bert"], batch_size=2)
    with pytest.raises(InvalidArgument, match="k=60"):
        client.mutual_knn(runs["gpt2"], runs["bert"], k=60)
    with pytest.raises(InvalidArgument, match="k=75"):
        client.mutual_knn(runs["gpt2"], k=75)
    with pytest.raises(InvalidArgument, match="remainder 'keep'"):
        client.minibatch_cka(runs["gpt2"], batch_size=8, remainder="keep")
    with pytest.raises(InvalidArgument, match="convention"):
        client.entropy("effective_rank", runs["gpt2"], convention="shannon")


# ---- stitching ----------------------------------------------------------------------------------
def llama_own_loss(tiny_models, prompts: list[str]) -> tuple[float, int]:
    """Mean next-token cross-entropy of the tiny llama over the given prompts, one at a time."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_models["llama"])
    model = AutoModelForCausalLM.from_pretrained(tiny_models["llama"]).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for text in prompts:
            ids = torch.tensor([tok(text)["input_ids"]])
            if ids.shape[1] < 2:
                continue
            logits = model(input_ids=ids).logits[0].double()
            total += float(F.cross_entropy(logits[:-1], ids[0, 1:], reduction="sum"))
            count += ids.shape[1] - 1
    return total / count, count


def test_stitching_penalty_and_own_loss(client, runs, tiny_models):
    gpt2, llama = runs["gpt2_tok"], runs["llama_tok"]
    answers = {(i, j): client.stitch(gpt2, i, llama, j) for i, j in [(1, 2), (3, 1), (0, 3)]}
    for answer in answers.values():
        s = answer.scalars
        assert s["penalty"] == pytest.approx(s["stitched_loss"] - s["own_loss"], abs=1e-12)
        assert -np.inf < s["test_r2"] <= 1.0
        assert s["test_prompts"] == round(0.25 * len(TEXTS)) and s["train_prompts"] == len(TEXTS) - s["test_prompts"]
    own = {key: a.scalars["own_loss"] for key, a in answers.items()}
    assert len(set(own.values())) == 1, f"B's own loss must not depend on the stitched layers: {own}"
    # the held-out prompts: a permutation seeded by `seed`, its first test_fraction * n prompts
    n = len(TEXTS)
    held_out = np.sort(np.random.default_rng(0).permutation(n)[:round(0.25 * n)])
    expected, targets = llama_own_loss(tiny_models, [TEXTS[p] for p in held_out])
    first = next(iter(answers.values())).scalars
    assert first["test_targets"] == targets
    assert first["own_loss"] == pytest.approx(expected, rel=1e-5)
    # another split changes the held-out prompts, but not what "own loss" means
    other = client.stitch(gpt2, 1, llama, 2, seed=3, test_fraction=0.5).scalars
    held_out = np.sort(np.random.default_rng(3).permutation(n)[:round(0.5 * n)])
    assert other["own_loss"] == pytest.approx(llama_own_loss(tiny_models, [TEXTS[p] for p in held_out])[0],
                                              rel=1e-5)
    assert other["penalty"] == pytest.approx(other["stitched_loss"] - other["own_loss"], abs=1e-12)


@pytest.mark.parametrize("layer", [0, 2, 3])
def test_stitching_a_run_into_itself_costs_nothing(client, runs, layer):
    llama = runs["llama_tok"]
    s = client.stitch(llama, layer, llama, layer).scalars
    assert abs(s["penalty"]) < 1e-3, s
    assert s["test_r2"] == pytest.approx(1.0, abs=1e-6), s


def test_stitch_cache_and_errors(client, runs):
    first = client.stitch(runs["gpt2_tok"], 2, runs["llama_tok"], 2)
    again = client.stitch(runs["gpt2_tok"], 2, runs["llama_tok"], 2)
    assert again.provenance.cached and again.scalars == first.scalars
    refreshed = client.stitch(runs["gpt2_tok"], 2, runs["llama_tok"], 2, refresh=True)
    assert not refreshed.provenance.cached
    for key in ("penalty", "own_loss", "stitched_loss", "test_r2"):
        assert refreshed.scalars[key] == pytest.approx(first.scalars[key], abs=1e-9)
    with pytest.raises(InvalidArgument, match="--pooling tokens"):
        client.stitch(runs["gpt2"], 1, runs["llama_tok"], 1)
    with pytest.raises(InvalidArgument, match="--pooling tokens"):
        client.stitch(runs["gpt2_tok"], 1, runs["gpt2"], 1)
    with pytest.raises(InvalidArgument, match="layer_a 9 is out of range"):
        client.stitch(runs["gpt2_tok"], 9, runs["llama_tok"], 1)


# ---- limits -------------------------------------------------------------------------------------
GIB_NEEDED = re.compile(r"(\d+(\.\d+)? (B|KiB|MiB|GiB))")


@pytest.fixture(scope="module")
def limited(tmp_path_factory, ray_cluster):
    """A server with a 10 kB accumulator limit and a 4-cell matrix limit, over a 40-wide model
    (one 40 x 40 float64 scatter alone is 12.8 kB, so no tiling can bring a layer under the limit)."""
    from actstore.client import Client
    from actstore.server.app import start_server

    root = tmp_path_factory.mktemp("limited")
    model = save_tiny_model("bert", root / "bert40", hidden_size=40, seed=2)
    server = start_server(make_settings(root / "store", max_accumulator_bytes=10_000, max_matrix_cells=4))
    try:
        with Client(f"127.0.0.1:{server.port}") as c:
            c.register_model(model, name="bert40")
            c.register_dataset(texts=TEXTS, name="toy")
            c.register_dataset(texts=AUG_TEXTS, name="aug", augment_views=2)
            yield c, {"pooled": c.capture("bert40", "toy", pooling="mean").run_key,
                      "aug": c.capture("bert40", "aug", pooling="mean").run_key}
    finally:
        server.stop()


def _assert_exhausted(excinfo) -> None:
    message = str(excinfo.value)
    assert GIB_NEEDED.search(message), f"no size in: {message}"
    assert "ACTSTORE_MAX_ACCUMULATOR_BYTES" in message, message


def test_similarity_over_the_memory_limit_is_resource_exhausted(limited):
    c, runs = limited
    with pytest.raises(ResourceExhausted) as excinfo:
        c.cka(runs["pooled"], layers_a=[1], layers_b=[2])
    _assert_exhausted(excinfo)
    with pytest.raises(ResourceExhausted) as excinfo:
        c.mutual_knn(runs["pooled"], layers_a=[1], layers_b=[2], k=5)
    _assert_exhausted(excinfo)
    # the server is still answering
    assert c.describe(runs["pooled"]).status == "committed"


@pytest.mark.parametrize("metric", ["infonce", "dime", "lidar"])
def test_invariance_metric_over_the_memory_limit_is_resource_exhausted(limited, metric):
    c, runs = limited
    with pytest.raises(ResourceExhausted) as excinfo:
        c.entropy(metric, runs["aug"], layers=[1])
    _assert_exhausted(excinfo)


@pytest.mark.parametrize("metric", ["dataset_entropy", "effective_rank"])
def test_dataset_entropy_over_the_memory_limit_is_resource_exhausted(limited, metric):
    """One layer's streamed d x d scatter (40 x 40 float64 = 12.8 kB) is over the 10 kB limit, and
    no tiling splits a single layer: the request must be refused, as every other metric is."""
    c, runs = limited
    with pytest.raises(ResourceExhausted) as excinfo:
        c.entropy(metric, runs["pooled"], layers=[1])
    _assert_exhausted(excinfo)


def test_matrix_cell_limit(limited):
    c, runs = limited
    with pytest.raises(ResourceExhausted, match=r"4 x 4 result exceeds the limit of 4 cells"):
        c.cka(runs["pooled"])
    with pytest.raises(ResourceExhausted, match=r"4 x 4 result exceeds the limit of 4 cells"):
        c.submit_cka_matrix([runs["pooled"]])
    with pytest.raises(ResourceExhausted, match=r"2 x 3 result exceeds"):
        c.minibatch_cka(runs["pooled"], batch_size=8, layers_a=[0, 1], layers_b=[1, 2, 3])
