"""Readers against a real server: `client.batches` (exact coverage across ranks, determinism,
messages split below the chunk size), the torch dataset, `client.to_xarray` and DataFrames.

The server's ReadActivations messages are capped at 600 bytes here, so every batch travels as
several parts and the client's reassembly is exercised."""

from __future__ import annotations

import numpy as np
import pytest

from actstore.client import Client
from actstore.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from actstore.server.app import start_server
from tests.conftest import make_settings
from tests.factories import sentences

N = 50  # shards of 8 rows: 7 shards, the last of 2 rows


@pytest.fixture(scope="module")
def server(tmp_path_factory, ray_cluster):
    running = start_server(make_settings(tmp_path_factory.mktemp("store"), read_chunk_bytes=600,
                                         batch_buffer_bytes=64 << 10))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server):
    with Client(f"127.0.0.1:{server.port}") as c:
        yield c


@pytest.fixture(scope="module")
def runs(client, tiny_models):
    client.register_model(tiny_models["bert"], name="bert")
    client.register_dataset(texts=sentences(N, seed=5), labels=[i % 3 for i in range(N)], name="toy")
    pooled = client.capture("bert", "toy", pooling="mean").run_key
    tokens = client.capture("bert", "toy", pooling="tokens").run_key
    return {"pooled": pooled, "tokens": tokens}


def stored(client, run):
    info = client.describe(run)
    return np.stack([client.read_activations(run, layer)[0] for layer in range(info.num_layers + 1)], axis=1)


def epoch_rows(client, run, world, **options):
    """Every rank's batches of one epoch, and the run's row indices each rank read."""
    per_rank = [list(client.batches(run, rank=r, world_size=world, **options)) for r in range(world)]
    return per_rank, [np.concatenate([b.rows for b in bs]) if bs else np.empty(0, np.int64) for bs in per_rank]


@pytest.mark.parametrize("world", [1, 2, 3, 4, 9])
def test_every_sample_exactly_once_per_epoch_across_ranks(client, runs, world):
    everything = stored(client, runs["pooled"])
    ids = [f"row:{i}" for i in range(N)]
    for epoch in (0, 1):
        per_rank, rows = epoch_rows(client, runs["pooled"], world, batch_size=6, seed=11, epoch=epoch,
                                    layers=[0, 3])
        assert sorted(np.concatenate(rows).tolist()) == list(range(N))
        counts = [len(r) for r in rows]
        assert max(counts) - min(counts) <= 8  # uneven: at most one shard's rows apart
        for batches in per_rank:
            assert all(len(b) == 6 for b in batches[:-1])
            for b in batches:
                assert b.layers == [0, 3] and b.values.dtype == np.float16
                np.testing.assert_array_equal(b.values, everything[b.rows][:, [0, 3]])
                np.testing.assert_array_equal(b.labels, b.rows % 3)
                assert b.sample_ids == [ids[i] for i in b.rows]
                np.testing.assert_array_equal(b.layer(3), everything[b.rows, 3])


def test_same_seed_same_batches_and_each_epoch_its_own_order(client, runs):
    run = runs["pooled"]

    def order(**kw):
        return [b.rows.tolist() for b in client.batches(run, batch_size=5, **kw)]

    assert order(seed=3, epoch=0) == order(seed=3, epoch=0)
    assert order(seed=3, epoch=0) != order(seed=3, epoch=1)
    assert order(seed=3, epoch=0) != order(seed=4, epoch=0)
    assert sorted(sum(order(seed=3, epoch=1), [])) == list(range(N))


def test_sequential_read_is_store_order_and_drop_last_drops_the_short_batch(client, runs):
    batches = list(client.batches(runs["pooled"], batch_size=8, shuffle=False))
    assert np.concatenate([b.rows for b in batches]).tolist() == list(range(N))
    np.testing.assert_array_equal(np.concatenate([b.values for b in batches]), stored(client, runs["pooled"]))
    dropped = list(client.batches(runs["pooled"], batch_size=8, seed=1, drop_last=True))
    assert [len(b) for b in dropped] == [8] * (N // 8)


def test_the_server_buffer_is_bounded_by_the_parameter(client, runs):
    """The first message says how many shards' rows the server's buffer may hold for the stream:
    buffer_shards, raised only to fit one batch plus a shard (shards of 8 rows here)."""
    from actstore._proto.actstore.v1 import readers_pb2 as pb

    def held(**options):
        request = pb.BatchesRequest(run=runs["pooled"], world_size=1, **options)
        return next(iter(client._connection.readers.ReadBatches(request))).buffer_shards

    assert held(batch_size=4, shuffle=True, buffer_shards=3) == 3
    assert held(batch_size=4, shuffle=True) == 8  # the default
    assert held(batch_size=20, shuffle=True, buffer_shards=2) == 4  # ceil(20 / 8) + 1
    assert held(batch_size=4, shuffle=False) == 1  # in order: one shard (and the rows carried over)


def test_token_level_batches_are_tokens_with_their_sample(client, runs):
    run = runs["tokens"]
    info = client.describe(run)
    per_rank, rows = epoch_rows(client, run, 3, batch_size=16, seed=2)
    assert sorted(np.concatenate(rows).tolist()) == list(range(info.rows))
    offsets = np.asarray(client.to_xarray(run).coords["sample"])  # each token's sample index
    first = per_rank[0][0]
    assert first.sample_ids == [f"row:{offsets[r]}" for r in first.rows]
    np.testing.assert_array_equal(first.labels, offsets[first.rows] % 3)
    np.testing.assert_array_equal(first.values, stored(client, run)[first.rows])


def test_bad_requests_say_what_to_do(client, runs):
    run = runs["pooled"]
    cases = [({"batch_size": 0}, InvalidArgument, "batch_size 0 must be >= 1"),
             ({"batch_size": 4, "rank": 2, "world_size": 2}, InvalidArgument, "rank 2 is out of range"),
             ({"batch_size": 4, "layers": [9]}, InvalidArgument, "layer 9 is out of range"),
             ({"batch_size": 4, "buffer_shards": 1}, InvalidArgument, "buffer_shards 1 must be >= 2")]
    for options, error, message in cases:
        with pytest.raises(error, match=message):
            next(client.batches(run, **options))
    with pytest.raises(NotFound):
        next(client.batches("0123456789abcdef", batch_size=4))
    # 64 KiB buffer limit: 200 shards x 8 rows x 4 layers x 16 x 2 bytes = 200 KiB
    with pytest.raises(ResourceExhausted, match="ACTSTORE_BATCH_BUFFER_BYTES"):
        next(client.batches(run, batch_size=4, buffer_shards=200))


def test_torch_dataset_splits_by_rank_and_dataloader_worker(client, runs):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    dataset = client.torch_dataset(runs["pooled"], batch_size=4, seed=9, rank=1, world_size=2)
    dataset.set_epoch(3)
    in_process = [b["rows"] for b in DataLoader(dataset, batch_size=None)]
    expected = [b.rows.tolist() for b in client.batches(runs["pooled"], batch_size=4, seed=9, epoch=3, rank=1,
                                                          world_size=2)]
    assert [r.tolist() for r in in_process] == expected
    rows = []
    for rank in (0, 1):
        loader = DataLoader(client.torch_dataset(runs["pooled"], batch_size=4, seed=9, rank=rank, world_size=2),
                            batch_size=None, num_workers=2, multiprocessing_context="spawn")
        batches = list(loader)
        assert all(b["values"].dtype == torch.float32 and b["values"].shape[1:] == (4, 16) for b in batches)
        rows.extend(r for b in batches for r in b["rows"].tolist())
    assert sorted(rows) == list(range(N))  # 2 ranks x 2 workers: still every sample once


def test_to_xarray_is_lazy_named_and_equal_to_the_stored_values(client, runs):
    run = runs["pooled"]
    array = client.to_xarray(run)
    assert array.dims == ("sample", "layer", "feature") and array.shape == (N, 4, 16)
    assert not isinstance(array.variable._data, np.ndarray)  # nothing read yet
    assert array.coords["sample_id"].values.tolist() == [f"row:{i}" for i in range(N)]
    np.testing.assert_array_equal(array.coords["label"], np.arange(N) % 3)
    np.testing.assert_array_equal(array.values, stored(client, run))
    picked = array.sel(layer=2).isel(sample=[3, 17, 40])
    np.testing.assert_array_equal(picked.values, stored(client, run)[[3, 17, 40], 2])
    assert array.dtype == np.float16


def test_to_xarray_needs_a_store_this_machine_can_see(client, runs):
    from dataclasses import replace

    from actstore.client.xarray_view import open_run

    elsewhere = replace(client.locate_run(runs["pooled"]), store="/nonexistent/store")
    with pytest.raises(FailedPrecondition, match="not a directory this machine can see"):
        open_run(elsewhere)


def test_listings_and_results_as_dataframes(client, runs):
    frame = client.runs().to_pandas()
    assert set(frame["run_key"]) == set(runs.values()) and {"pooling", "n", "status"} <= set(frame.columns)
    assert client.models().to_pandas()["aliases"].tolist() == [["bert"]]
    assert client.datasets().to_pandas()["n"].tolist() == [N]
    assert len(client.jobs().to_pandas()) == len(client.jobs())
    cka = client.cka(runs["pooled"], layers_a=[0, 2], layers_b=[1, 2, 3])
    long = cka.to_pandas()
    assert list(long.columns) == ["layer_a", "layer_b", "value"] and len(long) == 6
    for row in long.itertuples():
        assert row.value == cka.biased[[0, 2].index(row.layer_a), [1, 2, 3].index(row.layer_b)]
    np.testing.assert_array_equal(cka.to_pandas(debiased=True)["value"], cka.debiased.ravel())
