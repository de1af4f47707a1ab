"""Where metric jobs form their products, through the real service on a real Ray cluster.

A server restarted on the same store with `metric_device="torch-cpu"` runs the code a GPU runs
(torch, float64) on this CPU, and with "cuda" on a GPU where the cluster has one; recomputed with
refresh, its answers equal the ones a numpy/BLAS server (metric_device="cpu") gave.
`metric_device="cuda"` on a cluster without GPUs is refused up front.
"""

from __future__ import annotations

import numpy as np
import pytest
import ray

from actstore.client import Client
from actstore.errors import FailedPrecondition
from actstore.server.app import start_server
from actstore.workers.metric_tasks import task_device
from tests.conftest import make_settings
from tests.factories import sentences

ROWS = 48


def _answers(client: Client, bert: str, gpt2: str, refresh: bool) -> dict:
    feature = client.cka(bert, gpt2, layers_a=[1], layers_b=[2], refresh=refresh)
    gram = client.cka(bert, gpt2, refresh=refresh)
    assert any("feature space" in note for note in feature.notes), feature.notes
    assert any("gram space" in note for note in gram.notes), gram.notes
    matrix = client.cka_matrix([bert, gpt2], refresh=refresh)
    return {
        "cka_feature": np.stack([feature.biased, feature.debiased]),
        "cka_gram": np.stack([gram.biased, gram.debiased]),
        "cka_matrix": np.stack([matrix.biased, matrix.debiased]),
        "minibatch": client.minibatch_cka(bert, gpt2, batch_size=12, refresh=refresh).values,
        "dataset_entropy": client.entropy("dataset_entropy", bert, alpha=2.0, refresh=refresh).values,
        "nc1": client.neural_collapse(gpt2, refresh=refresh).values,
    }


@pytest.fixture(scope="module")
def computed_on_host(tmp_path_factory, ray_cluster, tiny_models):
    """A store with two runs over one labelled dataset, and a numpy/BLAS server's answers."""
    root = tmp_path_factory.mktemp("store")
    running = start_server(make_settings(root, metric_device="cpu"))  # numpy/BLAS even beside a GPU
    try:
        with Client(f"127.0.0.1:{running.port}") as client:
            for name in ("bert", "gpt2"):
                client.register_model(tiny_models[name], name=name)
            labels = np.random.default_rng(0).integers(0, 3, size=ROWS).tolist()
            client.register_dataset(texts=sentences(ROWS, seed=4), labels=labels, name="labelled")
            bert, gpt2 = (client.capture(name, "labelled", pooling="mean").run_key for name in ("bert", "gpt2"))
            answers = _answers(client, bert, gpt2, refresh=False)
    finally:
        running.stop()
    return root, bert, gpt2, answers


def _client_of(root, **settings):
    running = start_server(make_settings(root, **settings))
    return running, Client(f"127.0.0.1:{running.port}")


@pytest.mark.parametrize("device", ["torch-cpu", "cuda"])
def test_device_path_agrees_with_numpy(computed_on_host, device):
    if device == "cuda" and not ray.cluster_resources().get("GPU"):
        pytest.skip("the Ray cluster has no GPU")
    root, bert, gpt2, on_host = computed_on_host
    running, client = _client_of(root, metric_device=device)
    try:
        on_device = _answers(client, bert, gpt2, refresh=True)
    finally:
        client.close()
        running.stop()
    for name, expected in on_host.items():
        assert np.isfinite(expected).any(), name
        np.testing.assert_allclose(on_device[name], expected, rtol=1e-10, atol=1e-12, err_msg=name)


def test_cuda_on_a_cluster_without_gpus_is_refused(computed_on_host):
    if ray.cluster_resources().get("GPU"):
        pytest.skip("this cluster has GPUs")
    root, bert, gpt2, _ = computed_on_host
    running, client = _client_of(root, metric_device="cuda")
    try:
        with pytest.raises(FailedPrecondition, match="no GPU.*ACTSTORE_METRIC_DEVICE"):
            client.cka(bert, gpt2, refresh=True)
        assert client.cka(bert, gpt2).provenance.cached  # a stored answer needs no device
    finally:
        client.close()
        running.stop()


def test_task_device_follows_the_policy_inside_a_ray_task(ray_cluster):
    resolve = ray.remote(num_cpus=1)(task_device)
    assert ray.get(resolve.remote("cpu")) is None
    assert ray.get(resolve.remote("torch-cpu")) == "cpu"
    assert ray.get(resolve.remote("auto")) is None  # Ray gave the task no GPU
