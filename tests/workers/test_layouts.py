"""TokenLayouts: a token-level run's layout from the model's tokenizer, against the tokenizer itself."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import AutoTokenizer

from actstore.errors import InvalidArgument
from actstore.workers.layouts import TokenLayouts
from tests.factories import sentences


def test_layout_counts_every_prompts_tokens_and_their_spans(server, client, tiny_models):
    texts = sentences(25, seed=2)
    client.register_model(tiny_models["bert"], name="bert")
    client.register_dataset(texts=texts, name="toy")
    catalog = server.service.catalog
    model, dataset = catalog.model("bert"), catalog.dataset("toy")
    layouts = TokenLayouts(server.service.store)
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["bert"])

    for max_len in (128, 6):  # the second layout reuses the loaded tokenizer with another limit
        offsets, spans = layouts.rows(model.path, dataset.path, max_len)
        counts = [len(tokenizer(text, truncation=True, max_length=max_len)["input_ids"]) for text in texts]
        np.testing.assert_array_equal(offsets, np.concatenate([[0], np.cumsum(counts)]))
        assert offsets.dtype == np.int64 and spans.shape == (offsets[-1], 2)
        first = tokenizer(texts[0], truncation=True, max_length=max_len, return_offsets_mapping=True)
        np.testing.assert_array_equal(spans[:offsets[1]], np.array(first["offset_mapping"]))
    assert layouts.rows(model.path, dataset.path, 128, spans=False)[1] is None


def test_a_model_without_tokenizer_or_a_dataset_of_images_is_refused(server, client, tiny_models, tmp_path):
    client.register_model(tiny_models["bert"], name="bert")
    client.register_model(tiny_models["vit"], name="vit")
    client.register_dataset(texts=sentences(4), name="toy")
    np.savez(tmp_path / "images.npz", x=np.zeros((4, 28, 28), dtype=np.float32), y=np.arange(4) % 2)
    client.register_dataset(str(tmp_path / "images.npz"), name="pictures")
    catalog = server.service.catalog
    layouts = TokenLayouts(server.service.store)
    with pytest.raises(InvalidArgument, match="needs a text model with a tokenizer"):
        layouts.rows(catalog.model("vit").path, catalog.dataset("toy").path, 16)
    with pytest.raises(InvalidArgument, match="needs a text dataset"):
        layouts.rows(catalog.model("bert").path, catalog.dataset("pictures").path, 16)
