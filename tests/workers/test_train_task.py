"""The training task and the store's files area (actstore.training.stored): with an s3:// store
(the loopback S3 server) it trains in a scratch folder and uploads each checkpoint, and a task
started again, on a fresh node, resumes from the newest complete checkpoint in the store, exactly
as an uninterrupted run; with a local store it trains in place, as before."""

from __future__ import annotations

import functools
import json
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from actstore.store.backends.s3 import config_from_env, s3_store
from actstore.store.handle import StoreHandle
from actstore.training import stored
from actstore.training.checkpoints import STATE_FILE
from actstore.training.loop import train
from actstore.training.recipes import build_vit, get_recipe
from actstore.workers.train_task import run_training

PREFIX = "training/0123456789abcdef"


@pytest.fixture(scope="module")
def tiny():
    """vit-fmnist at smoke size, with dropout so that resuming must restore the RNG."""
    return replace(
        get_recipe("vit-fmnist", smoke=True),
        model_builder=functools.partial(build_vit, hidden_size=16, num_layers=3, num_heads=2, intermediate_size=32,
                                        patch_size=7, dropout=0.1),
        batch_size=16, steps=4, checkpoint_every=2, train_limit=100, eval_size=32,
    )


def _train(recipe, store, **kwargs) -> dict:
    threads = torch.get_num_threads()
    try:
        return run_training(recipe, "standard", 0, None, True, False, "linear", store, PREFIX, **kwargs)
    finally:
        torch.set_num_threads(threads)


def _names(store: StoreHandle) -> list[str]:
    import obstore

    listing = obstore.list(s3_store(store.root, store.options), prefix=f"{PREFIX}/")
    return sorted(meta["path"].removeprefix(f"{PREFIX}/") for batch in listing for meta in batch)


def test_a_task_resumes_from_the_newest_checkpoint_in_the_object_store(s3_bucket, tmp_path, tiny):
    store = StoreHandle(s3_bucket, options=config_from_env())
    first = _train(tiny, store, stop_at=2)  # stopped after step 2, as a killed task
    assert first["checkpoint"] == f"{PREFIX}/step-2"
    assert stored.stored_checkpoints(store, PREFIX) == [f"{PREFIX}/step-2"]
    assert f"state-2/{STATE_FILE}" in _names(store) and f"step-2/{STATE_FILE}" not in _names(store)
    assert not (Path(tempfile.gettempdir()) / "actstore-training" / PREFIX.replace("/", "-")).exists()  # cleaned

    # killed while uploading step 4: its state complete, its step folder not
    files = store.files
    files.write_folder(f"{PREFIX}/state-4", lambda t: (t.mkdir(), (t / STATE_FILE).write_bytes(b"stale")))
    files.write(f"{PREFIX}/step-4", "config.json", b"{")
    assert stored.stored_checkpoints(store, PREFIX) == [f"{PREFIX}/step-2"]  # invisible until complete

    second = _train(tiny, store)  # a fresh task: nothing in its scratch folder, all from the store
    assert second["step"] == 4 and second["checkpoint"] == f"{PREFIX}/step-4"
    assert stored.stored_checkpoints(store, PREFIX) == [f"{PREFIX}/step-2", f"{PREFIX}/step-4"]
    names = _names(store)
    assert [n for n in names if n.startswith("state-")] == ["state-4/.complete", f"state-4/{STATE_FILE}"]
    assert files.read(f"{PREFIX}/state-4", STATE_FILE) != b"stale"
    assert json.loads(files.read(f"{PREFIX}/step-4", "lineage.json"))["parent"] == "step-2"
    assert stored.read_progress(files, PREFIX)["step"] == 4

    uninterrupted = train(tiny, "standard", 0, out_dir=tmp_path / "uninterrupted")
    info = json.loads(files.read(f"{PREFIX}/step-4", "checkpoint.json"))
    assert info["digest"] == uninterrupted.digest  # resumed from the store, bit for bit

    again = _train(tiny, store)  # a finished run submitted again: nothing more to do
    assert again["step"] == 4 and stored.stored_checkpoints(store, PREFIX)[-1] == f"{PREFIX}/step-4"


def test_a_local_store_trains_in_place(tmp_path, tiny):
    store = StoreHandle(str(tmp_path / "store"))
    result = _train(tiny, store)
    run = tmp_path / "store" / PREFIX
    assert result["checkpoint"] == str(run / "step-4")
    assert sorted(p.name for p in run.iterdir()) == [".lock", "progress.json", "step-2", "step-4"]
    assert (run / "step-4" / STATE_FILE).is_file() and not (run / "step-2" / STATE_FILE).exists()
    assert stored.stored_checkpoints(store, PREFIX) == [f"{PREFIX}/step-2", f"{PREFIX}/step-4"]
    assert stored.read_progress(store.files, PREFIX)["step"] == 4
