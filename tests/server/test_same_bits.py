"""One answer per key, bit for bit: the same stored bytes give the same float64 CKA (a pair query, a
streamed measure, the matrix job in Gram and in feature space) from another server over a copy of the
store, and whatever number of map tasks runs at once (`metric_tasks`: what a cluster's size changes).
Before, a reduction merged its tasks' results as they arrived and cut its rows by the cluster's
CPUs: the last bits changed. (tests/server/test_multinode.py compares 1 and 3 Ray nodes.)"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from actstore.client import Client
from actstore.server.app import start_server
from tests.conftest import make_settings
from tests.factories import sentences

ROWS = 96  # 12 shards of 8


def _answers(client: Client, a: str, b: str) -> dict[str, bytes]:
    cka = client.cka(a, b, refresh=True)
    gram = client.cka_matrix([a, b], refresh=True)
    moments = client.metric("cca-squared_score", a, b, refresh=True)  # feature-space moments, merged
    return {"cka": cka.biased.tobytes() + cka.debiased.tobytes(), "gram": gram.biased.tobytes(),
            "cca": b"".join(np.asarray(v).tobytes() for _, v in sorted(moments.arrays.items()))}


@pytest.fixture(scope="module")
def stored(tmp_path_factory, tiny_models, ray_cluster):
    """A store with two runs, and its answers from the server that captured them."""
    root = tmp_path_factory.mktemp("bits") / "store"
    running = start_server(make_settings(root))
    try:
        with Client(f"127.0.0.1:{running.port}") as client:
            client.register_model(tiny_models["bert"], name="bert")
            client.register_dataset(texts=sentences(ROWS), labels=[i % 3 for i in range(ROWS)], name="toy")
            a = client.capture("bert", "toy", pooling="mean").run_key
            b = client.capture("bert", "toy", pooling="cls").run_key
            answers = _answers(client, a, b)
    finally:
        running.stop()
    return root, (a, b), answers


@pytest.mark.parametrize("tasks", [1, 3])
def test_another_server_over_the_same_bytes_answers_the_same_bits(stored, tmp_path, tasks):
    root, (a, b), first = stored
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    running = start_server(make_settings(copy, metric_tasks=tasks))
    try:
        with Client(f"127.0.0.1:{running.port}") as client:
            again = _answers(client, a, b)
    finally:
        running.stop()
    for name, bits in first.items():
        assert again[name] == bits, f"{name} with {tasks} task(s) at once"
