"""Registering models and datasets: what a name may point to."""

from __future__ import annotations

import pytest

from actstore.errors import AlreadyExists, InvalidArgument


def named(client, name: str):
    return next(d for d in client.datasets() if name in d.aliases)


def test_a_dataset_name_is_not_moved_to_other_samples(client):
    first = client.register_dataset(texts=["a cat", "a dog", "a bird"], name="pets")
    assert client.register_dataset(texts=["a cat", "a dog", "a bird"], name="pets").digest == first.digest
    with pytest.raises(AlreadyExists) as info:
        client.register_dataset(texts=["a cow", "a hen"], name="pets")
    message = str(info.value)
    assert f"'pets' already names dataset {first.digest[:12]} (3 samples)" in message, message
    assert "(2 samples): register it under another --name (e.g. pets-2)" in message, message
    assert named(client, "pets").digest == first.digest  # unchanged
    assert len(client.datasets()) == 1  # and nothing else stored
    other = client.register_dataset(texts=["a cow", "a hen"], name="pets-2")
    assert other.digest != first.digest and named(client, "pets").digest == first.digest


def test_a_builtin_dataset_of_another_size_needs_its_own_name(client):
    client.register_dataset(builtin="rotten-tomatoes", limit=20)
    with pytest.raises(AlreadyExists, match=r"'rotten-tomatoes' already names .*\(20 samples\).*\(12 samples\)"):
        client.register_dataset(builtin="rotten-tomatoes", limit=12)
    assert client.register_dataset(builtin="rotten-tomatoes", limit=12, name="rt12").n == 12
    assert named(client, "rotten-tomatoes").n == 20


def test_two_dataset_sources_are_refused(client, tmp_path):
    texts = tmp_path / "t.csv"
    texts.write_text("text\nhello\n")
    with pytest.raises(InvalidArgument, match="give exactly one dataset source"):
        client.register_dataset(texts, builtin="rotten-tomatoes", limit=5)
    with pytest.raises(InvalidArgument, match="give exactly one dataset source"):
        client.register_dataset(texts, texts=["x"])
    assert len(client.datasets()) == 0


def test_two_model_sources_are_refused(client, tiny_models):
    with pytest.raises(InvalidArgument, match="give exactly one of a model folder path or a builtin name"):
        client.register_model(tiny_models["bert"], builtin="minilm-l6")
    assert len(client.models()) == 0
