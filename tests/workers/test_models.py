"""Model adapter tests: tiny randomly initialised models built from transformers configs, saved
to a temp folder with a tiny tokenizer built offline, plus slow tests on the packaged models."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from actstore.errors import InvalidArgument, NotFound
from actstore.metrics.lens_head import LensHead
from actstore.modeling import introspection, pooling, sources
from actstore.modeling.adapter import ModelAdapter
from actstore.modeling.introspection import model_digest
from actstore.modeling.sources import BUILTIN_MODELS, resolve_model_source
from actstore.modeling.torch_lens import TorchLensHead
from tests.factories import TEXTS, WORDS, build_tiny_model

_build = build_tiny_model


NAMES = ["bert", "bert-cls", "gpt2", "gpt2-cls", "llama", "vit", "vit-cls"]
EXPECTED = {  # kind, arch
    "bert": ("encoder", "BertModel"),
    "bert-cls": ("encoder", "BertForSequenceClassification"),
    "gpt2": ("causal-lm", "GPT2LMHeadModel"),
    "gpt2-cls": ("causal-lm", "GPT2ForSequenceClassification"),
    "llama": ("causal-lm", "LlamaForCausalLM"),
    "vit": ("vision", "ViTModel"),
    "vit-cls": ("vision", "ViTForImageClassification"),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    out = {}
    for name in NAMES:
        model, tok = _build(name)
        path = root / name
        model.save_pretrained(path)
        if tok is not None:
            tok.save_pretrained(path)
        out[name] = path
    return out


@pytest.fixture(scope="module")
def adapters(folders) -> dict[str, ModelAdapter]:
    # on the CPU even where a GPU is present: the CUDA path is checked against these below
    return {name: ModelAdapter.load(path, device="cpu") for name, path in folders.items()}


def _images(n: int = 3, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, 28, 28), dtype=np.uint8)


def _batch(adapter: ModelAdapter, max_len: int = 32):
    return adapter.encode(_images() if adapter.kind == "vision" else TEXTS, max_len)


# ---- resolve --------------------------------------------------------------------------------


def test_resolve_local_folder_and_errors(tmp_path, folders):
    assert resolve_model_source(str(folders["bert"]), tmp_path) == folders["bert"]
    with pytest.raises(NotFound, match="minilm-l6"):
        resolve_model_source(str(tmp_path / "nope"), tmp_path)
    (tmp_path / "file.bin").write_bytes(b"x")
    with pytest.raises(InvalidArgument, match="not a model folder"):
        resolve_model_source(str(tmp_path / "file.bin"), tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidArgument, match="config.json"):
        resolve_model_source(str(tmp_path / "empty"), tmp_path)
    assert set(BUILTIN_MODELS) == {"minilm-l6", "smollm2-135m"}
    assert (resolve_model_source("minilm-l6", tmp_path) / "config.json").is_file()


def test_smollm2_cache_is_atomic(tmp_path, monkeypatch):
    fake = tmp_path / "pkg" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    fake.parent.mkdir()
    fake.write_bytes(b"gguf")
    monkeypatch.setattr(sources, "_smollm2_gguf", lambda: fake)
    cache = tmp_path / "cache"
    calls = []

    def crash(gguf, out_dir):
        calls.append(out_dir)
        (out_dir / "config.json").write_text("{}")  # half written
        raise RuntimeError("killed")

    monkeypatch.setattr(sources, "_dequantise_gguf", crash)
    with pytest.raises(RuntimeError):
        resolve_model_source("smollm2-135m", cache)
    assert list(cache.iterdir()) == []  # neither a final folder nor a temp folder is left

    def ok(gguf, out_dir):
        calls.append(out_dir)
        (out_dir / "config.json").write_text("{}")
        (out_dir / "model.safetensors").write_bytes(b"")

    monkeypatch.setattr(sources, "_dequantise_gguf", ok)
    final = resolve_model_source("smollm2-135m", cache)
    assert final.parent == cache and final.name.startswith("smollm2-135m-")
    assert sorted(p.name for p in final.iterdir()) == ["config.json", "model.safetensors"]
    assert [p.name for p in cache.iterdir()] == [final.name]
    n = len(calls)
    assert resolve_model_source("smollm2-135m", cache) == final  # cached: no rebuild
    assert len(calls) == n


def test_build_atomically_race_loser_uses_winner(tmp_path):
    final = tmp_path / "m"

    def build(tmp):  # another process finishes while we build
        (tmp / "config.json").write_text('{"mine": true}')
        final.mkdir()
        (final / "config.json").write_text('{"winner": true}')

    assert sources.build_atomically(final, build) == final
    assert json.loads((final / "config.json").read_text()) == {"winner": True}
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


# ---- load / kind / shapes ---------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_kind_and_shapes(adapters, name):
    a = adapters[name]
    kind, arch = EXPECTED[name]
    assert (a.kind, a.arch, a.num_layers, a.hidden_size) == (kind, arch, 3, 16)
    assert a.device.type == "cpu" and not a.model.training
    assert len(a.digest) == 64
    batch = _batch(a)
    hidden = a.hidden_states(batch)
    assert hidden.dtype == torch.float32 and not hidden.requires_grad
    if a.kind == "vision":
        assert batch.mask is None
        assert hidden.shape == (4, 3, 17, 16)  # 16 patches + CLS
    else:
        assert hidden.shape == (4, len(TEXTS), batch.mask.shape[1], 16)
        assert (batch.mask[:, 0] == 1).all()  # right padding
    # layers 0..L-1 are HF's hidden states unchanged
    with torch.no_grad():
        ref = a.base(**batch.inputs, output_hidden_states=True).hidden_states
    for layer in range(a.num_layers):
        assert torch.equal(hidden[layer], ref[layer])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("name", NAMES)
def test_a_cuda_replica_captures_what_the_cpu_does(adapters, folders, name):
    # ModelAdapter.load picks CUDA where present, as a capture replica holding a GPU does; its
    # states agree with the CPU's to float32 rounding (different kernels, same float32 maths)
    on_cpu = adapters[name]
    on_gpu = ModelAdapter.load(folders[name])
    assert on_gpu.device.type == "cuda" and on_gpu.digest == on_cpu.digest
    batch = _batch(on_cpu)
    hidden = on_gpu.hidden_states(batch)
    assert hidden.device.type == "cuda"
    np.testing.assert_allclose(hidden.cpu().numpy(), on_cpu.hidden_states(batch).numpy(), rtol=1e-4, atol=1e-5)
    if on_cpu.kind != "vision":
        sites = ["resid_post", "mlp_out"]
        got, expected = on_gpu.site_states(batch, sites), on_cpu.site_states(batch, sites)
        for site in sites:
            np.testing.assert_allclose(got[site].cpu().numpy(), expected[site].numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_forwards_from_several_threads_at_once_each_keep_their_own_states(adapters, name):
    # a capture replica runs forwards from several threads at once, and every forward calls
    # every hook registered at the time: each call must keep only its own thread's outputs
    a = adapters[name]
    sites = ["resid_post", "mlp_out"]
    batches = [a.encode([text] * (1 + i % 3), 32) for i, text in enumerate(TEXTS * 4)]
    expected = [a.site_states(batch, sites) for batch in batches]
    start = threading.Barrier(4)
    got: dict[int, dict] = {}

    def run(offset: int) -> None:
        start.wait()
        for _ in range(10):
            for i in range(offset, len(batches), 4):
                got[i] = a.site_states(batches[i], sites)

    threads = [threading.Thread(target=run, args=(offset,)) for offset in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(got) == list(range(len(batches)))
    for i, states in got.items():
        for site in sites:
            assert torch.equal(states[site], expected[i][site]), (i, site)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_layer_L_is_pre_final_norm(adapters, name):
    a = adapters[name]
    batch = _batch(a)
    hidden = a.hidden_states(batch)
    with torch.no_grad():
        out = a.model(**batch.inputs, output_hidden_states=True)
    # HF's last hidden state has the final norm applied; ours does not
    assert not torch.allclose(hidden[-1], out.hidden_states[-1], atol=1e-3)
    norm = a.base.ln_f if name == "gpt2" else a.base.norm
    with torch.no_grad():
        assert torch.allclose(norm(hidden[-1]), out.hidden_states[-1], atol=1e-6)
    logits = a.head_logits(hidden[-1])
    assert logits.shape == out.logits.shape
    assert torch.allclose(logits, out.logits, atol=1e-5, rtol=0)
    head = a.lens_head()
    assert head.norm == ("layernorm" if name == "gpt2" else "rmsnorm")
    assert head.position == "every" and head.task == "lm"
    assert head.weight.shape == (a.config.vocab_size, 16) and head.weight.dtype == np.float32
    assert (head.norm_bias is None) == (name == "llama")
    assert head.bias is None
    # the lens at an inner layer is the same formula
    assert a.head_logits(hidden[1]).shape == out.logits.shape


@pytest.mark.parametrize("name", ["bert-cls", "vit-cls", "gpt2-cls"])
def test_classifier_lens_head(adapters, name):
    a = adapters[name]
    batch = _batch(a)
    hidden = a.hidden_states(batch)
    with torch.no_grad():
        logits = a.model(**batch.inputs).logits
    head = a.lens_head()
    position = "last" if name == "gpt2-cls" else "cls"  # decoders classify from the last token
    assert head.position == position and head.task == "classifier"
    got = a.head_logits(a.pool(hidden, batch.mask, position)[-1])
    assert not torch.allclose(
        a.head_logits(a.pool(hidden, batch.mask, "mean")[-1]), logits, atol=1e-3
    )
    assert torch.allclose(got, logits, atol=1e-5, rtol=0)
    if name == "vit-cls":  # ViT: layernorm, then the classifier on CLS
        assert head.norm == "layernorm" and head.pooler_weight is None
        assert head.weight.shape == (10, 16) and head.bias.shape == (10,)
    elif name == "gpt2-cls":  # GPT-2: ln_f, then the score layer (no bias) on the last token
        assert (
            head.norm == "layernorm" and head.bias is None and head.weight.shape == (3, 16)
        )
    else:  # BERT: no final norm; the pooler (dense + tanh) sits before the classifier
        assert head.norm == "none" and head.pooler_activation == "tanh"
        assert head.pooler_weight.shape == (16, 16) and head.weight.shape == (3, 16)


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert-cls", "vit-cls", "gpt2-cls"])
def test_torch_lens_matches_the_numpy_reference(adapters, name):
    """TorchLensHead (float32, what lens tasks run) and LensHead.logits (float64) are one formula."""
    a = adapters[name]
    head = a.lens_head()
    h = torch.randn(7, 16, generator=torch.Generator().manual_seed(1)) * 3
    got = TorchLensHead(head, "cpu")(h)
    np.testing.assert_allclose(got.numpy(), head.logits(h.numpy()), rtol=1e-4, atol=1e-4)
    assert head.arch == a.arch and head.digest == a.digest


def test_torch_lens_rmsnorm_bias_and_pooler():
    rng = np.random.default_rng(3)
    head = LensHead("rmsnorm", rng.standard_normal(8), rng.standard_normal(8), 1e-6,
                    rng.standard_normal((5, 6)), rng.standard_normal(5),
                    pooler_weight=rng.standard_normal((6, 8)), pooler_bias=rng.standard_normal(6),
                    pooler_activation="gelu", position="cls", task="classifier")
    h = rng.standard_normal((4, 8))
    got = TorchLensHead(head, "cpu")(torch.from_numpy(h)).numpy()
    np.testing.assert_allclose(got, head.logits(h), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["bert", "vit"])
def test_bare_backbone_has_no_head(adapters, name):
    a = adapters[name]
    assert a.lens_head() is None
    with pytest.raises(InvalidArgument, match="no head"):
        a.head_logits(torch.zeros(2, 16))


# ---- encode / pooling -------------------------------------------------------------------------


def test_causal_lm_pads_with_eos_on_the_right(adapters):
    a = adapters["gpt2"]
    assert a.tokenizer.pad_token == "<eos>" and a.tokenizer.padding_side == "right"
    batch = a.encode(TEXTS, 32)
    ids, mask = batch.inputs["input_ids"], batch.mask
    lengths = mask.sum(1)
    assert lengths.tolist() == [len(t.split()) for t in TEXTS]
    for i, n in enumerate(lengths.tolist()):
        assert mask[i, :n].all() and not mask[i, n:].any()
        assert (ids[i, n:] == a.tokenizer.pad_token_id).all()


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "vit"])
def test_pooling_matches_hand_computation(adapters, name):
    a = adapters[name]
    batch = _batch(a)
    hidden = a.hidden_states(batch)
    mask = batch.mask_for(hidden)
    L1, b, _, d = hidden.shape
    cls = a.pool(hidden, batch.mask, "cls")
    last = a.pool(hidden, batch.mask, "last")
    mean = a.pool(hidden, batch.mask, "mean")
    for out in (cls, last, mean):
        assert out.shape == (L1, b, d)
    for i in range(b):
        n = int(mask[i].sum())
        assert torch.equal(cls[:, i], hidden[:, i, 0])
        assert torch.equal(last[:, i], hidden[:, i, n - 1])
        assert torch.allclose(mean[:, i], hidden[:, i, :n].mean(dim=1), atol=1e-6)
    tokens, counts = a.pool_tokens(hidden, batch.mask)
    assert counts.dtype == np.int64 and counts.tolist() == mask.sum(1).tolist()
    assert tokens.shape == (L1, int(counts.sum()), d)
    ref = torch.cat([hidden[:, i, : int(counts[i])] for i in range(b)], dim=1)
    assert torch.equal(tokens, ref)
    with pytest.raises(InvalidArgument, match="pool_tokens"):
        a.pool(hidden, batch.mask, "tokens")
    with pytest.raises(InvalidArgument, match="unknown pooling"):
        a.pool(hidden, batch.mask, "max")


def test_pool_last_any_padding_side():
    hidden = torch.arange(2 * 2 * 4 * 3, dtype=torch.float32).view(2, 2, 4, 3)
    mask = torch.tensor([[0, 1, 1, 0], [1, 0, 0, 0]])
    last = pooling.pool(hidden, mask, "last")
    assert torch.equal(last[:, 0], hidden[:, 0, 2]) and torch.equal(last[:, 1], hidden[:, 1, 0])
    with pytest.raises(InvalidArgument, match="no tokens"):
        pooling.pool(hidden, torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0]]), "mean")


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_token_counts_and_truncation(adapters, name):
    a = adapters[name]
    long_text = " ".join(WORDS * 3)
    texts = [*TEXTS, long_text]
    for max_len in (5, 12, 64):
        counts = a.token_counts(texts, max_len)
        batch = a.encode(texts, max_len)
        assert counts.dtype == np.int64
        assert counts.tolist() == batch.mask.sum(1).tolist()
        assert counts.max() == min(max_len, len(WORDS) * 3 + (2 if name == "bert" else 0))
        assert batch.mask.shape[1] == counts.max()
    with pytest.raises(InvalidArgument, match="exceeds"):
        a.encode(TEXTS, 65)
    with pytest.raises(InvalidArgument, match="list of strings"):
        a.encode("just one string", 8)


def test_empty_text_is_rejected(adapters):
    with pytest.raises(InvalidArgument, match="no tokens"):
        adapters["gpt2"].encode(["the cat", ""], 8)
    assert adapters["gpt2"].token_counts(["the cat", ""], 8).tolist() == [2, 0]


def test_vision_encode(adapters):
    a = adapters["vit"]
    imgs = _images(2)
    b8 = a.encode(imgs, 0)
    x = b8.inputs["pixel_values"]
    assert x.shape == (2, 1, 28, 28) and x.dtype == torch.float32
    assert torch.allclose(x[:, 0], torch.from_numpy(imgs.astype(np.float32) / 255))
    bf = a.encode(imgs[:, None].astype(np.float64) / 255, 0)
    assert torch.allclose(bf.inputs["pixel_values"], x)
    with pytest.raises(InvalidArgument, match="channel"):
        a.encode(np.zeros((2, 3, 28, 28), np.float32), 0)
    with pytest.raises(InvalidArgument, match="28x28"):
        a.encode(np.zeros((2, 1, 14, 14), np.float32), 0)
    with pytest.raises(InvalidArgument, match="float or uint8"):
        a.encode(np.zeros((2, 28, 28), np.int32), 0)
    with pytest.raises(InvalidArgument, match="vision"):
        a.token_counts(["a"], 4)


# ---- digest -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_digest_stable_across_save_load(tmp_path, adapters, folders, name):
    model, tok = _build(name)  # same seed: the same weights as the saved folder
    assert model_digest(model) == adapters[name].digest
    again = tmp_path / "again"
    adapters[name].model.save_pretrained(again)
    if tok is not None:
        tok.save_pretrained(again)
    assert ModelAdapter.load(again).digest == adapters[name].digest
    assert model_digest(model) == model_digest(model)


def test_digest_changes_with_one_weight_and_config(folders):
    model, _ = _build("llama")
    base = model_digest(model)
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight[3, 5] += 1e-3
    assert model_digest(model) != base
    model2, _ = _build("llama")
    model2.config.rms_norm_eps = 1e-5
    assert model_digest(model2) != base
    model3, _ = _build("llama")  # load-time config keys do not count
    model3.config._name_or_path = "/somewhere/else"
    model3.config.architectures = ["LlamaForCausalLM"]
    assert model_digest(model3) == base


def test_digest_hashes_tied_weights_once():
    model, _ = _build("gpt2")  # GPT-2 ties lm_head to wte
    sd = model.state_dict()
    assert sd["lm_head.weight"].data_ptr() == sd["transformer.wte.weight"].data_ptr()
    seen = []
    real = introspection._canonical_json

    def spy(value):
        if isinstance(value, dict) and "nbytes" in value:
            seen.append(value["name"])
        return real(value)

    introspection._canonical_json = spy
    try:
        model_digest(model)
    finally:
        introspection._canonical_json = real
    assert "lm_head.weight" in seen and "transformer.wte.weight" not in seen
    assert len(seen) == len(set(seen)) == len(sd) - 1


# ---- failures ---------------------------------------------------------------------------------


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_corrupt_folders_raise_invalid_argument(tmp_path, folders):
    from safetensors.torch import load_file, save_file

    truncated = _copy(folders["llama"], tmp_path / "truncated")
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(InvalidArgument, match="cannot load the model weights"):
        ModelAdapter.load(truncated)

    missing = _copy(folders["llama"], tmp_path / "missing")
    sd = load_file(missing / "model.safetensors")
    del sd["model.layers.0.mlp.down_proj.weight"]
    save_file(sd, missing / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(InvalidArgument, match="missing_keys: model.layers.0.mlp.down_proj.weight"):
        ModelAdapter.load(missing)

    no_weights = _copy(folders["bert"], tmp_path / "no_weights")
    (no_weights / "model.safetensors").unlink()
    with pytest.raises(InvalidArgument):
        ModelAdapter.load(no_weights)

    bad_config = _copy(folders["bert"], tmp_path / "bad_config")
    (bad_config / "config.json").write_text("{not json")
    with pytest.raises(InvalidArgument, match="config"):
        ModelAdapter.load(bad_config)

    unknown = _copy(folders["bert"], tmp_path / "unknown_arch")
    cfg = json.loads((unknown / "config.json").read_text())
    cfg["architectures"] = ["NoSuchModelForAnything"]
    (unknown / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InvalidArgument, match="NoSuchModelForAnything"):
        ModelAdapter.load(unknown)

    unknown_type = _copy(folders["bert"], tmp_path / "unknown_type")
    cfg["architectures"] = ["BertModel"]
    cfg["model_type"] = "no-such-type"
    (unknown_type / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InvalidArgument, match="config"):
        ModelAdapter.load(unknown_type)

    no_tok = _copy(folders["gpt2"], tmp_path / "no_tokenizer")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (no_tok / f).unlink()
    with pytest.raises(InvalidArgument, match="no tokenizer"):
        ModelAdapter.load(no_tok)

    with pytest.raises(InvalidArgument, match="no config.json"):
        ModelAdapter.load(tmp_path / "does-not-exist")

    with pytest.raises(InvalidArgument, match="device"):
        ModelAdapter.load(folders["bert"], device="no-such-device")


# ---- real packaged models (slow) ----------------------------------------------------------------


@pytest.mark.slow
def test_real_minilm(tmp_path):
    a = ModelAdapter.load(resolve_model_source("minilm-l6", tmp_path))
    assert (a.kind, a.arch, a.num_layers, a.hidden_size) == ("encoder", "BertModel", 6, 384)
    assert a.lens_head() is None
    texts = ["A man is playing a guitar.", "The weather is lovely today, isn't it?"]
    batch = a.encode(texts, 128)
    hidden = a.hidden_states(batch)
    assert hidden.shape == (7, 2, batch.mask.shape[1], 384)
    with torch.no_grad():
        ref = a.model(**batch.inputs).last_hidden_state
    assert torch.equal(hidden[-1], ref)  # BERT has no final norm: layer L is last_hidden_state
    assert a.token_counts(texts, 128).tolist() == batch.mask.sum(1).tolist()
    # sentence-transformers' embedding is the normalised mean pool: similar sentences score higher
    emb = torch.nn.functional.normalize(a.pool(hidden, batch.mask, "mean")[-1], dim=-1)
    query = a.encode(["Someone plays the guitar."], 128)
    e2 = torch.nn.functional.normalize(
        a.pool(a.hidden_states(query), query.mask, "mean")[-1], dim=-1
    )
    assert float(emb[0] @ e2[0]) > float(emb[1] @ e2[0]) + 0.2


@pytest.fixture
def big_tmp(tmp_path):
    """A temp dir removed at teardown: pytest keeps old temp dirs, and this one holds 540 MB."""
    import shutil

    yield tmp_path
    shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.mark.slow
def test_real_smollm2_dequantise_cache_and_lens(big_tmp):
    import time

    tmp_path = big_tmp

    t0 = time.time()
    folder = resolve_model_source("smollm2-135m", tmp_path)
    build_s = time.time() - t0
    assert (folder / "model.safetensors").is_file() and (folder / "config.json").is_file()
    assert not list(tmp_path.glob(".*tmp*"))
    t0 = time.time()
    assert resolve_model_source("smollm2-135m", tmp_path) == folder
    assert time.time() - t0 < 1.0 < build_s
    a = ModelAdapter.load(folder)
    assert (a.kind, a.arch, a.num_layers, a.hidden_size) == (
        "causal-lm",
        "LlamaForCausalLM",
        30,
        576,
    )
    source = json.loads((folder / "actstore_source.json").read_text())
    assert source["digest"] == a.digest  # GGUF-loaded and reloaded weights hash the same
    head = a.lens_head()
    assert head.norm == "rmsnorm" and head.weight.shape == (49152, 576)
    texts = ["The capital of France is", "Once upon a time, there was a little girl who"]
    batch = a.encode(texts, 32)
    hidden = a.hidden_states(batch)
    assert hidden.shape == (31, 2, batch.mask.shape[1], 576)
    with torch.no_grad():
        out = a.model(**batch.inputs, output_hidden_states=True)
    assert not torch.allclose(hidden[-1], out.hidden_states[-1], atol=1e-2)
    logits = a.head_logits(hidden[-1])
    scale = float(out.logits.abs().max())
    assert float((logits - out.logits).abs().max()) <= 1e-5 * max(1.0, scale)
    last = a.pool(hidden, batch.mask, "last")
    top = a.head_logits(last[-1]).argmax(-1)
    assert a.tokenizer.decode(top[0]).strip() == "Paris"


def test_the_old_torch_lens_module_name_still_imports_with_a_warning(monkeypatch):
    """`actstore.modeling.lens_head` was renamed `torch_lens` (beside `actstore.metrics.lens_head`)."""
    import importlib
    import sys

    monkeypatch.delitem(sys.modules, "actstore.modeling.lens_head", raising=False)
    with pytest.warns(DeprecationWarning, match="actstore.modeling.torch_lens"):
        old = importlib.import_module("actstore.modeling.lens_head")
    assert old.TorchLensHead is TorchLensHead
