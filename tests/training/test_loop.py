"""The training loop: checkpoints, lineage, digests, resume, determinism, alternating steps."""

from __future__ import annotations

import functools
import itertools
import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from actstore.errors import AlreadyExists, InvalidArgument
from actstore.training import checkpoints, loop
from actstore.training.checkpoints import exit_heads, list_checkpoints
from actstore.training.loop import batch_indices, learning_rate, train
from actstore.training.recipes import build_vit, get_recipe


class Crash(Exception):
    pass


@pytest.fixture(scope="module")
def tiny():
    """vit-fmnist at smoke size, with dropout so that resuming must restore the RNG."""
    return replace(
        get_recipe("vit-fmnist", smoke=True),
        model_builder=functools.partial(
            build_vit, hidden_size=16, num_layers=3, num_heads=2, intermediate_size=32,
            patch_size=7, dropout=0.1,
        ),
        batch_size=16,
        steps=6,
        checkpoint_every=2,
        train_limit=100,  # 6 steps x 16 rows cross an epoch boundary
        eval_size=32,
    )


def state_dict_of(ckpt):
    from safetensors.torch import load_file

    return load_file(str(ckpt / "model.safetensors"))


def assert_same_weights(a, b):
    sa, sb = state_dict_of(a), state_dict_of(b)
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


# ---------------------------------------------------------------------------------------------
# pure helpers
# ---------------------------------------------------------------------------------------------


def test_batches_are_seeded_epoch_permutations():
    n, bs = 10, 4
    rows = np.concatenate([batch_indices(3, t, n, bs) for t in range(1, 6)])  # 20 rows = 2 epochs
    assert sorted(rows[:10].tolist()) == list(range(10))
    assert sorted(rows[10:].tolist()) == list(range(10))
    assert not np.array_equal(rows[:10], rows[10:])
    assert np.array_equal(batch_indices(3, 4, n, bs), batch_indices(3, 4, n, bs))
    assert not np.array_equal(batch_indices(3, 1, n, bs), batch_indices(4, 1, n, bs))


def test_learning_rate_warmup_then_cosine():
    assert learning_rate(1, 100, 1.0, 10) == pytest.approx(0.1)
    assert learning_rate(10, 100, 1.0, 10) == pytest.approx(1.0)
    assert learning_rate(55, 100, 1.0, 10) == pytest.approx(0.5)
    assert learning_rate(100, 100, 1.0, 10) == pytest.approx(0.0, abs=1e-12)
    lrs = [learning_rate(t, 100, 1.0, 10) for t in range(10, 101)]
    assert all(a >= b for a, b in itertools.pairwise(lrs))


# ---------------------------------------------------------------------------------------------
# checkpoints
# ---------------------------------------------------------------------------------------------


def test_checkpoints_lineage_and_digest_round_trip(tiny, tmp_path):
    from transformers import ViTForImageClassification

    from actstore.modeling.adapter import ModelAdapter
    from actstore.modeling.introspection import model_digest

    seen = []
    r = train(tiny, "aligned", seed=1, out_dir=tmp_path, progress=lambda s, t, m: seen.append((s, t, m)))
    assert r.finished and r.step == 6 and r.total_steps == 6 and r.resumed_from is None
    assert [p.name for p in r.checkpoints] == ["step-2", "step-4", "step-6"]
    assert r.new_checkpoints == r.checkpoints == list_checkpoints(tmp_path)
    assert [s for s, _, _ in seen] == list(range(1, 7)) and all(t == 6 for _, t, _ in seen)
    assert [s for s, _, m in seen if "checkpoint" in m] == [2, 4, 6]
    assert not list(tmp_path.glob(".step-*"))  # no temp folder left behind

    parents = [None, "step-2", "step-4"]
    for ckpt, parent in zip(r.checkpoints, parents):
        lineage = json.loads((ckpt / "lineage.json").read_text())
        assert {k: lineage[k] for k in ("recipe", "method", "seed", "step", "parent")} == {
            "recipe": "vit-fmnist", "method": "aligned", "seed": 1,
            "step": int(ckpt.name.split("-")[1]), "parent": parent,
        }
        assert lineage["smoke"] is True and lineage["weights"] == "linear"
        assert (ckpt / "config.json").is_file() and (ckpt / "model.safetensors").is_file()
        assert not (ckpt / "exit_heads.safetensors").exists()
    # only the newest checkpoint keeps the optimizer state
    assert [(c / "training_state.pt").is_file() for c in r.checkpoints] == [False, False, True]

    last = r.checkpoints[-1]
    info = json.loads((last / "checkpoint.json").read_text())
    assert info["digest"] == r.digest
    assert len(info["metrics"]["acc_by_layer"]) == 3
    assert info["eval_source"] == {"name": "fashion-mnist", "split": "test", "seed": 0, "limit": 32}
    reloaded = ViTForImageClassification.from_pretrained(last, local_files_only=True)
    assert model_digest(reloaded) == r.digest
    adapter = ModelAdapter.load(last, device="cpu")
    assert adapter.digest == r.digest
    assert adapter.lens_head().num_classes == 10  # the lens reproduces the model's logits
    assert exit_heads(last) is None


def test_resume_after_a_crash_reproduces_the_uninterrupted_run(tiny, tmp_path):
    """multi-exit + alternating + dropout: exit heads, step parity and RNG must all resume."""
    kwargs = {"seed": 2, "alternating": True}
    full = train(tiny, "multi-exit", out_dir=tmp_path / "full", **kwargs)

    objectives = {}

    def crash_at_5(step, total, metrics):
        objectives[step] = metrics["objective"]
        if step == 5:
            raise Crash()

    with pytest.raises(Crash):
        train(tiny, "multi-exit", out_dir=tmp_path / "cut", progress=crash_at_5, **kwargs)
    assert [p.name for p in list_checkpoints(tmp_path / "cut")] == ["step-2", "step-4"]

    resumed_steps = []

    def record(step, total, metrics):
        resumed_steps.append(step)
        objectives[step] = metrics["objective"]

    r = train(tiny, "multi-exit", out_dir=tmp_path / "cut", progress=record, **kwargs)
    assert r.resumed_from == 4 and resumed_steps == [5, 6]
    assert [p.name for p in r.new_checkpoints] == ["step-6"]
    lineage = json.loads((r.checkpoint / "lineage.json").read_text())
    assert lineage["parent"] == "step-4" and lineage["step"] == 6
    # odd steps are last-layer CE, even steps the multi-exit loss, across the resume
    assert objectives == {1: "standard", 2: "multi-exit", 3: "standard", 4: "multi-exit",
                          5: "standard", 6: "multi-exit"}
    assert r.digest == full.digest
    assert_same_weights(r.checkpoint, full.checkpoint)
    a, b = exit_heads(r.checkpoint), exit_heads(full.checkpoint)
    assert sorted(a) == [1, 2, 3]
    for layer in a:
        assert np.array_equal(a[layer][0], b[layer][0]) and np.array_equal(a[layer][1], b[layer][1])
    own = state_dict_of(full.checkpoint)
    assert np.array_equal(a[3][0], own["classifier.weight"].numpy())
    assert not np.array_equal(a[1][0], a[3][0])  # the exits trained apart from the head
    assert r.metrics == full.metrics


def test_stop_at_then_resume_and_determinism(tiny, tmp_path):
    a = train(tiny, "ce-reg", seed=3, out_dir=tmp_path / "a")
    part = train(tiny, "ce-reg", seed=3, out_dir=tmp_path / "b", stop_at=3)
    assert not part.finished and part.step == 3
    assert [p.name for p in part.checkpoints] == ["step-2", "step-3"]
    b = train(tiny, "ce-reg", seed=3, out_dir=tmp_path / "b")
    assert b.resumed_from == 3 and b.finished
    assert [p.name for p in b.checkpoints] == ["step-2", "step-3", "step-4", "step-6"]
    assert_same_weights(a.checkpoint, b.checkpoint)
    # a finished run returns at once
    again = train(tiny, "ce-reg", seed=3, out_dir=tmp_path / "b")
    assert again.finished and again.new_checkpoints == [] and again.resumed_from == 6
    assert again.digest == b.digest
    # another seed gives another model
    c = train(tiny, "ce-reg", seed=4, out_dir=tmp_path / "c", steps=2)
    d = train(tiny, "ce-reg", seed=3, out_dir=tmp_path / "d", steps=2)
    assert c.digest != d.digest


def test_refuses_to_mix_runs(tiny, tmp_path):
    train(tiny, "standard", seed=0, out_dir=tmp_path, steps=2)
    with pytest.raises(AlreadyExists, match="method"):
        train(tiny, "aligned", seed=0, out_dir=tmp_path, steps=4)
    with pytest.raises(AlreadyExists, match="seed"):
        train(tiny, "standard", seed=1, out_dir=tmp_path, steps=4)
    with pytest.raises(AlreadyExists):
        train(tiny, "standard", seed=0, out_dir=tmp_path, steps=4, resume=False)
    with pytest.raises(InvalidArgument):
        train(tiny, "dense", out_dir=tmp_path / "x")
    with pytest.raises(InvalidArgument):
        train(tiny, "aligned", out_dir=tmp_path / "x", weights="cubic")
    with pytest.raises(InvalidArgument):
        train(tiny, "aligned", out_dir=tmp_path / "x", steps=0)


def test_stale_temp_folders_are_cleaned_and_ignored(tiny, tmp_path):
    # an earlier version's temp folder and an atomic_directory staging folder, both fresh
    for dead in (".step-2.tmp-dead", ".step-2.staging-dead"):
        (tmp_path / dead).mkdir(parents=True)
        (tmp_path / dead / "config.json").write_text("{}")
    r = train(tiny, "standard", seed=0, out_dir=tmp_path, steps=2)
    assert r.resumed_from is None and [p.name for p in r.checkpoints] == ["step-2"]
    assert not (tmp_path / ".step-2.tmp-dead").exists()
    assert not (tmp_path / ".step-2.staging-dead").exists()


def test_module_exports():
    import actstore.training as T

    assert T.train is loop.train and T.exit_heads is checkpoints.exit_heads
    assert T.list_checkpoints is checkpoints.list_checkpoints
    assert T.METHODS == ("standard", "aligned", "multi-exit", "ce-reg")
    assert set(T.RECIPES) == {"vit-fmnist", "minilm-rt", "gpt2-austen"}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2-austen", "minilm-rt"])
def test_text_recipes_resume_exactly(name, tmp_path):
    """The tokenizer is reloaded from the checkpoint; MiniLM's dropout needs the RNG state."""
    recipe = replace(get_recipe(name, smoke=True), steps=4, checkpoint_every=2, batch_size=4)
    full = train(recipe, "aligned", out_dir=tmp_path / "full", alternating=True)
    part = train(recipe, "aligned", out_dir=tmp_path / "cut", alternating=True, stop_at=2)
    assert part.step == 2 and not part.finished
    done = train(recipe, "aligned", out_dir=tmp_path / "cut", alternating=True)
    assert done.resumed_from == 2 and done.digest == full.digest
    assert_same_weights(done.checkpoint, full.checkpoint)
