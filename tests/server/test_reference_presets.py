"""`entropy --preset skean2025` through gRPC on a real token-level run, against the port of the
Layer by Layer reference code in tests/metrics/test_entropy_presets.py."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from actstore.errors import InvalidArgument
from tests.metrics.test_entropy_presets import port_curvature, port_dataset_entropy, port_prompt_entropy
from tests.server.test_metric_engine import token_offsets, unique_sentences

TEXTS = unique_sentences(40, seed=21)


@pytest.fixture(scope="module")
def runs(module_client, tiny_models):
    client = module_client
    client.register_model(tiny_models["gpt2"], name="gpt2")
    client.register_dataset(texts=TEXTS, name="presets")
    tokens = client.capture("gpt2", "presets", pooling="tokens").run_key
    pooled = client.capture("gpt2", "presets", pooling="mean").run_key
    return {"tokens": tokens, "pooled": pooled}


def prompts_of(client, run, layer, offsets):
    z = client.read_activations(run, layer)[0].astype(np.float64)
    return [z[a:b] for a, b in pairwise(offsets) if b - a >= 2]


@pytest.mark.parametrize("metric,port", [("dataset_entropy", port_dataset_entropy),
                                         ("prompt_entropy", port_prompt_entropy),
                                         ("curvature", port_curvature)])
def test_preset_matches_the_reference_port(module_client, runs, tiny_models, metric, port):
    client = module_client
    info = client.describe(runs["tokens"])
    offsets = token_offsets(tiny_models, "gpt2", TEXTS, info.max_len)
    assert offsets[-1] == info.rows
    result = client.entropy(metric, runs["tokens"], preset="skean2025", layers=[0, 2, 3])
    expected = [port(prompts_of(client, runs["tokens"], layer, offsets)) for layer in (0, 2, 3)]
    # curvature: two-token prompts sit at arccos(-1), where rounding moves the angle by ~1e-8
    np.testing.assert_allclose(result.values, expected, rtol=1e-9, atol=1e-7 if metric == "curvature" else 1e-10)
    assert result.provenance.options["preset"] == "skean2025"
    assert result.scalars["prompts"] == np.sum(np.diff(offsets) >= 2)
    # the METRICS.md definition (dataset entropy from the mean-pooled run) is a different number
    plain = client.entropy(metric, runs["pooled" if metric == "dataset_entropy" else "tokens"], layers=[0, 2, 3])
    assert plain.provenance.result_key != result.provenance.result_key
    assert np.max(np.abs(plain.values - result.values)) > 1e-6


def test_preset_refusals_say_what_to_do(module_client, runs):
    client = module_client
    with pytest.raises(InvalidArgument, match="--pooling tokens"):
        client.entropy("dataset_entropy", runs["pooled"], preset="skean2025")
    with pytest.raises(InvalidArgument, match="covers dataset_entropy"):
        client.entropy("effective_rank", runs["tokens"], preset="skean2025")
    with pytest.raises(InvalidArgument, match="drop alpha=2.0"):
        client.entropy("dataset_entropy", runs["tokens"], preset="skean2025", alpha=2.0)
    with pytest.raises(InvalidArgument, match="preset"):
        client.entropy("curvature", runs["tokens"], preset="skean2024")
