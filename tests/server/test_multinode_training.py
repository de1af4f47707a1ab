"""Training on a cluster over an s3:// store: the task runs on a node other than the head and puts
its checkpoints into the store's files area, the server registers them from the store (its own
directory gets nothing but the catalog), and every checkpoint is a model to capture and query.
The scenario runs in a process of its own (multinode_training_scenario.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from actstore.training import get_recipe

pytestmark = pytest.mark.long  # minutes of servers, clusters or venvs: started first (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]


def test_training_on_a_worker_node_registers_its_checkpoints_from_the_store(s3_bucket, tmp_path):
    out, data_dir = tmp_path / "out", tmp_path / "data-dir"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, "-m", "tests.server.multinode_training_scenario", "--store", s3_bucket,
         "--server-dir", str(data_dir), "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-4000:]
    facts = json.loads((out / "facts.json").read_text())

    assert facts["train_nodes"] and facts["head"] not in facts["train_nodes"], facts  # trained elsewhere
    recipe = get_recipe("vit-fmnist", smoke=True)
    expected = list(range(recipe.checkpoint_every, recipe.steps + 1, recipe.checkpoint_every))
    assert [step for step, _ in facts["steps"]] == expected  # every checkpoint registered
    model = facts["model"]
    assert model["digest"] == facts["steps"][-1][1] and f"vit-fmnist-smoke-standard-s0@step{recipe.steps}" in \
        model["aliases"]
    assert model["lineage"]["step"] == recipe.steps and model["lineage"]["parent"] == f"step-{expected[-2]}"
    assert model["lineage"]["source"].startswith(s3_bucket + "/training/"), model["lineage"]

    # in the bucket: each checkpoint complete, and only the newest resume state
    names = facts["objects"]
    run = names[0].split("/")[1]
    for step in expected:
        assert f"training/{run}/step-{step}/.complete" in names
        assert f"training/{run}/step-{step}/config.json" in names
        assert f"training/{run}/step-{step}/training_state.pt" not in names
    assert {n.rsplit("/", 2)[-2] for n in names if "/state-" in n} == {f"state-{recipe.steps}"}

    # the server's own directory holds the catalog (and its backups) only: no checkpoint
    local = sorted(str(p.relative_to(data_dir)) for p in data_dir.rglob("*") if p.is_file())
    assert local and all(name.startswith(("catalog.duckdb", "backups/catalog-")) for name in local), local

    assert [c["step"] for c in facts["captures"]] == expected
    for capture in facts["captures"]:
        assert capture["rows"] == capture["lens_n"] == recipe.eval_source()["limit"], capture
        assert capture["lens_layers"] == model["num_layers"] + 1
