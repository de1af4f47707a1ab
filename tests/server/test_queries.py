"""Similarity queries through gRPC against independent float64 numpy formulas."""

from __future__ import annotations

import numpy as np
import pytest

from actstore.errors import FailedPrecondition, InvalidArgument, NotFound
from tests.factories import sentences
from tests.formulas import cka_numpy, debiased_numpy


@pytest.fixture(scope="module")
def client(module_client):
    return module_client


@pytest.fixture(scope="module")
def runs(client, tiny_models):
    client.register_model(tiny_models["bert"], name="bert")
    client.register_model(tiny_models["gpt2"], name="gpt2")
    client.register_model(tiny_models["bert24"], name="bert24")
    client.register_dataset(texts=sentences(60, seed=11), name="toy")
    return {name: client.capture(name, "toy", pooling="mean").run_key for name in ("bert", "gpt2", "bert24")}


def layers_of(client, run):
    info = client.describe(run)
    return [client.read_activations(run, layer)[0] for layer in range(info.num_layers + 1)]


def test_cka_matrix_within_and_across_models(client, runs):
    bert, gpt2 = layers_of(client, runs["bert"]), layers_of(client, runs["gpt2"])
    within = client.cka(runs["bert"])
    assert within.biased.shape == (4, 4) and within.n == 60
    expected = np.array([[cka_numpy(a, b) for b in bert] for a in bert])
    np.testing.assert_allclose(within.biased, expected, atol=1e-9)
    np.testing.assert_allclose(np.diag(within.biased), 1.0, atol=1e-12)
    cross = client.cka(runs["bert"], runs["gpt2"], layers_a=[1, 3], layers_b=[0, 2, 3])
    assert cross.layers_a == [1, 3] and cross.layers_b == [0, 2, 3]
    np.testing.assert_allclose(cross.biased, [[cka_numpy(bert[i], gpt2[j]) for j in (0, 2, 3)] for i in (1, 3)],
                               atol=1e-9)
    np.testing.assert_allclose(cross.debiased,
                               [[debiased_numpy(bert[i], gpt2[j]) for j in (0, 2, 3)] for i in (1, 3)], atol=1e-9)
    # symmetry through the service: B vs A is the transpose
    back = client.cka(runs["gpt2"], runs["bert"], layers_a=[0, 2, 3], layers_b=[1, 3])
    np.testing.assert_allclose(back.biased, cross.biased.T, atol=1e-12)


def test_single_pair_and_cache(client, runs):
    first = client.cka(runs["bert"], runs["bert24"], layers_a=[2], layers_b=[3])
    assert first.biased.shape == (1, 1) and not first.provenance.cached
    again = client.cka(runs["bert"], runs["bert24"], layers_a=[2], layers_b=[3])
    assert again.provenance.cached and again.provenance.result_key == first.provenance.result_key
    np.testing.assert_array_equal(again.biased, first.biased)
    refreshed = client.cka(runs["bert"], runs["bert24"], layers_a=[2], layers_b=[3], refresh=True)
    assert not refreshed.provenance.cached
    np.testing.assert_allclose(refreshed.biased, first.biased, atol=1e-12)
    assert first.provenance.run_keys == [runs["bert"], runs["bert24"]]
    assert first.provenance.metric == "linear_cka" and first.provenance.definition_version == 1


def test_a_call_through_its_sub_client_is_the_same_call(client, runs):
    """`client.cka(...)` is `client.queries.cka(...)` (and so for every area): the same answers."""
    top = client.cka(runs["bert"], runs["gpt2"], layers_a=[1, 2], layers_b=[3])
    sub = client.queries.cka(runs["bert"], runs["gpt2"], layers_a=[1, 2], layers_b=[3])
    np.testing.assert_array_equal(top.biased, sub.biased)
    assert top.provenance.result_key == sub.provenance.result_key
    assert client.describe(runs["bert"]) == client.catalog.describe(runs["bert"])
    assert [r.run_key for r in client.runs(model="bert")] == [r.run_key for r in client.catalog.runs(model="bert")]
    top_rows, top_ids = client.read_activations(runs["bert"], 2, 0, 7)
    sub_rows, sub_ids = client.readers.read_activations(runs["bert"], 2, 0, 7)
    np.testing.assert_array_equal(top_rows, sub_rows)
    assert top_ids == sub_ids
    top_job = client.captures.capture("bert", "toy", pooling="mean").job  # a cache hit, as the fixture's
    assert top_job.cache_hit and client.capture("bert", "toy", pooling="mean").run_key == runs["bert"]


@pytest.mark.parametrize("center", ["global-mean", "none"])
def test_cos_matches_numpy(client, runs, center):
    layers = [x.astype(np.float64) for x in layers_of(client, runs["bert"])]
    result = client.cos(runs["bert"], center=center)
    if center == "global-mean":
        layers = [x - x.mean(0) for x in layers]

    def cos(a, b):
        return np.sum(a * b, 1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))

    expected = np.array([[cos(a, b).mean() for b in layers] for a in layers])
    np.testing.assert_allclose(result.mean, expected, atol=1e-9)
    median = result.quantiles[1, 3, list(result.quantile_levels).index(0.5)]
    assert abs(median - np.median(cos(layers[1], layers[3]))) <= 2 / 4000 + 1e-12
    np.testing.assert_allclose(result.quantiles[..., 0], [[cos(a, b).min() for b in layers] for a in layers],
                               atol=1e-9)


def test_query_errors(client, runs, tiny_models):
    with pytest.raises(NotFound, match="unknown run"):
        client.cka("ffffffffffff")
    with pytest.raises(InvalidArgument, match="layer 9 is out of range.*layers 0..3"):
        client.cka(runs["bert"], layers_a=[9])
    with pytest.raises(InvalidArgument, match=r"widths must match \(16 != 24\)"):
        client.cos(runs["bert"], runs["bert24"])
    client.register_dataset(texts=sentences(60, seed=11), sample_ids=[f"other-{i}" for i in range(60)],
                            name="renamed")
    other = client.capture("bert", "renamed", pooling="mean").run_key
    with pytest.raises(InvalidArgument, match="position 0.*'row:0'.*'other-0'"):
        client.cka(runs["bert"], other)


def test_nan_and_inf_are_reported_not_averaged(client, tmp_path, tiny_models):
    """An embedding scaled past float16's range overflows to Inf in storage: recorded per chunk,
    shown by describe, and refused by queries that touch the layer."""
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(tiny_models["bert"])
    with torch.no_grad():
        model.encoder.layer[1].output.LayerNorm.weight.fill_(1e6)
    path = tmp_path / "overflowing"
    model.save_pretrained(path)
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(tiny_models["bert"]).save_pretrained(path)
    client.register_model(path, name="overflowing")
    client.register_dataset(texts=sentences(20), name="few")
    run = client.capture("overflowing", "few").run_key
    info = client.describe(run)
    assert info.status == "committed"
    bad = {h.layer: h.inf_count for h in info.health if h.inf_count}
    assert 2 in bad and bad[2] > 0
    with pytest.raises(FailedPrecondition, match="layer 2 holds 0 NaN and [1-9][0-9]* Inf"):
        client.cka(run)
    assert client.cka(run, layers_a=[0, 1], layers_b=[0, 1]).biased.shape == (2, 2)


def test_query_on_running_run_is_failed_precondition(client, tiny_models):
    client.register_dataset(texts=sentences(400, seed=2), name="big")
    job = client.submit_capture("bert", "big")
    with pytest.raises(FailedPrecondition, match="not committed"):
        client.cka(job.target)
    assert client.wait(job.job_id).status == "done"
