"""A stopped server's idle capture replicas are parked in its process for `actor_idle_seconds`, and
the next server of the process (another store) takes them for the same model: its captures write
to its own store what a replica started afresh writes. A copy of the model that differs beside the
weights (its tokenizer) is not served by them; two live servers lend idle ones to each other; one
restarted by Ray after a crash still writes to the store of the server holding it; parked replicas
end after their idle time."""

from __future__ import annotations

import json
import shutil
import time

import numpy as np
import pytest
import ray

from actstore.client import Client
from actstore.server.app import start_server
from tests.conftest import make_settings
from tests.factories import sentences
from tests.server.captured import read_all, reference_pooled

TEXTS = sentences(20, seed=41)


def _capture_on(store, model_dir, restarted=False, **settings):
    """Capture model_dir over TEXTS (mean, float32) on a new server of ``store``, stopped after: the
    replica's Ray name, its actor id, the stored rows. ``restarted``: its replica is killed once
    warm and Ray restarts it (from its constructor's arguments) before the capture."""
    running = start_server(make_settings(store, **settings))
    try:
        with Client(f"127.0.0.1:{running.port}") as client:
            model = client.register_model(model_dir, name="bert")
            client.register_dataset(texts=TEXTS, name="parked")
            if restarted:
                pool = running.service.capture_pool
                replicas, _ = pool.acquire(model.digest, running.service.catalog.models.get("bert").path)
                pool.release(model.digest)
                ray.kill(replicas[0], no_restart=False)
                ray.get(replicas[0].node_id.remote(), timeout=120)  # answered by the restarted process
            run = client.capture("bert", "parked", pooling="mean", dtype="float32").run_key
            name = running.service.capture_pool.actor_name(model.digest, 0)
            return name, ray.get_actor(name)._actor_id, read_all(client, run, model.num_layers)
    finally:
        running.stop()


def _files(store) -> dict[str, int]:
    return {str(p.relative_to(store)): p.stat().st_size for p in store.rglob("*") if p.is_file()}


def test_the_next_server_takes_a_stopped_servers_replica_and_writes_to_its_own_store(tmp_path, ray_cluster,
                                                                                     tiny_models):
    if ray.cluster_resources().get("GPU"):
        pytest.skip("GPU replicas end with their server: they hold their GPU")
    first_store, second_store = tmp_path / "first", tmp_path / "second"
    name, actor, first = _capture_on(first_store, tiny_models["bert"])
    assert name in ray.util.list_named_actors()  # parked, alive, after its server stopped
    untouched = _files(first_store)

    taken, taken_actor, second = _capture_on(second_store, tiny_models["bert"])
    assert (taken, taken_actor) == (name, actor)  # the same actor, not a new one
    assert second.tobytes() == first.tobytes()
    np.testing.assert_allclose(second, reference_pooled(tiny_models["bert"], TEXTS, "mean"), rtol=1e-5, atol=1e-5)
    # taken once more, then crashed: Ray starts it again with the first store in its arguments, and
    # the capture still goes to the store of the server that holds it
    third, third_actor, restarted = _capture_on(tmp_path / "third", tiny_models["bert"], restarted=True)
    assert (third, third_actor) == (name, actor) and restarted.tobytes() == first.tobytes()
    assert _files(first_store) == untouched  # nothing of the later stores' runs went to the first


def test_a_copy_with_another_tokenizer_gets_a_replica_of_its_own(tmp_path, ray_cluster, tiny_models):
    if ray.cluster_resources().get("GPU"):
        pytest.skip("GPU replicas end with their server: they hold their GPU")
    name, _, _ = _capture_on(tmp_path / "first", tiny_models["bert"])
    # the same weights (the same model digest), but "cat" and "dog" swap token ids
    swapped = shutil.copytree(tiny_models["bert"], tmp_path / "swapped-bert")
    tokenizer = json.loads((swapped / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab["cat"], vocab["dog"] = vocab["dog"], vocab["cat"]
    (swapped / "tokenizer.json").write_text(json.dumps(tokenizer))

    other, _, stored = _capture_on(tmp_path / "second", swapped)
    np.testing.assert_allclose(stored, reference_pooled(swapped, TEXTS, "mean"), rtol=1e-5, atol=1e-5)
    assert not np.allclose(stored, reference_pooled(tiny_models["bert"], TEXTS, "mean"), atol=1e-3)
    deadline = time.monotonic() + 30
    while name in ray.util.list_named_actors() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert name not in ray.util.list_named_actors()  # the parked one was ended, not kept beside it


def test_parked_replicas_end_after_their_idle_time(tmp_path, ray_cluster, tiny_models):
    name, _, _ = _capture_on(tmp_path / "store", tiny_models["bert"], actor_idle_seconds=1.0)
    deadline = time.monotonic() + 30
    while name in ray.util.list_named_actors() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert name not in ray.util.list_named_actors()


def test_two_live_servers_of_a_process_pass_one_set_of_idle_replicas_between_them(tmp_path, ray_cluster,
                                                                                  tiny_models):
    if ray.cluster_resources().get("GPU"):
        pytest.skip("GPU replicas are not lent: they hold their GPU")
    first = start_server(make_settings(tmp_path / "first"))
    try:
        with Client(f"127.0.0.1:{first.port}") as client:
            model = client.register_model(tiny_models["bert"], name="bert")
            client.register_dataset(texts=TEXTS, name="parked")
            first_run = client.capture("bert", "parked", pooling="mean", dtype="float32").run_key
            name = first.service.capture_pool.actor_name(model.digest, 0)
            actor = ray.get_actor(name)._actor_id
            # the first server lives on, idle: the second borrows its replica, writing to its own store
            taken, _, second = _capture_on(tmp_path / "second", tiny_models["bert"])
            assert (taken, ray.get_actor(taken)._actor_id) == (name, actor)
            # handed back through the parking when the second stopped: the first captures on it again
            again = client.capture("bert", "parked", pooling="cls", dtype="float32").run_key
            assert (first.service.capture_pool.actor_name(model.digest, 0), ray.get_actor(name)._actor_id) == \
                (name, actor)
            assert read_all(client, first_run, model.num_layers).tobytes() == second.tobytes()
            np.testing.assert_allclose(read_all(client, again, model.num_layers),
                                       reference_pooled(tiny_models["bert"], TEXTS, "cls"), rtol=1e-5, atol=1e-5)
    finally:
        first.stop()
