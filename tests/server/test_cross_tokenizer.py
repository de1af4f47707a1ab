"""CKA between token-level runs of two tokenizers (a word-level one and a byte-level BPE trained
here on the test texts), aligned to shared words, against an independent computation from the
tokenizers' own offset mappings and the activations read back."""

from __future__ import annotations

import numpy as np
import pytest

from actstore.errors import InvalidArgument
from tests.alignment_formulas import word_units
from tests.factories import build_tiny_model
from tests.formulas import cka_numpy, debiased_numpy
from tests.server.test_metric_engine import unique_sentences

TEXTS = unique_sentences(30, seed=8)
OTHER = unique_sentences(30, seed=9)


def bpe_tokenizer(texts: list[str]):
    """A byte-level BPE (GPT-2 style) trained on the texts: it splits words into subwords."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<eos>")


def save_bpe_gpt2(folder, texts: list[str], seed: int):
    """A tiny GPT-2 with `bpe_tokenizer(texts)`, saved to `folder` (returned)."""
    import transformers as T

    tok = bpe_tokenizer(texts)
    model, _ = build_tiny_model("gpt2", seed=seed)
    model.resize_token_embeddings(len(tok))
    model.config.vocab_size = len(tok)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    assert isinstance(T.AutoTokenizer.from_pretrained(folder), T.PreTrainedTokenizerFast)
    return folder


def register_pair(client, bert_folder, folder, texts: list[str], seed: int, bpe: str, dataset: str):
    """Register the tiny BERT as "bert", a BPE GPT-2 trained on `texts` (saved to `folder`) as
    `bpe`, and the texts as `dataset`; the GPT-2's folder."""
    save_bpe_gpt2(folder, texts, seed)
    client.register_model(bert_folder, name="bert")
    client.register_model(folder, name=bpe)
    client.register_dataset(texts=texts, name=dataset)
    return folder


@pytest.fixture(scope="module")
def runs(module_client, tiny_models, tmp_path_factory):
    client = module_client
    folder = register_pair(client, tiny_models["bert"], tmp_path_factory.mktemp("bpe-gpt2"), TEXTS, 3, "gpt2-bpe",
                           "words")
    client.register_dataset(texts=OTHER, name="other")
    runs = {name: client.capture(name, "words", pooling="tokens").run_key for name in ("bert", "gpt2-bpe")}
    runs["other"] = client.capture("gpt2-bpe", "other", pooling="tokens").run_key
    return runs, {"bert": tiny_models["bert"], "gpt2-bpe": folder}


# ---- independent computation ----------------------------------------------------------------------
def word_tokens(folder, max_len: int) -> tuple[dict, int]:
    """{(sample, word): [row, ...]} from the tokenizer's offset mapping, and the number of rows."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    out, row = {}, 0
    for sample, text in enumerate(TEXTS):
        offsets = tok(text, truncation=True, max_length=max_len, return_offsets_mapping=True)["offset_mapping"]
        for word, tokens in word_units(text, offsets).items():
            out[sample, word] = [row + t for t in tokens]
        row += len(offsets)
    return out, row


def aligned(z: np.ndarray, rows: dict, pairs: list, how: str) -> np.ndarray:
    return np.stack([z[rows[p]].mean(0) if how == "mean" else z[rows[p][-1]] for p in pairs])


@pytest.mark.parametrize("how", ["mean", "last"])
def test_word_aligned_cka_matches_an_independent_computation(module_client, runs, how):
    client = module_client
    keys, folders = runs
    info = {name: client.describe(keys[name]) for name in ("bert", "gpt2-bpe")}
    maps = {name: word_tokens(folders[name], info[name].max_len) for name in folders}
    for name, (_, rows) in maps.items():
        assert rows == info[name].rows, name
    # the two tokenizations differ (BPE splits words, BERT adds [CLS]/[SEP]): row-wise CKA is refused
    assert info["bert"].rows != info["gpt2-bpe"].rows
    with pytest.raises(InvalidArgument):
        client.cka(keys["bert"], keys["gpt2-bpe"])
    pairs = sorted(maps["bert"][0].keys() & maps["gpt2-bpe"][0].keys())
    assert sum(len(t.split()) for t in TEXTS) == len(pairs)  # every word reached by both
    assert any(len(v) > 1 for v in maps["gpt2-bpe"][0].values()), "the BPE must split some word"
    result = client.cka(keys["bert"], keys["gpt2-bpe"], layers_a=[0, 2, 3], layers_b=[1, 3], align="words",
                        word_pool=how)
    assert result.n == len(pairs)
    xs = {la: aligned(client.read_activations(keys["bert"], la)[0].astype(np.float64), maps["bert"][0], pairs, how)
          for la in (0, 2, 3)}
    ys = {lb: aligned(client.read_activations(keys["gpt2-bpe"], lb)[0].astype(np.float64), maps["gpt2-bpe"][0],
                      pairs, how) for lb in (1, 3)}
    np.testing.assert_allclose(result.biased, [[cka_numpy(xs[a], ys[b]) for b in (1, 3)] for a in (0, 2, 3)],
                               atol=1e-9)
    np.testing.assert_allclose(result.debiased, [[debiased_numpy(xs[a], ys[b]) for b in (1, 3)] for a in (0, 2, 3)],
                               atol=1e-9)
    assert result.provenance.options["align"] == "words" and result.provenance.options["word_pool"] == how


def test_alignment_checks_the_texts_and_the_runs(module_client, runs):
    client = module_client
    keys, _ = runs
    with pytest.raises(InvalidArgument, match=r"do not cover the same texts: text of sample 0"):
        client.cka(keys["bert"], keys["other"], align="words")
    with pytest.raises(InvalidArgument, match="--pooling tokens"):
        client.cka(client.capture("bert", "words", pooling="mean").run_key, keys["gpt2-bpe"], align="words")
    with pytest.raises(InvalidArgument, match="align"):
        client.cka(keys["bert"], keys["gpt2-bpe"], align="sentences")
    # a run into itself: the aligned rows are its words, and CKA of a layer with itself is 1
    self_cka = client.cka(keys["gpt2-bpe"], keys["gpt2-bpe"], layers_a=[2], layers_b=[2], align="words")
    assert self_cka.biased[0, 0] == pytest.approx(1.0)


@pytest.mark.parametrize("center", ["global-mean", "none"])
def test_word_aligned_cos_matches_an_independent_computation(module_client, runs, center):
    client = module_client
    keys, folders = runs
    info = {name: client.describe(keys[name]) for name in folders}
    maps = {name: word_tokens(folders[name], info[name].max_len)[0] for name in folders}
    pairs = sorted(maps["bert"].keys() & maps["gpt2-bpe"].keys())
    result = client.cos(keys["bert"], keys["gpt2-bpe"], layers_a=[1, 3], layers_b=[2], center=center, align="words")
    for i, la in enumerate((1, 3)):
        x = aligned(client.read_activations(keys["bert"], la)[0].astype(np.float64), maps["bert"], pairs, "mean")
        y = aligned(client.read_activations(keys["gpt2-bpe"], 2)[0].astype(np.float64), maps["gpt2-bpe"], pairs,
                    "mean")
        if center == "global-mean":  # the mean over the aligned word rows
            x, y = x - x.mean(0), y - y.mean(0)
        cos = np.sum(x * y, axis=1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))
        assert result.mean[i, 0] == pytest.approx(cos.mean(), abs=1e-12)
        np.testing.assert_allclose(result.quantiles[i, 0], np.quantile(cos, result.quantile_levels), atol=1e-12)
    assert result.n == len(pairs)
