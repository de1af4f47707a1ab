"""Capture under faults, end to end: a worker or replica killed mid-capture, a layout process lost,
a cancelled or failed capture resumed; a real server, Ray, DuckDB and Zarr."""

from __future__ import annotations

import time

import numpy as np
import pytest
import ray

from actstore.client import Client
from actstore.errors import Unavailable
from actstore.server.app import start_server
from actstore.server.capture_job import shards_per_task
from tests.conftest import make_settings
from tests.factories import sentences
from tests.server.captured import cancel_after, read_all, registered_fixture  # noqa: F401 (a fixture)

pytestmark = pytest.mark.long  # minutes of servers, clusters or venvs: started first (tests/conftest.py)


def test_token_layouts_come_from_one_warm_process_shared_by_the_servers_of_a_process(tmp_path, ray_cluster,
                                                                                     tiny_models):
    """A process lays out token-level runs in one `TokenLayouts` actor (its tokenizers stay loaded):
    one killed for good is started again on the next layout; a server started after that one
    stopped (another store) lays out its runs in the same actor, without starting another; and
    once no server is left it ends after the last one's `actor_idle_seconds`."""
    running = start_server(make_settings(tmp_path / "layouts", actor_idle_seconds=60))
    name = running.service.capture_pool.layouts_name
    try:
        with Client(f"127.0.0.1:{running.port}") as other:
            other.register_model(tiny_models["bert"], name="bert")
            other.register_dataset(texts=sentences(12, seed=3), name="few")
            first = other.capture("bert", "few", pooling="tokens").run_key
            layouts = ray.get_actor(name)
            shorter = other.capture("bert", "few", pooling="tokens", max_len=6).run_key  # another layout
            assert other.describe(shorter).rows < other.describe(first).rows
            assert ray.get_actor(name) == layouts  # the same process, still warm

            ray.kill(layouts, no_restart=True)
            while name in ray.util.list_named_actors():
                time.sleep(0.1)
            again = other.describe(other.capture("bert", "few", pooling="tokens", max_len=5).run_key).rows
            assert again < other.describe(shorter).rows
            relaid = ray.get_actor(name)
            assert relaid != layouts
    finally:
        running.stop()
    assert ray.get_actor(name) == relaid  # outlives its server, for the next one of this process
    running = start_server(make_settings(tmp_path / "another", actor_idle_seconds=5))
    try:
        assert running.service.capture_pool.layouts_name == name
        with Client(f"127.0.0.1:{running.port}") as other:
            other.register_model(tiny_models["bert"], name="bert")
            other.register_dataset(texts=sentences(12, seed=3), name="few")
            assert 0 < other.plan_capture("bert", "few", pooling="tokens", max_len=4).rows < again
            assert running.service.capture_pool.layouts_asked == 1
            assert ray.get_actor(name) == relaid  # the same process laid it out
    finally:
        running.stop()
    deadline = time.monotonic() + 30
    while name in ray.util.list_named_actors() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert name not in ray.util.list_named_actors()


def test_worker_killed_mid_capture_still_commits_exact_rows(server, client, tiny_models):
    digest = client.register_model(tiny_models["bert"], name="bert").digest
    texts = sentences(600, seed=5)
    client.register_dataset(texts=texts, name="big")
    job = client.submit_capture("bert", "big")
    for state in client.watch(job.job_id):
        if state.done >= 2:
            ray.kill(ray.get_actor(server.service.capture_pool.actor_name(digest, 0)), no_restart=False)
            break
    final = client.wait(job.job_id)
    assert final.status == "done"
    run = client.describe(final.target)
    assert run.recorded_shards == run.num_shards == 75
    values, ids = client.read_activations(final.target, 3)
    assert values.shape == (600, 16) and len(set(ids)) == 600 and np.isfinite(values).all()



def test_a_replica_lost_mid_capture_and_between_captures_costs_only_time(tmp_path, client, tiny_models):
    """Two replicas on one node; one is killed for good while shards are in flight: its tasks go to
    the other, and the run equals a capture by one replica that nothing happened to, byte for byte.
    The next capture on the warm pool gets live replicas only (the pool starts the lost one afresh)."""
    if ray.cluster_resources().get("GPU"):
        pytest.skip("a GPU cluster runs capture_replicas_per_gpu replicas a GPU, not capture_actors CPU replicas")
    texts = sentences(240, seed=5)
    reference_model = client.register_model(tiny_models["bert"], name="bert")
    client.register_dataset(texts=texts, name="big")
    reference = read_all(client, client.capture("bert", "big").run_key, reference_model.num_layers)

    running = start_server(make_settings(tmp_path / "two-replicas", capture_actors=2))
    try:
        with Client(f"127.0.0.1:{running.port}") as other:
            model = other.register_model(tiny_models["bert"], name="bert")
            other.register_dataset(texts=texts, name="big")
            pool = running.service.capture_pool
            lost = pool.actor_name(model.digest, 1)
            job = other.submit_capture("bert", "big")
            for state in other.watch(job.job_id):
                if state.done >= 2:
                    ray.kill(ray.get_actor(lost), no_restart=True)
                    break
            final = other.wait(job.job_id)
            assert final.status == "done", final.error
            run = other.describe(final.target)
            assert run.recorded_shards == run.num_shards == 30
            assert running.service.catalog.chunks.rows_total(final.target) == 240  # every row exactly once
            stored = read_all(other, final.target, model.num_layers)
            assert stored.dtype == reference.dtype and stored.tobytes() == reference.tobytes()

            while lost in ray.util.list_named_actors():  # Ray has it dead: the pool can see it
                time.sleep(0.1)
            assert other.capture("bert", "big", pooling="mean").run_key
            actors, _ = pool.acquire(model.digest, running.service.catalog.models.get("bert").path)
            try:
                assert len(ray.get([actor.node_id.remote() for actor in actors], timeout=60)) == 2
                before = [spent["tasks"] for spent in ray.get([actor.spent.remote() for actor in actors])]
            finally:
                pool.release(model.digest)

            # a token-level capture's tasks span an even number of shards here, so each starts at an
            # even shard: both replicas still get tasks (dealt in turn, not by shard number)
            tokens = other.capture("bert", "big", pooling="tokens").run_key
            service = running.service
            per_task = shards_per_task(service.arrays.layout(tokens), service.settings.capture_batch_size)
            assert per_task % 2 == 0 and other.describe(tokens).num_shards > 2 * per_task
            after = [spent["tasks"] for spent in ray.get([actor.spent.remote() for actor in actors])]
            assert all(later > earlier for later, earlier in zip(after, before)), (before, after)
    finally:
        running.stop()


def test_cancelled_capture_resumes_with_only_missing_shards(client, tiny_models):
    client.register_model(tiny_models["bert"], name="bert")
    client.register_dataset(texts=sentences(800, seed=7), name="big")
    job = client.submit_capture("bert", "big")
    cancel_after(client, job.job_id)
    partial = client.describe(job.target)
    assert partial.status == "running" and 0 < partial.recorded_shards < partial.num_shards
    resumed = client.submit_capture("bert", "big")
    assert resumed.job_id != job.job_id and resumed.target == job.target
    first = next(s for s in client.watch(resumed.job_id) if s.total)
    assert first.done >= partial.recorded_shards, "stored shards must not be computed again"
    final = client.wait(resumed.job_id)
    assert final.status == "done"
    assert client.describe(job.target).recorded_shards == 100



def test_a_failed_capture_marks_its_run_failed_and_resumes_when_submitted_again(server, client, registered):
    import shutil

    model = server.service.catalog.models.get("bert")
    folder = server.service.store.path / "models" / model.digest
    hidden = folder.with_name("hidden")
    folder.rename(hidden)  # the capture replicas cannot load the model: the job fails
    job = client.submit_capture("bert", "toy", pooling="mean")
    with pytest.raises(Unavailable, match=r"shards? [\d-]+ of \d+ not written.*submit the capture again"):
        client.wait(job.job_id)
    finished = client.job(job.job_id)
    assert finished.status == "failed" and finished.error_code == "UNAVAILABLE", finished
    assert "Traceback" not in finished.error
    assert client.describe(finished.target).status == "failed"
    shutil.move(hidden, folder)
    resumed = client.capture("bert", "toy", pooling="mean")
    assert resumed.run_key == finished.target
    run = client.describe(finished.target)
    assert (run.status, run.recorded_shards) == ("committed", run.num_shards)
