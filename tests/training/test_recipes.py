"""Every recipe x method end to end at smoke size; the splits; the recipes' models."""

from __future__ import annotations

import json

import numpy as np
import pytest

from actstore.errors import NotFound
from actstore.store.datasets import load_builtin
from actstore.training.checkpoints import exit_heads
from actstore.training.loop import train
from actstore.training.objectives import METHODS
from actstore.training.recipes import RECIPES, get_recipe

# One combination per recipe stays in the default (fast) run; the rest are marked slow.
FAST = {("vit-fmnist", m) for m in METHODS} | {("gpt2-austen", "multi-exit"), ("minilm-rt", "aligned")}
CASES = [
    pytest.param(r, m, marks=() if (r, m) in FAST else pytest.mark.slow, id=f"{r}-{m}")
    for r in RECIPES
    for m in METHODS
]


@pytest.mark.parametrize("name,method", CASES)
def test_smoke_run_end_to_end(name, method, tmp_path):
    from actstore.modeling.adapter import ModelAdapter

    recipe = get_recipe(name, smoke=True)
    r = train(recipe, method, seed=0, out_dir=tmp_path)
    assert r.finished and r.step == recipe.steps and r.checkpoint is not None
    L = None
    for ckpt in r.checkpoints:
        info = json.loads((ckpt / "checkpoint.json").read_text())
        L = len(info["metrics"]["acc_by_layer"])
        assert all(0.0 <= a <= 1.0 for a in info["metrics"]["acc_by_layer"])
        assert np.isfinite(info["metrics"]["loss"])
    # the checkpoint is a model folder the capture side loads, with a lens head that reproduces
    # the model's own logits (ModelAdapter checks it), and the same digest
    adapter = ModelAdapter.load(r.checkpoint, device="cpu")
    assert adapter.kind == recipe.kind and adapter.num_layers == L
    head = adapter.lens_head()
    assert adapter.digest == r.digest
    heads = exit_heads(r.checkpoint)
    if method == "multi-exit":
        assert sorted(heads) == list(range(1, L + 1))
        for w, b in heads.values():
            assert w.shape == head.weight.shape
            assert (b is None) == (head.bias is None)
        np.testing.assert_array_equal(heads[L][0], head.weight)
    else:
        assert heads is None


def test_recipes_and_smoke_variants():
    assert set(RECIPES) == {"vit-fmnist", "minilm-rt", "gpt2-austen"}
    for name, full in RECIPES.items():
        smoke = get_recipe(name, smoke=True)
        assert smoke.smoke and not full.smoke and smoke.name == full.name == name
        assert smoke.steps < full.steps and smoke.kind == full.kind
        assert get_recipe(name) is full
    with pytest.raises(NotFound):
        get_recipe("resnet")


@pytest.mark.parametrize("name", ["minilm-rt", "gpt2-austen"])
def test_text_splits_are_disjoint_and_eval_is_a_builtin_call(name):
    recipe = get_recipe(name)
    ev, tr = recipe.eval_data(), recipe.train_data()
    assert ev.n == recipe.eval_size
    assert not set(ev.sample_ids) & set(tr.sample_ids)
    src = dict(recipe.eval_source())
    again = load_builtin(src.pop("name"), **src)
    assert again.sample_ids == ev.sample_ids and again.texts == ev.texts


def test_fmnist_eval_is_the_test_split():
    recipe = get_recipe("vit-fmnist")
    ev = recipe.eval_data()
    assert ev.n == recipe.eval_size and ev.images.shape[1:] == (1, 28, 28)
    assert ev.source["split"] == "test"
    assert recipe.train_data().n == 60000


def test_austen_tokenizer_is_deterministic_byte_level_bpe():
    recipe = get_recipe("gpt2-austen", smoke=True)
    train_data = recipe.train_data()
    a, b = recipe.build_tokenizer(train_data), recipe.build_tokenizer(train_data)
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()
    assert len(a) == 320 and a.pad_token == a.eos_token == "<|endoftext|>"
    text = "Mr. Darcy's £10,000 — naïve!"
    assert a.decode(a(text)["input_ids"]) == text  # byte-level: nothing is unknown
