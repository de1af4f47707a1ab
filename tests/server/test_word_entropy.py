"""Cross-tokenizer units through a real server: the entropy family over the words of token-level
runs (`--align words`) and CKA / COS over the finest spans two tokenizations share (`--align
spans`), each against an independent float64 computation from the tokenizers' own offset
mappings and the token activations read back; and the refusals."""

from __future__ import annotations

import numpy as np
import pytest

from actstore.errors import FailedPrecondition, InvalidArgument
from tests.alignment_formulas import pool, span_units, word_units
from tests.factories import sentences
from tests.formulas import cka_numpy
from tests.server.test_cross_tokenizer import register_pair
from tests.server.test_import import IDS, N, write_vllm
from tests.server.test_metric_engine import unique_sentences


def punctuated(texts: list[str]) -> list[str]:
    """Texts with punctuation inside whitespace words ("dog's", "mat,", "ran."), where the two
    tokenizers split differently: BERT's Whitespace gives "dog" "'" "s", byte-level BPE "dog" "'s"."""
    out = []
    for i, text in enumerate(texts):
        words = text.split()
        if i % 3 == 0:
            words[-1] += "."
        if i % 3 == 1 and len(words) > 1:
            words[0] += ","
        if i % 4 == 2:
            words[len(words) // 2] += "'s"
        out.append(" ".join(words))
    return out


TEXTS = [*punctuated(unique_sentences(30, seed=12)), "dog.", "cat ran"]
LAYERS = [0, 3]
SHORT = 6  # max_len of the truncated pair


@pytest.fixture(scope="module")
def runs(module_client, tiny_models, tmp_path_factory):
    client = module_client
    folder = register_pair(client, tiny_models["bert"], tmp_path_factory.mktemp("bpe-gpt2"), TEXTS, 4, "bpe", "punct")
    keys = {name: client.capture(name, "punct", pooling="tokens").run_key for name in ("bert", "bpe")}
    keys.update({f"{name}-short": client.capture(name, "punct", pooling="tokens", max_len=SHORT).run_key
                 for name in ("bert", "bpe")})
    return keys, {"bert": tiny_models["bert"], "bpe": folder}


def offsets_of(folder, max_len: int) -> list[list[tuple[int, int]]]:
    """Each text's token spans, from the tokenizer itself."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    return [[tuple(s) for s in tok(text, truncation=True, max_length=max_len, return_offsets_mapping=True)
             ["offset_mapping"]] for text in TEXTS]


def word_matrices(client, key: str, folder, layer: int, how: str) -> list[np.ndarray]:
    """Per text, its (words, d) float64 matrix pooled with numpy from the raw token rows."""
    z = client.read_activations(key, layer)[0].astype(np.float64)
    out, row = [], 0
    for text, offsets in zip(TEXTS, offsets_of(folder, client.describe(key).max_len)):
        units = word_units(text, offsets)
        out.append(pool(z[row:], [units[w] for w in sorted(units)], how) if units else np.zeros((0, z.shape[1])))
        row += len(offsets)
    assert row == len(z)
    return out


def entropy_of(z: np.ndarray) -> float:
    """Shannon entropy of sigma^2 / sum sigma^2 of the mean-centred, row-normalised z."""
    x = z - z.mean(axis=0)
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    s2 = np.linalg.svd(x, compute_uv=False) ** 2
    p = s2[s2 > 1e-12 * s2.max()] / s2[s2 > 1e-12 * s2.max()].sum()
    return float(-np.sum(p * np.log(p)))


def curvature_of(z: np.ndarray) -> float:
    v = np.diff(z, axis=0)
    cos = np.sum(v[1:] * v[:-1], axis=1) / (np.linalg.norm(v[1:], axis=1) * np.linalg.norm(v[:-1], axis=1))
    return float(np.mean(np.arccos(np.clip(cos, -1, 1))))


def expected(metric: str, texts: list[np.ndarray]) -> float:
    every = np.concatenate(texts)
    if metric == "dataset_entropy":
        return entropy_of(every) / np.log(min(every.shape))  # normalization maxEntropy
    if metric == "effective_rank":
        return float(np.exp(entropy_of(every)))
    if metric == "prompt_entropy":
        return float(np.mean([entropy_of(t) for t in texts if len(t) >= 2]))
    return float(np.mean([curvature_of(t) for t in texts if len(t) >= 3]))


@pytest.mark.parametrize("how", ["mean", "last"])
@pytest.mark.parametrize("metric", ["dataset_entropy", "effective_rank", "prompt_entropy", "curvature"])
def test_word_entropy_matches_an_independent_computation(module_client, runs, metric, how):
    client = module_client
    keys, folders = runs
    counts = {}
    for name in ("bert", "bpe"):
        result = client.entropy(metric, keys[name], layers=LAYERS, align="words", word_pool=how,
                                normalization="maxEntropy" if metric == "dataset_entropy" else "raw")
        texts = {layer: word_matrices(client, keys[name], folders[name], layer, how) for layer in LAYERS}
        np.testing.assert_allclose(result.values, [expected(metric, texts[layer]) for layer in LAYERS],
                                   rtol=1e-9, atol=1e-9, err_msg=f"{name} {metric} {how}")
        assert result.provenance.options["align"] == "words" and result.provenance.options["word_pool"] == how
        counts[name] = result.scalars["words"]
        if metric in ("prompt_entropy", "curvature"):
            least = 2 if metric == "prompt_entropy" else 3
            assert result.scalars["prompts"] == sum(len(t) >= least for t in texts[0])
            assert any("fewer than" in note for note in result.notes)  # "dog." has one word
    # two tokenizers, one set of units: every word of every text, on both sides
    assert counts["bert"] == counts["bpe"] == sum(len(t.split()) for t in TEXTS)


def test_the_word_pool_is_part_of_the_result_key(module_client, runs):
    client = module_client
    keys, _ = runs
    mean = client.entropy("prompt_entropy", keys["bpe"], layers=[2], align="words")
    last = client.entropy("prompt_entropy", keys["bpe"], layers=[2], align="words", word_pool="last")
    tokens = client.entropy("prompt_entropy", keys["bpe"], layers=[2])
    assert not last.provenance.cached and last.values[0] != mean.values[0] != tokens.values[0]
    assert client.entropy("prompt_entropy", keys["bpe"], layers=[2], align="words").provenance.cached
    assert "align" not in tokens.provenance.options  # the token-level result keeps its key


def test_word_entropy_refusals_say_what_to_do(module_client, runs, tiny_models, tmp_path):
    client = module_client
    keys, _ = runs
    pooled = client.capture("bert", "punct", pooling="mean").run_key
    with pytest.raises(InvalidArgument, match="--pooling tokens"):
        client.entropy("dataset_entropy", pooled, align="words")
    with pytest.raises(InvalidArgument, match="not infonce"):
        client.entropy("infonce", keys["bert"], align="words")
    with pytest.raises(InvalidArgument, match="drop --align words"):
        client.entropy("curvature", keys["bert"], align="words", preset="skean2025")
    with pytest.raises(InvalidArgument, match="align 'spans' is not one of none, words"):
        client.entropy("curvature", keys["bert"], align="spans")
    with pytest.raises(InvalidArgument, match="word_pool 'first' is not one of mean, last"):
        client.entropy("curvature", keys["bert"], align="words", word_pool="first")
    # an imported token-level run has no character spans
    client.register_model(tiny_models["gpt2"], name="tiny-gpt2")
    client.register_dataset(texts=sentences(N, seed=11), sample_ids=IDS, name="toy")
    write_vllm(tmp_path / "vllm", np.random.default_rng(0), [3] * N)
    imported = client.import_activations(tmp_path / "vllm", model="tiny-gpt2", dataset="toy", pooling="tokens")
    with pytest.raises(FailedPrecondition, match="no character spans"):
        client.entropy("prompt_entropy", imported.run_key, align="words")
    with pytest.raises(FailedPrecondition, match="no character spans"):
        client.cka(imported.run_key, imported.run_key, align="spans")


def span_matrices(client, keys: dict, folders: dict, suffix: str, la: int, lb: int, how: str):
    """Both runs' (units, d) matrices over the spans both share, pooled with numpy."""
    z = {name: client.read_activations(keys[name + suffix], layer)[0].astype(np.float64)
         for name, layer in (("bert", la), ("bpe", lb))}
    offsets = {name: offsets_of(folders[name], client.describe(keys[name + suffix]).max_len) for name in folders}
    out = {"bert": [], "bpe": []}
    start = {"bert": 0, "bpe": 0}
    for sample, text in enumerate(TEXTS):
        units = span_units(text, offsets["bert"][sample], offsets["bpe"][sample])
        for side, name in enumerate(("bert", "bpe")):
            if units:
                out[name].append(pool(z[name][start[name]:], [u[side] for u in units], how))
            start[name] += len(offsets[name][sample])
    return np.concatenate(out["bert"]), np.concatenate(out["bpe"])


@pytest.mark.parametrize(("suffix", "how"), [("", "mean"), ("", "last"), ("-short", "mean")])
def test_span_aligned_cka_and_cos_match_an_independent_computation(module_client, runs, suffix, how):
    client = module_client
    keys, folders = runs
    result = client.cka(keys["bert" + suffix], keys["bpe" + suffix], layers_a=[1, 3], layers_b=[2], align="spans",
                        word_pool=how)
    for i, la in enumerate((1, 3)):
        x, y = span_matrices(client, keys, folders, suffix, la, 2, how)
        assert result.n == len(x)
        assert result.biased[i, 0] == pytest.approx(cka_numpy(x, y), abs=1e-9)
    assert result.provenance.options["align"] == "spans"
    words = client.cka(keys["bert" + suffix], keys["bpe" + suffix], layers_a=[1], layers_b=[2], align="words")
    assert result.n > words.n  # punctuation splits words into finer shared spans
    cos = client.cos(keys["bert" + suffix], keys["bpe" + suffix], layers_a=[3], layers_b=[2], align="spans",
                     word_pool=how, center="none")
    x, y = span_matrices(client, keys, folders, suffix, 3, 2, how)
    assert cos.mean[0, 0] == pytest.approx(np.mean(np.sum(x * y, 1) / np.linalg.norm(x, axis=1)
                                                   / np.linalg.norm(y, axis=1)), abs=1e-12)


def test_the_cli_gives_word_curves_and_span_matrices(module_server, module_client, runs):
    import json

    from tests.test_cli import actstore, ok

    keys, _ = runs
    direct = module_client.entropy("prompt_entropy", keys["bpe"], layers=[2], align="words", word_pool="last")
    out = json.loads(ok(actstore("entropy", "prompt-entropy", keys["bpe"], "--layers", "2", "--align", "words",
                                 "--word-pool", "last", "--json", server=module_server)))
    assert out["values"] == direct.values.tolist() and out["cached"]  # the same options, the same result key
    assert any("words of" in note for note in out["notes"])
    text = ok(actstore("cka", keys["bert"], keys["bpe"], "--layers-a", "1", "--layers-b", "2", "--align", "spans",
                       server=module_server))
    assert "shared span" in text
    refused = actstore("entropy", "curvature", keys["bert"], "--align", "spans", server=module_server)
    assert refused.returncode != 0 and "invalid choice: 'spans'" in refused.stderr
    refused = actstore("cka", keys["bert"], keys["bpe"], "--align", "words", "--bootstrap", "20", server=module_server)
    assert refused.returncode != 0 and "does not combine with --bootstrap" in refused.stdout + refused.stderr
