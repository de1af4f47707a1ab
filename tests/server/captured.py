"""What the capture tests share: an independent reference forward, the registered tiny models and
dataset, and every layer of a run read back."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.factories import sentences


def reference_pooled(model_dir, texts, pooling, max_len=128):
    """All hidden states straight from transformers, pooled by hand (independent of the adapter).
    Layer L is the last block's output before any final norm (a forward hook)."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModel.from_pretrained(model_dir).eval()
    blocks = model.encoder.layer if hasattr(model, "encoder") else model.h
    captured = {}
    hook = blocks[-1].register_forward_hook(
        lambda m, i, o: captured.__setitem__("last", o[0] if isinstance(o, tuple) else o))
    rows = []
    with torch.no_grad():
        for text in texts:
            enc = tok([text], return_tensors="pt", truncation=True, max_length=max_len)
            hs = list(model(**enc, output_hidden_states=True).hidden_states)
            hs[-1] = captured["last"]
            h = torch.stack(hs)[:, 0]  # (L+1, s, d)
            rows.append({"cls": h[:, 0], "last": h[:, -1], "mean": h.mean(1)}[pooling])
    hook.remove()
    return torch.stack(rows).numpy()  # (n, L+1, d)



def register_toy(client, tiny_models) -> list[str]:
    """bert, gpt2 and the 40-text dataset 'toy' registered; its texts."""
    texts = sentences(40)
    labels = [i % 3 for i in range(40)]
    client.register_model(tiny_models["bert"], name="bert")
    client.register_model(tiny_models["gpt2"], name="gpt2")
    client.register_dataset(texts=texts, labels=labels, name="toy")
    return texts


@pytest.fixture(name="registered")
def registered_fixture(client, tiny_models):
    return register_toy(client, tiny_models)


@pytest.fixture(name="module_registered", scope="module")
def module_registered_fixture(module_client, tiny_models):
    """`registered` on the module's server: for tests whose captures no other test of the module makes."""
    return register_toy(module_client, tiny_models)



def read_all(client, run, num_layers):
    return np.stack([client.read_activations(run, layer)[0] for layer in range(num_layers + 1)], axis=1)


def cancel_after(client, job_id: str, shards: int = 3) -> None:
    """Cancel a capture job once `shards` shards are done, and see it end cancelled."""
    for state in client.watch(job_id):
        if state.done >= shards:
            client.cancel(job_id)
            break
    with pytest.raises(Exception, match="cancelled"):
        client.wait(job_id)
