"""A training checkpoint that finds its disk full (a real small filesystem, tests/small_disk.py):
RESOURCE_EXHAUSTED naming the checkpoint and the space it needs, no half-written checkpoint left,
and once space is freed the same training resumes and ends byte-identical to a run on a roomy disk."""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest

from actstore.errors import ResourceExhausted
from actstore.training.checkpoints import list_checkpoints
from actstore.training.loop import train
from actstore.training.recipes import build_vit, get_recipe
from tests.small_disk import small_disk


@pytest.fixture(scope="module")
def tiny():
    return replace(get_recipe("vit-fmnist", smoke=True),
                   model_builder=functools.partial(build_vit, hidden_size=16, num_layers=3, num_heads=2,
                                                   intermediate_size=32, patch_size=7, dropout=0.1),
                   batch_size=16, steps=6, checkpoint_every=2, train_limit=100, eval_size=32)


def test_a_full_disk_at_a_checkpoint_is_resource_exhausted_and_the_resumed_run_matches(tiny, tmp_path):
    roomy = train(tiny, "standard", seed=4, out_dir=tmp_path / "roomy")
    with small_disk(tmp_path / "disk", 8) as disk:
        out = disk.path / "run"

        def fill_after_3(step, total, metrics):
            if step == 3:
                disk.fill()

        with pytest.raises(ResourceExhausted) as full:
            train(tiny, "standard", seed=4, out_dir=out, progress=fill_after_3)
        message = str(full.value)
        assert f"disk of {out / 'step-4'} for a training checkpoint (0 bytes free" in message, message
        assert "needed" in message and "free space on that disk" in message
        assert [p.name for p in list_checkpoints(out)] == ["step-2"]
        assert not [p for p in out.iterdir() if "staging" in p.name]

        disk.free()
        resumed = train(tiny, "standard", seed=4, out_dir=out)
        assert resumed.resumed_from == 2 and resumed.digest == roomy.digest
        assert (resumed.checkpoint / "model.safetensors").read_bytes() == \
            (roomy.checkpoint / "model.safetensors").read_bytes()
