"""Capture end to end: a real server on loopback, a real local Ray, real DuckDB and Zarr."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import ray
import torch

from actstore.errors import InvalidArgument, NotFound
from actstore.server.capture_job import shards_per_task
from tests.factories import sentences
from tests.server.captured import module_registered_fixture, read_all, reference_pooled, registered_fixture  # noqa: F401

# The tests on the module's server (`module_client`) each capture a request no other test makes, so
# they share its warm replicas and still compute every run they check.


@pytest.mark.parametrize(("model", "pooling"), [("bert", "cls"), ("bert", "mean"), ("gpt2", "last")])
def test_capture_stores_every_layer(module_client, module_registered, tiny_models, model, pooling):
    client, registered = module_client, module_registered
    result = client.capture(model, "toy", pooling=pooling)
    run = client.describe(result.run_key)
    assert (run.status, run.n, run.num_layers, run.width, run.num_shards, run.recorded_shards) == \
        ("committed", 40, 3, 16, 5, 5)
    stored = read_all(client, result.run_key, 3)
    expected = reference_pooled(tiny_models[model], registered, pooling)
    np.testing.assert_allclose(stored.astype(np.float32), expected, rtol=2e-3, atol=2e-3)
    assert stored.dtype == np.float16
    _, ids = client.read_activations(result.run_key, 0)
    assert ids[:2] == ["row:0", "row:1"]



def test_same_request_is_a_cache_hit(module_client, module_registered):
    client = module_client
    before = len(client.runs())
    first = client.capture("bert", "toy", max_len=12)
    again = client.capture("bert", "toy", max_len=12)
    assert not first.cache_hit and again.cache_hit and again.run_key == first.run_key
    assert len(client.runs()) == before + 1
    listed = next(r for r in client.runs() if r.run_key == first.run_key)
    assert listed.status == "committed" and listed.recorded_shards == listed.num_shards == client.describe(
        first.run_key).recorded_shards > 0



def test_concurrent_identical_requests_join_one_job(client, tiny_models):
    # a fresh server: the job waits for its replica to start, so every request arrives while it runs
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
def test_other_storage_dtypes(module_client, module_registered, tiny_models, dtype):
    client, registered = module_client, module_registered
    run = client.capture("bert", "toy", dtype=dtype).run_key
    stored = read_all(client, run, 3)
    assert stored.dtype == np.float32
    expected = reference_pooled(tiny_models["bert"], registered, "cls")
    # the reference runs on the CPU; on a GPU cluster the capture computed on the GPU, whose float32
    # kernels round differently (another summation order, another attention kernel)
    on_gpu = bool(ray.cluster_resources().get("GPU"))
    tol = (1e-4 if on_gpu else 1e-5) if dtype == "float32" else 1e-2
    np.testing.assert_allclose(stored, expected, rtol=tol, atol=tol)
    if dtype == "bfloat16" and not on_gpu:  # the bf16 values are exactly representable: the cast is the only loss
        np.testing.assert_array_equal(stored, torch.from_numpy(expected).bfloat16().float().numpy())



def test_token_level_capture(module_client, module_registered, tiny_models):
    client, registered = module_client, module_registered
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



def test_token_level_tasks_run_full_batches():
    """A token-level capture task spans enough shards for TOKEN_BATCHES_PER_TASK full batches; a
    pooled shard of at least a batch is a task of its own."""
    from actstore.server.capture_job import TOKEN_BATCHES_PER_TASK
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


def test_token_shards_sized_for_the_store_hold_the_same_rows(tmp_path, module_server, module_client, tiny_models):
    """A token-level run whose shards grew to the object size (`shard_mb`, here a few KB to fit a
    tiny model's rows) has far fewer shards and stores the same rows as one of 8-token shards (the
    module's server: its default `shard_mb` is far above this run's size): the same offsets and
    values (to the float rounding of other batches), a clean verify, and its chunk rows one per
    layer of each of its shards."""
    from actstore.client import Client
    from actstore.server.app import start_server
    from tests.conftest import make_settings

    texts = sentences(200, seed=3)

    def capture(running, c):
        c.register_model(tiny_models["bert"], name="bert")
        c.register_dataset(texts=texts, name="texts")
        run = c.capture("bert", "texts", pooling="tokens").run_key
        info = c.describe(run)
        assert c.verify([run]).runs[0].status == "ok"
        layout = running.service.arrays.layout(run)
        chunks = running.service.catalog.chunks.rows_total(run)
        return info, layout, chunks, read_all(c, run, info.num_layers)

    small, small_layout, small_rows, small_values = capture(module_server, module_client)
    running = start_server(make_settings(tmp_path / "grown", shard_mb=0.012))
    try:
        with Client(f"127.0.0.1:{running.port}") as c:
            grown, grown_layout, grown_rows, grown_values = capture(running, c)
    finally:
        running.stop()
    assert small_layout.shard_rows == 8 and grown_layout.shard_rows > 8 * 8 and grown_layout.shard_rows % 8 == 0
    assert grown.num_shards == -(-grown.rows // grown_layout.shard_rows) < small.num_shards // 8
    assert grown.rows == small.rows and small_rows == grown_rows == small.rows
    np.testing.assert_allclose(grown_values.astype(np.float32), small_values.astype(np.float32), atol=2e-3)
