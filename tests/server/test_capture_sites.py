"""Capture sites end to end: every site of every tiny family (BERT, GPT-2, Llama, ViT) captured
through a real server in one pass, checked against the module outputs a plain PyTorch forward
hook sees on the same model loaded straight from transformers, pooled and token-level."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from actstore.errors import InvalidArgument
from tests.factories import sentences
from tests.server.captured import cancel_after

# the HF module each site names, per family, written out here (not taken from actstore)
MODULES = {
    "bert": {"resid_post": "encoder.layer.{i}", "attn_out": "encoder.layer.{i}.attention.output.dense",
             "mlp_out": "encoder.layer.{i}.output.dense"},
    "gpt2": {"resid_post": "transformer.h.{i}", "attn_out": "transformer.h.{i}.attn",
             "mlp_out": "transformer.h.{i}.mlp", "transformer.h.*.mlp.c_proj": "transformer.h.{i}.mlp.c_proj"},
    "llama": {"resid_post": "model.layers.{i}", "attn_out": "model.layers.{i}.self_attn",
              "mlp_out": "model.layers.{i}.mlp", "model.layers.*.mlp.down_proj": "model.layers.{i}.mlp.down_proj"},
    "vit": {"resid_post": "layers.{i}", "attn_out": "layers.{i}.attention", "mlp_out": "layers.{i}.mlp"},
}
N = 12


def _hf_model(folder):
    import transformers

    config = transformers.AutoConfig.from_pretrained(folder)
    return getattr(transformers, config.architectures[0]).from_pretrained(folder).eval()


def _reference(folder, family, inputs, site):
    """(L+1, s, d) per sample: layer 0 = the embedding output (hidden_states[0]), layer i+1 = the
    output of the site's module in block i, seen by a plain forward hook; one sample at a time."""
    from transformers import AutoTokenizer

    model = _hf_model(folder)
    seen = {}
    hooks = [model.get_submodule(MODULES[family][site].format(i=i)).register_forward_hook(
        lambda m, a, o, i=i: seen.__setitem__(i, o[0] if isinstance(o, tuple) else o)) for i in range(3)]
    tok = AutoTokenizer.from_pretrained(folder) if family != "vit" else None
    states = []
    with torch.no_grad():
        for x in inputs:
            enc = tok([x], return_tensors="pt") if tok else {"pixel_values": torch.from_numpy(x[None, None])}
            out = model(**enc, output_hidden_states=True)
            states.append(torch.stack([out.hidden_states[0][0], *(seen[i][0] for i in range(3))]).numpy())
    for hook in hooks:
        hook.remove()
    return states


def _stored(client, run, rows=None):
    return np.stack([client.read_activations(run, layer)[0] for layer in range(4)], axis=1)


@pytest.fixture(scope="module")
def data(module_client, tiny_models, tmp_path_factory):
    texts = sentences(N, seed=5)
    images = np.random.default_rng(0).random((N, 28, 28), dtype=np.float32)
    path = tmp_path_factory.mktemp("images") / "images.npz"
    np.savez(path, x=images, y=np.arange(N) % 2)
    for family in MODULES:
        module_client.register_model(tiny_models[family], name=family)
    module_client.register_dataset(texts=texts, name="texts")
    module_client.register_dataset(str(path), name="images")
    return {"texts": texts, "images": images}


@pytest.mark.parametrize(("family", "pooling"), [("bert", "mean"), ("gpt2", "last"), ("llama", "mean"),
                                                  ("vit", "mean"), ("bert", "tokens"), ("gpt2", "tokens"),
                                                  ("llama", "tokens")])
def test_every_site_matches_a_plain_forward_hook(module_client, data, tiny_models, family, pooling):
    sites = list(MODULES[family])
    dataset = "images" if family == "vit" else "texts"
    result = module_client.capture(family, dataset, pooling=pooling, dtype="float32", site=sites)
    assert list(result.runs) == sites and len(set(result.runs.values())) == len(sites)
    inputs = data["images"] if family == "vit" else data["texts"]
    for site, key in result.runs.items():
        run = module_client.describe(key)
        assert (run.status, run.site, run.num_layers) == ("committed", site, 3)
        reference = _reference(tiny_models[family], family, inputs, site)
        if pooling == "tokens":
            expected = np.concatenate([r.transpose(1, 0, 2) for r in reference])  # (tokens, L+1, d)
        else:
            expected = np.stack([r[:, -1] if pooling == "last" else r.mean(axis=1) for r in reference])
        np.testing.assert_allclose(_stored(module_client, key), expected, rtol=1e-4, atol=1e-5,
                                   err_msg=f"{family} {site} {pooling}")
    # layer 0 is the embedding output for every site
    firsts = [module_client.read_activations(key, 0)[0] for key in result.runs.values()]
    for first in firsts[1:]:
        np.testing.assert_array_equal(first, firsts[0])


def test_resid_post_is_the_default_and_keeps_its_key(module_client, data):
    plain = module_client.capture("bert", "texts", pooling="cls")
    named = module_client.capture("bert", "texts", pooling="cls", site="resid_post")
    both = module_client.capture("bert", "texts", pooling="cls", site="resid_post,mlp_out")
    assert named.cache_hit and named.run_key == plain.run_key == both.runs["resid_post"]
    assert not both.cache_hit and both.runs["mlp_out"] != plain.run_key
    again = module_client.capture("bert", "texts", pooling="cls", site=["mlp_out", "resid_post"])
    assert again.cache_hit and again.runs == {"mlp_out": both.runs["mlp_out"], "resid_post": plain.run_key}
    listed = module_client.runs("bert", "texts", site="mlp_out")
    assert both.runs["mlp_out"] in {r.run_key for r in listed} and {r.site for r in listed} == {"mlp_out"}
    assert module_client.describe(both.runs["mlp_out"]).site_modules == "encoder.layer.*.output.dense"


def test_a_request_is_resolved_once_pooling_and_sites_included(module_server, data):
    """The servicer reads the wire once through the CAPTURE table (the sites parsed, the pooling left
    to the model); `CaptureJobs.target` decides the rest once: the capture and its dry run read it."""
    from actstore._proto.actstore.v1 import actstore_pb2 as pb
    from actstore.server.servicer import capture_request

    request = capture_request(pb.CaptureRequest(model="gpt2", dataset="texts",
                                                sites=["mlp_out, attn_out", "mlp_out", ""]))
    assert (request.pooling, request.dtype, request.max_len, request.sites) == \
        (None, "float16", None, ("mlp_out", "attn_out"))
    service = module_server.service
    target = service.captures.target(request)
    gpt2 = service.catalog.models.get("gpt2")
    assert (target.pooling, target.dtype, target.sites) == ("last", "float16", ["mlp_out", "attn_out"])
    assert target.max_len == min(service.settings.default_max_len, gpt2.max_positions or 1 << 30)
    assert all((spec["pooling"], spec["max_len"]) == ("last", target.max_len) for spec in target.specs)
    bert = service.captures.target(capture_request(pb.CaptureRequest(model="bert", dataset="texts", sites=[""])))
    assert (bert.pooling, bert.sites) == ("cls", ["resid_post"])


def test_layer_statistics_are_those_of_the_stored_values(module_client, data):
    result = module_client.capture("gpt2", "texts", pooling="mean", site="attn_out")
    run = module_client.describe(result.run_key)
    values = _stored(module_client, result.run_key).astype(np.float64)  # float16 widened
    for h in run.health:
        x = values[:, h.layer, :]
        norms = np.linalg.norm(x, axis=1)
        np.testing.assert_allclose([h.mean, h.std, h.norm_mean, h.norm_std],
                                   [x.mean(), x.std(), norms.mean(), norms.std()], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(("site", "message"), [
    ("model.layrs.*.mlp", r"matches no module of LlamaForCausalLM; close matches: model\.layers\.\*\.mlp"),
    ("model.layers.*.mlp.up_proj", r"outputs 32 features, not the hidden size 16"),
    ("model.layers.0.mlp", r"has no `\*`"),
    ("lm_head", r"has no `\*`"),
])
def test_a_bad_site_is_invalid_argument(module_client, data, site, message):
    with pytest.raises(InvalidArgument, match=message):
        module_client.submit_capture("llama", "texts", site=site)


def test_a_multi_site_capture_resumes_and_single_sites_join_it(module_client, data):
    client = module_client
    client.register_dataset(texts=sentences(400, seed=11), name="bigger")
    job = client.submit_capture("bert", "bigger", site="resid_post,attn_out")
    runs = dict(zip(job.sites, job.run_keys))
    joined = client.submit_capture("bert", "bigger", site="attn_out")  # its run is being captured: join
    assert joined.joined and joined.job_id == job.job_id
    cancel_after(client, job.job_id)
    partial = [client.describe(key) for key in runs.values()]
    assert all(p.status == "running" and 0 < p.recorded_shards < p.num_shards for p in partial)
    resumed = client.submit_capture("bert", "bigger", site="resid_post,attn_out")
    assert resumed.job_id != job.job_id and dict(zip(resumed.sites, resumed.run_keys)) == runs
    first = next(s for s in client.watch(resumed.job_id) if s.total)
    assert first.done >= min(p.recorded_shards for p in partial), "stored shards must not be computed again"
    client.wait(resumed.job_id)
    assert all(client.describe(key).recorded_shards == 50 for key in runs.values())
    # the same numbers as a capture of one site alone
    alone = client.capture("bert", "bigger", site="mlp_out,attn_out")  # attn_out stored: only mlp_out runs
    assert alone.job.target == alone.runs["mlp_out"] and alone.runs["attn_out"] == runs["attn_out"]
    values = client.read_activations(runs["attn_out"], 2)[0]
    client.delete_run(runs["attn_out"])
    again = client.capture("bert", "bigger", site="attn_out")
    assert again.run_key == runs["attn_out"]
    np.testing.assert_array_equal(client.read_activations(again.run_key, 2)[0], values)


def test_too_many_sites_are_refused(module_client, data):
    with pytest.raises(InvalidArgument, match="17 sites in one capture: at most 16"):
        module_client.submit_capture("llama", "texts", site=[f"model.layers.*.s{i}" for i in range(17)])
