"""The packaged real models through the whole service: MiniLM-L6 always, SmolLM2 when slow tests run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.formulas import cka_numpy


def test_real_minilm_capture_and_cka(client):
    model = client.register_model(builtin="minilm-l6")
    assert (model.kind, model.num_layers, model.hidden_size) == ("encoder", 6, 384)
    client.register_dataset(builtin="rotten-tomatoes", limit=32, name="rt32")
    run = client.capture("minilm-l6", "rt32", pooling="mean").run_key
    layers = [client.read_activations(run, layer)[0] for layer in range(7)]
    cka = client.cka(run)
    np.testing.assert_allclose(cka.biased, [[cka_numpy(a, b) for b in layers] for a in layers], atol=1e-9)
    assert client.capture("minilm-l6", "rt32", pooling="mean").cache_hit


@pytest.mark.slow
def test_real_smollm2_lens_layer_L_is_the_models_own_prediction(server, client):
    """Lens layer L through the stored head equals SmolLM2's own next-token accuracy."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = client.register_model(builtin="smollm2-135m")
    assert (model.kind, model.num_layers, model.hidden_size) == ("causal-lm", 30, 576)
    texts = ["The capital of France is Paris, and the capital of Italy is Rome.",
             "It was the best of times, it was the worst of times."]
    client.register_dataset(texts=texts, name="two")
    run = client.capture("smollm2-135m", "two", pooling="tokens", max_len=32).run_key
    lens = client.lens(run)
    folder = server.service.store.path / "models" / model.digest
    tok = AutoTokenizer.from_pretrained(folder)
    lm = AutoModelForCausalLM.from_pretrained(folder).eval()
    correct = total = 0
    with torch.no_grad():
        for text in texts:
            ids = tok(text, return_tensors="pt", truncation=True, max_length=32)["input_ids"]
            predicted = lm(ids).logits[0, :-1].argmax(-1)
            correct += int((predicted == ids[0, 1:]).sum())
            total += ids.shape[1] - 1
    assert lens.n == total
    assert lens.accuracy[-1] == pytest.approx(correct / total, abs=1e-12)
    assert lens.saturation_counts.sum() == total
