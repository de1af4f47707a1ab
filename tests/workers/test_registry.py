"""Model registration: the stored copy, its lens head file (typed LensHead round trip), races."""

from __future__ import annotations

import numpy as np
import pytest

from actstore.metrics.lens_head import LensHead
from actstore.modeling.adapter import ModelAdapter
from actstore.store.handle import StoreHandle
from actstore.workers.registry import HEAD_FILE, load_lens_head, register_model, save_lens_head
from tests.factories import save_tiny_model


def _same_head(a: LensHead, b: LensHead) -> None:
    for name in ("norm", "eps", "pooler_activation", "position", "task", "arch", "digest"):
        assert getattr(a, name) == getattr(b, name), name
    for name in ("norm_weight", "norm_bias", "weight", "bias", "pooler_weight", "pooler_bias"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.dtype == y.dtype and np.array_equal(x, y), name


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert-cls"])
def test_register_stores_model_and_lens_head(tmp_path, name):
    folder = save_tiny_model(name, tmp_path / "src")
    record = register_model(str(folder), StoreHandle(str(tmp_path / "store")))
    target = tmp_path / "store" / "models" / record.digest
    assert record.path == str(target) and record.has_head
    assert not list(target.parent.glob(".*"))  # no staging folder left behind
    stored = load_lens_head(target)
    _same_head(stored, ModelAdapter.load(folder, device="cpu").lens_head())
    assert ModelAdapter.load(target, device="cpu").digest == record.digest
    again = register_model(str(folder), StoreHandle(str(tmp_path / "store")))  # already there: reused
    assert again == record


def test_bare_backbone_has_no_head_file(tmp_path):
    folder = save_tiny_model("bert", tmp_path / "src")
    record = register_model(str(folder), StoreHandle(str(tmp_path / "store")))
    assert not record.has_head and load_lens_head(record.path) is None


def test_concurrent_registration_loser_keeps_the_winner(tmp_path, monkeypatch):
    folder = save_tiny_model("gpt2", tmp_path / "src")
    store = tmp_path / "store"
    real_save = ModelAdapter.save

    def save_then_lose(self, directory):
        real_save(self, directory)
        winner = store / "models" / self.digest
        winner.mkdir(parents=True)
        (winner / "winner").write_text("")  # another process finished first

    monkeypatch.setattr(ModelAdapter, "save", save_then_lose)
    record = register_model(str(folder), StoreHandle(str(store)))
    target = store / "models" / record.digest
    assert sorted(p.name for p in target.iterdir()) == ["winner"]
    assert [p.name for p in target.parent.iterdir()] == [target.name]


def test_lens_head_file_round_trip_and_earlier_format(tmp_path):
    rng = np.random.default_rng(0)
    head = LensHead("rmsnorm", rng.standard_normal(4).astype(np.float32), rng.standard_normal(4), 1e-6,
                    rng.standard_normal((3, 5)).astype(np.float32), None,
                    pooler_weight=rng.standard_normal((5, 4)), pooler_bias=None, pooler_activation="gelu",
                    position="last", task="classifier", arch="X", digest="abc")
    save_lens_head(head, tmp_path / HEAD_FILE)
    _same_head(load_lens_head(tmp_path), head)
    # written before LensHead: a dict with "type", num_classes, and no eps / norm_weight when absent
    old = tmp_path / "old"
    old.mkdir()
    weight = rng.standard_normal((3, 4)).astype(np.float32)
    np.savez(old / HEAD_FILE, weight=weight, meta_norm=np.asarray("none"), meta_position=np.asarray("every"),
             meta_type=np.asarray("lm"), meta_num_classes=np.asarray(3), meta_arch=np.asarray("GPT2LMHeadModel"),
             meta_digest=np.asarray("d"))
    loaded = load_lens_head(old)
    assert (loaded.norm, loaded.eps, loaded.task, loaded.num_classes) == ("none", 0.0, "lm", 3)
    np.testing.assert_array_equal(loaded.weight, weight)
