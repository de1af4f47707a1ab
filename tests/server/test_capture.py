"""Capture end to end: a real server on loopback, a real local Ray, real DuckDB and Zarr."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import ray
import torch

from actstore.client import Client
from actstore.errors import InvalidArgument, NotFound, Unavailable
from actstore.server.app import start_server
from actstore.server.capture_job import shards_per_task
from tests.conftest import make_settings
from tests.factories import sentences


def _reference_pooled(model_dir, texts, pooling, max_len=128):
    """All hidden states straight from transformers, pooled by hand (independent of the adapter).
    Layer L is the last block's output before any final norm (a forward hook)."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModel.from_pretrained(model_dir).eval()
    blocks = model.encoder.layer if hasattr(model, "encoder") else model.h
    captured = {}
    hook = blocks[-1].register_forward_hook(
        lambda m, i, o: captured.__setitem__("last", o[0] if isinstance(o, tuple) else o))
    rows = []
    with torch.no_grad():
        for text in texts:
            enc = tok([text], return_tensors="pt", truncation=True, max_length=max_len)
            hs = list(model(**enc, output_hidden_states=True).hidden_states)
            hs[-1] = captured["last"]
            h = torch.stack(hs)[:, 0]  # (L+1, s, d)
            rows.append({"cls": h[:, 0], "last": h[:, -1], "mean": h.mean(1)}[pooling])
    hook.remove()
    return torch.stack(rows).numpy()  # (n, L+1, d)


@pytest.fixture
def registered(client, tiny_models):
    texts = sentences(40)
    labels = [i % 3 for i in range(40)]
    client.register_model(tiny_models["bert"], name="bert")
    client.register_model(tiny_models["gpt2"], name="gpt2")
    client.register_dataset(texts=texts, labels=labels, name="toy")
    return texts


def _read_all(client, run, num_layers):
    return np.stack([client.read_activations(run, layer)[0] for layer in range(num_layers + 1)], axis=1)


@pytest.mark.parametrize(("model", "pooling"), [("bert", "cls"), ("bert", "mean"), ("gpt2", "last")])
def test_capture_stores_every_layer(client, registered, tiny_models, model, pooling):
    result = client.capture(model, "toy", pooling=pooling)
    run = client.describe(result.run_key)
    assert (run.status, run.n, run.num_layers, run.width, run.num_shards, run.recorded_shards) == \
        ("committed", 40, 3, 16, 5, 5)
    stored = _read_all(client, result.run_key, 3)
    expected = _reference_pooled(tiny_models[model], registered, pooling)
    np.testing.assert_allclose(stored.astype(np.float32), expected, rtol=2e-3, atol=2e-3)
    assert stored.dtype == np.float16
    _, ids = client.read_activations(result.run_key, 0)
    assert ids[:2] == ["row:0", "row:1"]


def test_same_request_is_a_cache_hit(client, registered):
    first = client.capture("bert", "toy")
    again = client.capture("bert", "toy")
    assert not first.cache_hit and again.cache_hit and again.run_key == first.run_key
    assert len(client.runs()) == 1


def test_concurrent_identical_requests_join_one_job(client, tiny_models):
    client.register_model(tiny_models["bert"], name="bert")
    client.register_dataset(texts=sentences(400, seed=3), name="bigger")
    results = {}

    def go(i):
        results[i] = client.submit_capture("bert", "bigger")

    threads = [threading.Thread(target=go, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    jobs = {r.job_id for r in results.values()}
    assert len(jobs) == 1, "identical concurrent captures must share one job"
    assert sum(r.joined for r in results.values()) == 2
    final = client.wait(jobs.pop())
    assert final.status == "done" and client.describe(final.target).status == "committed"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_other_storage_dtypes(client, registered, tiny_models, dtype):
    run = client.capture("bert", "toy", dtype=dtype).run_key
    stored = _read_all(client, run, 3)
    assert stored.dtype == np.float32
    expected = _reference_pooled(tiny_models["bert"], registered, "cls")
    # the reference runs on the CPU; on a GPU cluster the capture computed on the GPU, whose float32
    # kernels round differently (another summation order, another attention kernel)
    on_gpu = bool(ray.cluster_resources().get("GPU"))
    tol = (1e-4 if on_gpu else 1e-5) if dtype == "float32" else 1e-2
    np.testing.assert_allclose(stored, expected, rtol=tol, atol=tol)
    if dtype == "bfloat16" and not on_gpu:  # the bf16 values are exactly representable: the cast is the only loss
        np.testing.assert_array_equal(stored, torch.from_numpy(expected).bfloat16().float().numpy())


def test_token_level_capture(client, registered, tiny_models):
    run = client.capture("bert", "toy", pooling="tokens").run_key
    info = client.describe(run)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_models["bert"])
    counts = [len(tok(t)["input_ids"]) for t in registered]
    assert info.rows == sum(counts) and info.n == 40
    values, ids = client.read_activations(run, 2)
    assert values.shape == (sum(counts), 16) and ids == []
    # every prompt spans its own token rows, across shard and task boundaries (8-token shards; a
    # task computes several, shards_per_task): compare all against hand-computed hidden states
    from transformers import AutoModel

    model = AutoModel.from_pretrained(tiny_models["bert"]).eval()
    starts = np.concatenate([[0], np.cumsum(counts)])
    with torch.no_grad():
        for i, text in enumerate(registered):
            hs = model(**tok([text], return_tensors="pt"), output_hidden_states=True).hidden_states[2][0]
            np.testing.assert_allclose(values[starts[i]:starts[i + 1]].astype(np.float32), hs.numpy(), atol=2e-3)


def test_token_layouts_come_from_one_warm_process_started_again_when_lost(tmp_path, tiny_models):
    """A server lays out token-level runs in one `TokenLayouts` actor (its tokenizers stay loaded):
    one killed for good is started again on the next layout, and it stops with its server."""
    running = start_server(make_settings(tmp_path / "layouts"))
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
            again = other.capture("bert", "few", pooling="tokens", max_len=5).run_key
            assert other.describe(again).rows < other.describe(shorter).rows
            assert ray.get_actor(name) != layouts
    finally:
        running.stop()
    # a server of the same store started at once: the stopped one's actor may still hold the name
    running = start_server(make_settings(tmp_path / "layouts"))
    try:
        with Client(f"127.0.0.1:{running.port}") as other:
            assert other.describe(other.capture("bert", "few", pooling="tokens", max_len=4).run_key).rows
    finally:
        running.stop()
    deadline = time.monotonic() + 30
    while name in ray.util.list_named_actors() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert name not in ray.util.list_named_actors()


def test_token_level_tasks_run_full_batches():
    """A token-level capture task spans enough shards for TOKEN_BATCHES_PER_TASK full batches; a
    pooled shard of at least a batch is a task of its own."""
    from actstore.server.capture_job import TOKEN_BATCHES_PER_TASK, shards_per_task
    from actstore.store.array_store import RunLayout

    tokens = RunLayout(n=400, rows=10_400, num_states=7, width=384, dtype="float16", pooling="tokens",
                       shard_rows=256)  # 26 tokens a prompt: ~9.8 prompts a shard
    per_task = shards_per_task(tokens, batch_size=32)
    assert per_task == int(np.ceil(TOKEN_BATCHES_PER_TASK * 32 / (256 * 400 / 10_400)))
    assert per_task * 256 * 400 / 10_400 >= TOKEN_BATCHES_PER_TASK * 32
    pooled = RunLayout(n=400, rows=400, num_states=7, width=384, dtype="float16", pooling="mean", shard_rows=256)
    assert shards_per_task(pooled, batch_size=32) == 1
    assert shards_per_task(RunLayout(n=400, rows=400, num_states=7, width=384, dtype="float16", pooling="mean",
                                     shard_rows=8), batch_size=32) == 4


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
    reference = _read_all(client, client.capture("bert", "big").run_key, reference_model.num_layers)

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
            stored = _read_all(other, final.target, model.num_layers)
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


NO_FREE_GPU = """
import os, sys, time
import ray
from actstore.client import Client
from actstore.errors import Unavailable
from actstore.workers.cluster import WORKER_ENV
from tests.factories import sentences

store, model = sys.argv[1], sys.argv[2]
os.environ.update(WORKER_ENV)
# a cluster whose one GPU (a logical one: Ray schedules on it, torch sees none) is held by other work
ray.init(address="local", num_cpus=2, num_gpus=1, _node_ip_address="127.0.0.1", include_dashboard=False,
         log_to_driver=False)
holder = ray.remote(num_gpus=1)(lambda: time.sleep(3600)).remote()
while ray.available_resources().get("GPU", 0) >= 1:
    time.sleep(0.1)
with Client.embedded(store, shard_rows=8, capture_batch_size=8, replica_start_seconds=40,
                     resume_on_start=False) as client:
    client.register_model(model, name="bert")
    client.register_dataset(texts=sentences(24), name="toy")
    started = time.monotonic()
    try:
        client.capture("bert", "toy")
        print("captured while the GPU was held")
    except Unavailable as exc:
        print(f"UNAVAILABLE after {time.monotonic() - started:.0f} s: {exc}")
    ray.cancel(holder, force=True)
    run = client.capture("bert", "toy").run_key
    print("then:", client.describe(run).status)
    # the capture's replica now idles on the GPU; a metric job asking for a GPU share has it
    # released (it waited out actor_idle_seconds, 120 s, before)
    started = time.monotonic()
    client.cka(run, run, layers_a=[1], layers_b=[2])
    print(f"cka after {time.monotonic() - started:.0f} s")
"""


def test_one_gpu_shared_by_other_work_captures_and_metric_jobs(tmp_path, tiny_models):
    """On a cluster whose GPU other work holds, a capture's GPU replica waits in Ray's queue: the
    capture fails after `replica_start_seconds` (40 s: a loaded machine took over 15 s to load the
    model once the GPU was free) saying so, and succeeds once the GPU is free; a
    metric job then gets the GPU from the idle replica at once. Its own local Ray (a subprocess)
    with one logical GPU: no GPU is needed to schedule on one."""
    script = tmp_path / "no_free_gpu.py"
    script.write_text(textwrap.dedent(NO_FREE_GPU))
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "store"), str(tiny_models["bert"])],
                          capture_output=True, text=True, timeout=240, cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-3000:]
    first, then, query = done.stdout.strip().splitlines()[-3:]
    assert first.startswith("UNAVAILABLE after"), done.stdout
    assert int(first.split()[2]) < 80, first
    assert "did not start within 40 s: no GPU came free (0 of the cluster's 1 free now)" in first, first
    assert then == "then: committed", done.stdout
    assert int(query.split()[2]) < 30, query


LOGICAL_GPU_PATH = """
import json, os, sys
import numpy as np
import ray
from actstore.client import Client
from actstore.workers.cluster import WORKER_ENV
from tests.factories import sentences

store, model, out = sys.argv[1], sys.argv[2], sys.argv[3]
os.environ.update(WORKER_ENV)
# one logical GPU (Ray schedules on it, torch sees none): the GPU path's orchestration, with torch on the CPU
ray.init(address="local", num_cpus=2, num_gpus=1, _node_ip_address="127.0.0.1", include_dashboard=False,
         log_to_driver=False)
with Client.embedded(store, shard_rows=8, capture_batch_size=8, capture_replicas_per_gpu=2,
                     resume_on_start=False) as client:
    registered = client.register_model(model, name="gpt2")
    client.register_dataset(texts=sentences(40), name="toy")
    service = client._server.service
    for pooling in ("last", "tokens"):
        run = client.capture("gpt2", "toy", pooling=pooling).run_key
        values = np.stack([client.read_activations(run, layer)[0] for layer in range(registered.num_layers + 1)],
                          axis=1)
        np.save(os.path.join(out, pooling + ".npy"), values)
    actors, per_replica = service.capture_pool.acquire(registered.digest, service.catalog.models.get("gpt2").path)
    spent = ray.get([actor.spent.remote() for actor in actors])
    print(json.dumps({"replicas": len(actors), "per_replica": per_replica, "tasks": [s["tasks"] for s in spent]}))
"""


def test_the_gpu_path_on_a_logical_gpu_stores_what_the_cpu_path_stores(client, registered, tiny_models, tmp_path):
    """The GPU path's orchestration without a GPU: on a local Ray with one logical GPU, two
    replicas share it (`capture_replicas_per_gpu=2`, half a GPU and no CPU each), each works on
    `gpu_capture_tasks` tasks at once and hands its shards to one-CPU write tasks. A last-token
    and a token-level capture of GPT-2 store what this session's CPU path stores (to float16
    rounding: thread counts differ) and what transformers computes, and both replicas worked."""
    import json

    script = tmp_path / "logical_gpu.py"
    script.write_text(textwrap.dedent(LOGICAL_GPU_PATH))
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "logical-gpu"), str(tiny_models["gpt2"]),
                           str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["replicas"] == 2 and report["per_replica"] == make_settings(tmp_path).gpu_capture_tasks, report
    assert all(tasks > 0 for tasks in report["tasks"]), report
    for pooling in ("last", "tokens"):
        on_gpu_path = np.load(tmp_path / f"{pooling}.npy")
        here = _read_all(client, client.capture("gpt2", "toy", pooling=pooling).run_key, 3)
        assert on_gpu_path.shape == here.shape and on_gpu_path.dtype == here.dtype == np.float16
        np.testing.assert_allclose(on_gpu_path.astype(np.float32), here.astype(np.float32), rtol=2e-3, atol=2e-3)
    expected = _reference_pooled(tiny_models["gpt2"], registered, "last")
    np.testing.assert_allclose(np.load(tmp_path / "last.npy").astype(np.float32), expected, rtol=2e-3, atol=2e-3)


def test_cancelled_capture_resumes_with_only_missing_shards(client, tiny_models):
    client.register_model(tiny_models["bert"], name="bert")
    client.register_dataset(texts=sentences(800, seed=7), name="big")
    job = client.submit_capture("bert", "big")
    for state in client.watch(job.job_id):
        if state.done >= 3:
            client.cancel(job.job_id)
            break
    with pytest.raises(Exception, match="cancelled"):
        client.wait(job.job_id)
    partial = client.describe(job.target)
    assert partial.status == "running" and 0 < partial.recorded_shards < partial.num_shards
    resumed = client.submit_capture("bert", "big")
    assert resumed.job_id != job.job_id and resumed.target == job.target
    first = next(s for s in client.watch(resumed.job_id) if s.total)
    assert first.done >= partial.recorded_shards, "stored shards must not be computed again"
    final = client.wait(resumed.job_id)
    assert final.status == "done"
    assert client.describe(job.target).recorded_shards == 100


def test_bad_capture_requests(client, registered, tiny_models):
    with pytest.raises(NotFound, match="unknown model 'nope'"):
        client.capture("nope", "toy")
    with pytest.raises(NotFound, match="unknown dataset"):
        client.capture("bert", "nope")
    with pytest.raises(InvalidArgument, match="causal LM"):
        client.capture("gpt2", "toy", pooling="cls")
    with pytest.raises(InvalidArgument, match="empty"):
        client.register_dataset(texts=[], name="empty")
    assert client.runs() == []


def test_max_len_beyond_the_model_is_refused_up_front(server, client, registered):
    positions = server.service.catalog.models.get("gpt2").max_positions
    with pytest.raises(InvalidArgument, match=f"at most {positions}"):
        client.capture("gpt2", "toy", max_len=positions + 1)
    assert client.runs() == []


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
