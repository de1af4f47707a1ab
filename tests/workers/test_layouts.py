"""TokenLayouts: a token-level run's layout from the model's tokenizer, against the tokenizer itself;
kept in the store, read back by model and by tokenizer, computed again when damaged."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import AutoTokenizer

from actstore.errors import InvalidArgument
from actstore.workers.layouts import LAYOUT_FILE, TokenLayouts, model_layout_key, stored_layout
from tests.factories import save_tiny_model, sentences


def test_layout_counts_every_prompts_tokens_and_their_spans(server, client, tiny_models):
    texts = sentences(25, seed=2)
    client.register_model(tiny_models["bert"], name="bert")
    client.register_dataset(texts=texts, name="toy")
    catalog = server.service.catalog
    model, dataset = catalog.models.get("bert"), catalog.datasets.get("toy")
    store = server.service.store
    layouts = TokenLayouts()
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["bert"])

    for max_len in (128, 6):  # the second layout reuses the loaded tokenizer with another limit
        offsets, spans = layouts.rows(store, model.path, dataset.path, max_len)
        counts = [len(tokenizer(text, truncation=True, max_length=max_len)["input_ids"]) for text in texts]
        np.testing.assert_array_equal(offsets, np.concatenate([[0], np.cumsum(counts)]))
        assert offsets.dtype == np.int64 and spans.shape == (offsets[-1], 2)
        first = tokenizer(texts[0], truncation=True, max_length=max_len, return_offsets_mapping=True)
        np.testing.assert_array_equal(spans[:offsets[1]], np.array(first["offset_mapping"]))
    assert layouts.rows(store, model.path, dataset.path, 128, spans=False)[1] is None


def test_a_model_without_tokenizer_or_a_dataset_of_images_is_refused(server, client, tiny_models, tmp_path):
    client.register_model(tiny_models["bert"], name="bert")
    client.register_model(tiny_models["vit"], name="vit")
    client.register_dataset(texts=sentences(4), name="toy")
    np.savez(tmp_path / "images.npz", x=np.zeros((4, 28, 28), dtype=np.float32), y=np.arange(4) % 2)
    client.register_dataset(str(tmp_path / "images.npz"), name="pictures")
    catalog = server.service.catalog
    layouts, store = TokenLayouts(), server.service.store
    with pytest.raises(InvalidArgument, match="needs a text model with a tokenizer"):
        layouts.rows(store, catalog.models.get("vit").path, catalog.datasets.get("toy").path, 16)
    with pytest.raises(InvalidArgument, match="needs a text dataset"):
        layouts.rows(store, catalog.models.get("bert").path, catalog.datasets.get("pictures").path, 16)


def test_a_layout_is_kept_in_the_store_and_read_back_by_model_and_by_tokenizer(server, client, tiny_models,
                                                                               tmp_path):
    """The first layout is kept under the model's key and the tokenizer's; a model with the same
    tokenizer files and other weights (a training checkpoint) gets it without tokenising."""
    client.register_model(tiny_models["bert"], name="bert")
    client.register_model(save_tiny_model("bert", tmp_path / "bert-other-weights", seed=7), name="bert-other")
    client.register_dataset(texts=sentences(30, seed=3), name="toy")
    catalog, store = server.service.catalog, server.service.store
    model, other, dataset = catalog.models.get("bert"), catalog.models.get("bert-other"), catalog.datasets.get("toy")
    assert model.digest != other.digest
    offsets, spans = TokenLayouts().rows(store, model.path, dataset.path, 64)
    kept_offsets, kept_spans = stored_layout(store.files, model_layout_key(model.path, dataset.path, 64, True))
    np.testing.assert_array_equal(kept_offsets, offsets)
    np.testing.assert_array_equal(kept_spans, spans)

    fresh = TokenLayouts()
    again = fresh.rows(store, other.path, dataset.path, 64)
    assert not fresh._tokenizers  # never loaded a tokenizer: the layout came from the store
    np.testing.assert_array_equal(again[0], offsets)
    np.testing.assert_array_equal(again[1], spans)
    assert stored_layout(store.files, model_layout_key(other.path, dataset.path, 64, True)) is not None


def test_a_damaged_stored_layout_is_computed_again(server, client, tiny_models):
    client.register_model(tiny_models["bert"], name="bert")
    client.register_dataset(texts=sentences(30, seed=4), name="toy")
    catalog, store = server.service.catalog, server.service.store
    model, dataset = catalog.models.get("bert"), catalog.datasets.get("toy")
    offsets, spans = TokenLayouts().rows(store, model.path, dataset.path, 32)
    key = model_layout_key(model.path, dataset.path, 32, True)
    stored = store.path / key / LAYOUT_FILE
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0x10  # inside the offsets or spans member: its CRC-32 no longer matches
    stored.write_bytes(bytes(data))
    assert stored_layout(store.files, key) is None and not store.files.exists(key)  # removed, to be made again
    ref = server.service.capture_pool.token_rows(model.path, dataset.path, 32)
    import ray

    recomputed = ray.get(ref)
    np.testing.assert_array_equal(recomputed[0], offsets)
    np.testing.assert_array_equal(recomputed[1], spans)
    assert stored_layout(store.files, key) is not None


def test_a_server_lays_out_a_known_model_and_dataset_without_a_tokenizer_process(tmp_path, ray_cluster, tiny_models):
    """A token-level capture on a restarted server of the same store (another dtype: a new run of the
    same layout) takes its layout from the store: the TokenLayouts process is not asked, and its rows
    are the first run's."""
    from actstore.client import Client
    from actstore.server.app import start_server
    from tests.conftest import make_settings

    store = tmp_path / "store"
    runs = []
    for attempt, dtype in enumerate(("float16", "float32")):
        running = start_server(make_settings(store))
        try:
            with Client(f"127.0.0.1:{running.port}") as c:
                if attempt == 0:
                    c.register_model(tiny_models["bert"], name="bert")
                    c.register_dataset(texts=sentences(20, seed=5), name="toy")
                run = c.capture("bert", "toy", pooling="tokens", max_len=24, dtype=dtype)
                runs.append((c.describe(run.run_key).rows, c.read_activations(run.run_key, 2)[0]))
            asked_layouts = running.service.capture_pool.layouts_asked
        finally:
            running.stop()
        assert (asked_layouts > 0) == (attempt == 0)
    assert runs[0][0] == runs[1][0]
    np.testing.assert_allclose(runs[0][1].astype(np.float32), runs[1][1], rtol=2e-3, atol=2e-3)
