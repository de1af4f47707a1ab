"""The capture worker: how a task batches its samples and puts their tokens back in order, and a
replica on its own (a Ray actor on the session's local Ray) beside a real server's store, whose
two ways of writing its shards store the same thing."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import ray
import torch

from actstore.modeling.adapter import ModelAdapter
from actstore.modeling.pooling import pool_tokens
from actstore.workers.capture import (
    CapturePlan,
    ShardCapturer,
    layer_tokens,
    length_batches,
    prepare_shards,
    token_order,
)
from tests.factories import sentences


@pytest.mark.parametrize(("pooling", "writes"), [("tokens", "threads"), ("mean", "threads"),
                                                 ("tokens", "ray-tasks"), ("mean", "ray-tasks")])
def test_shards_written_by_a_gpu_replicas_writers_equal_the_replicas_own(module_server, module_client, tiny_models,
                                                                          pooling, writes):
    """A GPU replica hands its shards' writes to its writer threads, or to one-CPU Ray tasks
    (`writes`); nothing about that needs a GPU, so here a CPU replica does it, beside one that
    writes in its tasks' own threads: the values, layer sums, token ids, chunk rows and statistics
    of every shard are the same. One server for the four: each pooling's run is captured once, and
    each writes mode copies it into a run of its own."""
    server, client = module_server, module_client
    client.register_model(tiny_models["bert"], name="bert")
    client.register_dataset(texts=sentences(30), name="toy")
    run = client.capture("bert", "toy", pooling=pooling)  # the server's CPU replica: written in the replica
    service = server.service
    arrays, record = service.arrays, service.catalog.runs.find(run.run_key)
    model = service.catalog.models.get(record.model_digest)
    dataset = service.catalog.datasets.get(record.dataset_digest)
    layout = arrays.layout(run.run_key)
    copy = hashlib.sha256(f"{pooling}-{writes}".encode()).hexdigest()
    arrays.create_run(copy, layout, arrays.sample_ids(run.run_key), arrays.labels(run.run_key),
                      arrays.offsets(run.run_key), arrays.spec(run.run_key))
    plan = CapturePlan(run_key=copy, dataset_path=dataset.path, max_len=record.max_len, batch_size=8, layout=layout)
    replica = ray.remote(ShardCapturer).options(max_concurrency=2).remote(
        model.path, service.store, None, 1, writes, 3)
    try:
        shards = tuple(range(layout.num_shards))
        tables = ray.get([replica.capture.remote(plan, shards[i:i + 3]) for i in range(0, len(shards), 3)])
    finally:
        ray.kill(replica)

    rows = [row for task in tables for row in task.tables]
    assert [r["shard"][0] for r in rows] == list(shards)
    kept = arrays.chunk_rows(run.run_key)
    for table in rows:
        assert set(table["run_key"]) == {copy}
        for column in ("layer", "rows", "checksum", "min", "max", "nan_count", "inf_count"):
            expected = [v for s, v in zip(kept["shard"], kept[column]) if s == table["shard"][0]]
            assert table[column] == expected, column
    layers = list(range(layout.num_states))
    np.testing.assert_array_equal(arrays.read_layers(copy, layers, 0, layout.rows),
                                  arrays.read_layers(run.run_key, layers, 0, layout.rows))
    for shard in shards:
        np.testing.assert_array_equal(arrays.layer_sums(copy, shard), arrays.layer_sums(run.run_key, shard))
        assert arrays.shard_details(copy, shard)[1] == arrays.shard_details(run.run_key, shard)[1]
    if pooling == "tokens":
        np.testing.assert_array_equal(arrays.token_ids(copy, 0, layout.rows),
                                      arrays.token_ids(run.run_key, 0, layout.rows))


def test_length_batches_cover_the_task_in_equal_batches_sorted_by_length():
    rng = np.random.default_rng(0)
    for _ in range(200):
        lengths = rng.integers(1, 60, size=int(rng.integers(1, 300)))
        size = int(rng.integers(1, 40))
        groups = length_batches(lengths, size)
        members = np.concatenate(groups)
        assert sorted(members.tolist()) == list(range(len(lengths)))
        assert max(len(g) for g in groups) <= size and max(map(len, groups)) - min(map(len, groups)) <= 1
        assert len(groups) == -(-len(lengths) // size)
        assert np.all(np.diff(lengths[members]) >= 0)


def test_token_order_puts_every_token_back_in_sample_order():
    """Against a plain list of (sample, position) pairs in the order the batches give them."""
    rng = np.random.default_rng(1)
    for _ in range(200):
        lengths = rng.integers(1, 9, size=int(rng.integers(1, 40)))
        members = np.concatenate(length_batches(lengths, int(rng.integers(1, 10))))
        given = [(sample, position) for sample in members for position in range(lengths[sample])]
        expected = [given.index((sample, position)) for sample in range(len(lengths))
                    for position in range(lengths[sample])]
        assert token_order(members, lengths[members]).tolist() == expected


@pytest.mark.parametrize("model", ["bert", "gpt2"])
def test_a_selected_batch_is_what_encoding_its_texts_alone_gives(tiny_models, model):
    adapter = ModelAdapter.load(tiny_models[model], device="cpu")
    texts = sentences(12)
    whole = adapter.encode(texts, 16)
    rows = np.array([7, 2, 9])
    alone = adapter.encode([texts[i] for i in rows], 16)
    picked = whole.select(rows)
    assert picked.n == 3 and picked.inputs.keys() == alone.inputs.keys()
    for name, tensor in alone.inputs.items():
        assert torch.equal(picked.inputs[name], tensor), name
    assert torch.equal(picked.mask, alone.mask)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_prepared_shards_hold_each_shards_stored_numbers_sums_and_extremes(dtype):
    """Against numpy on the same cast: a task's shards prepared at once, the last one short, one
    layer with a NaN and one with an overflow to Inf (float16)."""
    rng = np.random.default_rng(2)
    values = torch.from_numpy(rng.standard_normal((50, 4, 6)).astype(np.float32) * 3)
    values[7, 1, 2] = float("nan")
    values[33, 2, 0] = 1e6  # Inf in float16, finite in bfloat16 and float32
    bounds = [(0, 16), (16, 32), (32, 48), (48, 50)]
    prepared = prepare_shards(values, bounds, dtype)
    cast = values.to(getattr(torch, dtype)).float().numpy().astype(np.float64)  # exact: a wider float
    for (lo, hi), shard in zip(bounds, prepared):
        stored = shard.stored
        assert stored.shape == (hi - lo, 4, 6) and all(shard.layers[layer].flags.c_contiguous for layer in range(4))
        numbers = stored.astype(np.float64) if dtype != "bfloat16" else (
            (stored.astype(np.uint32) << 16).view(np.float32).astype(np.float64))
        np.testing.assert_array_equal(numbers, cast[lo:hi])
        np.testing.assert_array_equal(shard.sums, cast[lo:hi].sum(axis=0))
        lows, highs = shard.extremes
        nans, infs = shard.counts
        for layer in range(4):
            part = cast[lo:hi, layer]
            finite = part[np.isfinite(part)]
            np.testing.assert_array_equal([lows[layer], highs[layer]], [finite.min(), finite.max()])
            assert (nans[layer], infs[layer]) == (np.isnan(part).sum(), np.isinf(part).sum())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("masked", [True, False])
def test_layer_tokens_are_the_pooled_tokens_in_the_storage_dtype(dtype, masked):
    """Each layer's tokens taken out on its own equal `pool_tokens` of the stacked layers, cast:
    the same rows in the same order (padding on either side; no mask: every position, as for
    images), and the same counts."""
    rng = np.random.default_rng(4)
    layers = [torch.from_numpy(rng.standard_normal((5, 9, 6)).astype(np.float32) * 50) for _ in range(4)]
    mask = None
    if masked:
        mask = torch.zeros(5, 9, dtype=torch.long)
        for row, (lo, hi) in enumerate([(0, 9), (0, 3), (4, 9), (0, 1), (2, 7)]):
            mask[row, lo:hi] = 1
    tokens, counts = layer_tokens(layers, mask, dtype)
    expected, expected_counts = pool_tokens(torch.stack(layers), mask)
    assert tokens.dtype == dtype and torch.equal(tokens, expected.to(dtype))
    np.testing.assert_array_equal(counts, expected_counts)
