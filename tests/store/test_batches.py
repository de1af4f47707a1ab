"""The epoch partition and the shuffle buffer of `store.batches`, over a real Zarr run whose every
value names its row, so each batch can be checked row by row."""

from __future__ import annotations

import numpy as np
import pytest

from actstore.store import batches
from actstore.store.array_store import RunLayout
from actstore.store.format.arrays import ZarrArrayStore

SHARD_ROWS = 8
N = 61  # 8 shards, the last of 5 rows


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A float32 run whose value at (row, layer, feature) is row * 100 + layer."""
    store = ZarrArrayStore(tmp_path_factory.mktemp("zarr"))
    layout = RunLayout(n=N, rows=N, num_states=3, width=4, dtype="float32", pooling="mean", shard_rows=SHARD_ROWS)
    store.create_run("r" * 64, layout, [f"s{i}" for i in range(N)], None, None)
    for shard in range(layout.num_shards):
        lo, hi = layout.shard_range(shard)
        values = (np.arange(lo, hi)[:, None, None] * 100 + np.arange(3)[None, :, None]) * np.ones((1, 1, 4))
        store.write_shard("r" * 64, shard, values.astype(np.float32), values.sum(axis=0))
    return store, layout


def stream(run, *, shuffle=True, seed=0, epoch=0, rank=0, world=1, batch=5, k=3, layers=(0, 2), stats=None):
    store, layout = run
    shards = batches.shards_of_rank(layout, rank, world, shuffle, seed, epoch)

    def read(shard):
        lo, hi = layout.shard_range(shard)
        return np.moveaxis(store.read_layers("r" * 64, list(layers), lo, hi), 0, 1)

    if not shuffle:
        return list(batches.sequential_batches(read, layout, shards, batch))
    rng = np.random.default_rng([seed, epoch, rank])
    return list(batches.shuffled_batches(read, layout, shards, batch, k, rng, (len(layers), 4), np.dtype(np.float32),
                                         stats))


def rows_of(batch_list) -> np.ndarray:
    return np.concatenate([rows for _, rows in batch_list]) if batch_list else np.empty(0, np.int64)


@pytest.mark.parametrize("world", [1, 2, 3, 5, 8, 11])
def test_every_shard_goes_to_exactly_one_rank_and_counts_differ_by_at_most_a_shard(run, world):
    _, layout = run
    for epoch in (0, 1):
        dealt = [batches.shards_of_rank(layout, r, world, True, 7, epoch) for r in range(world)]
        assert sorted(s for shards in dealt for s in shards) == list(range(layout.num_shards))
        counts = [batches.rows_of_rank(layout, r, world, True, 7, epoch) for r in range(world)]
        assert sum(counts) == N and max(counts) - min(counts) <= SHARD_ROWS


@pytest.mark.parametrize(("world", "batch", "k"), [(1, 5, 3), (2, 8, 2), (3, 3, 2), (4, 20, 2), (11, 5, 3)])
def test_every_row_once_per_epoch_across_ranks_with_its_own_values(run, world, batch, k):
    seen = []
    for rank in range(world):
        out = stream(run, rank=rank, world=world, batch=batch, k=k, epoch=2)
        for values, rows in out:
            np.testing.assert_array_equal(values[:, :, 0], rows[:, None] * 100 + np.array([0, 2]))
        assert all(len(rows) == batch for _, rows in out[:-1])  # only a rank's last batch is short
        seen.append(rows_of(out))
    everything = np.concatenate(seen)
    assert len(everything) == N and sorted(everything) == list(range(N))


def test_the_buffer_never_holds_more_than_k_shards_of_rows(run):
    for k, batch in [(2, 3), (2, 8), (3, 8), (4, 1)]:
        stats: list[batches.BufferStats] = []
        stream(run, k=k, batch=batch, stats=stats)
        (held,) = stats
        assert held.capacity_rows == k * SHARD_ROWS and 0 < held.peak_rows <= k * SHARD_ROWS
    stats = []
    stream(run, k=2, batch=20, stats=stats)  # a batch needs 3 shards: K is raised to ceil(20 / 8) + 1
    assert stats[0].capacity_rows == 4 * SHARD_ROWS and stats[0].peak_rows <= 4 * SHARD_ROWS


def test_same_seed_same_batches_other_epoch_or_seed_other_order(run):
    first, again = stream(run, seed=3, epoch=1), stream(run, seed=3, epoch=1)
    assert [r.tolist() for _, r in first] == [r.tolist() for _, r in again]
    other_epoch, other_seed = rows_of(stream(run, seed=3, epoch=2)), rows_of(stream(run, seed=4, epoch=1))
    assert not np.array_equal(rows_of(first), other_epoch) and not np.array_equal(rows_of(first), other_seed)
    assert sorted(other_epoch) == sorted(rows_of(first)) == list(range(N))


def test_shuffling_mixes_rows_across_the_shards_in_the_buffer(run):
    rows = rows_of(stream(run, k=4, batch=8))
    first_batch_shards = {int(r) // SHARD_ROWS for r in rows[:8]}
    assert len(first_batch_shards) > 1  # a batch is not one shard in order
    assert not np.array_equal(rows, np.sort(rows))


def test_without_shuffle_rows_come_in_store_order_spanning_shards(run):
    out = stream(run, shuffle=False, batch=6)
    assert rows_of(out).tolist() == list(range(N))
    assert [len(r) for _, r in out] == [6] * 10 + [1]
    two = [rows_of(stream(run, shuffle=False, rank=r, world=2, batch=6)) for r in (0, 1)]
    assert two[0][:8].tolist() == list(range(8)) and two[1][:8].tolist() == list(range(8, 16))


def test_a_buffer_refuses_rows_beyond_its_capacity():
    buffer = batches.ShuffleBuffer(4, (1,), np.dtype(np.float32), np.random.default_rng(0))
    buffer.add(np.zeros((3, 1), np.float32), np.arange(3))
    with pytest.raises(ValueError, match="do not fit"):
        buffer.add(np.zeros((2, 1), np.float32), np.arange(3, 5))
