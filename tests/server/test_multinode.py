"""Several Ray nodes on this machine (ray.cluster_utils.Cluster, in a process of its own: see
multinode_scenario.py) over an s3:// store: one capture replica on each node, each started once,
and metric tasks on more than one node (Ray's own placement data), the run equals a single-node
capture byte for byte, CKA from 3 nodes has the bits of CKA from 1, and a worker node lost
mid-capture and mid-matrix-job costs nothing but time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from tests.factories import sentences
from tests.formulas import cka_numpy

pytestmark = pytest.mark.long  # minutes of servers, clusters or venvs: started first (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def _scenario(s3_bucket, tiny_models, tmp_path, *extra) -> Iterator[Callable[[], tuple[dict, Path]]]:
    """The scenario's process, started; a call waits for what it found (its facts and output folder).
    The caller works on its single-node side meanwhile: both mostly wait on process start-ups."""
    out, data_dir = tmp_path / "out", tmp_path / "data-dir"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    with (tmp_path / "stderr").open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.server.multinode_scenario", "--store", s3_bucket, "--server-dir",
             str(data_dir), "--model", str(tiny_models["bert"]), "--out", str(out), *extra],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr)

    def finished() -> tuple[dict, Path]:
        process.wait(timeout=540)
        assert process.returncode == 0, (tmp_path / "stderr").read_text()[-4000:]
        local = sorted(str(p.relative_to(data_dir)) for p in data_dir.rglob("*") if p.is_file())
        # the catalog, and the catalog's backups beside it (made on a schedule and when the server stops)
        assert local and all(name.startswith(("catalog.duckdb", "backups/catalog-")) for name in local), local
        return json.loads((out / "facts.json").read_text()), out

    try:
        yield finished
    finally:
        process.kill()
        process.wait()


def _single_node_capture(client, tiny_models) -> tuple[str, list[np.ndarray]]:
    client.register_model(tiny_models["bert"], name="bert")
    client.register_dataset(texts=sentences(96), labels=[i % 3 for i in range(96)], name="toy")
    run = client.capture("bert", "toy", pooling="mean").run_key
    return run, [client.read_activations(run, layer)[0] for layer in range(4)]


def _check_run(facts: dict, out: Path, reference: list[np.ndarray]) -> None:
    run = facts["run"]
    assert facts["capture_status"] == "done", facts["capture_error"]
    assert (run["status"], run["recorded_shards"], run["num_shards"]) == ("committed", 12, 12)
    assert facts["rows_recorded"] == run["rows"] == 96  # every row exactly once
    for layer, expected in enumerate(reference):
        stored = np.load(out / f"layer{layer}.npy")
        assert stored.dtype == expected.dtype and stored.tobytes() == expected.tobytes(), f"layer {layer}"


def test_capture_and_metric_tasks_spread_over_nodes(s3_bucket, tiny_models, tmp_path, client):
    with _scenario(s3_bucket, tiny_models, tmp_path) as scenario:
        run, reference = _single_node_capture(client, tiny_models)
        second = client.capture("bert", "toy", pooling="cls").run_key
        matrix, pairwise = client.cka_matrix([run, second]).biased, client.cka(run, second).biased
        facts, out = scenario()
    assert facts["nodes"] == 3
    # one replica per node, each started once: none moved by killing it and starting another
    assert (len(facts["capture_nodes"]), facts["replica_processes"]) == (3, 3), facts
    assert len(facts["metric_nodes"]) >= 2, facts  # and metric tasks too
    _check_run(facts, out, reference)
    np.testing.assert_allclose(np.load(out / "matrix.npy")[:4, 4:], np.load(out / "pairwise.npy"), atol=1e-12)
    # one answer per stored bytes: this one-node cluster (its CPUs, not 3) gives the same float64 bits
    assert facts["run"]["key"] == run  # the same request: the same run
    assert matrix.tobytes() == np.load(out / "matrix.npy").tobytes()
    assert pairwise.tobytes() == np.load(out / "pairwise.npy").tobytes()


@pytest.mark.slow
def test_a_node_lost_mid_capture_and_mid_matrix_job_costs_only_time(s3_bucket, tiny_models, tmp_path, client):
    with _scenario(s3_bucket, tiny_models, tmp_path, "--remove-nodes") as scenario:
        _, reference = _single_node_capture(client, tiny_models)
        facts, out = scenario()
    assert facts["capture_done_before_removal"], "the node was not removed while the capture ran"
    _check_run(facts, out, reference)
    assert facts["matrix_status"] == "done", facts["matrix_error"]
    layers = [layer.astype(np.float64) for layer in reference]
    np.testing.assert_allclose(np.load(out / "matrix.npy")[:4, :4],
                               [[cka_numpy(x, y) for y in layers] for x in layers], rtol=1e-6, atol=1e-9)
