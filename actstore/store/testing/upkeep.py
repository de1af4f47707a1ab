"""The contract of an ArrayStore backend's upkeep: deleting runs, unknown runs, the store's own
description of its runs (what `catalog rebuild` reads), and integrity (what `verify` reads and a
repair drops). `ArrayStoreContract` is the whole contract: a backend's tests subclass it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from actstore.errors import DataLoss, NotFound
from actstore.store.testing.runs import (
    NUM_STATES,
    SHARD_ROWS,
    WIDTH,
    N,
    RunContract,
    kept_with,
    key,
    make_values,
    pooled_layout,
    same_cells,
    shard_sums,
    token_layout,
)


class ArrayStoreContract(RunContract):
    """Tests every ArrayStore backend must pass (`RunContract` and its upkeep). Override `make_store`."""

    # ---- delete / unknown -----------------------------------------------------------------
    def test_delete_run_removes_everything(self, store):
        run_key, _, _ = self.filled_run(store, name="gone")
        kept, _, kept_numbers = self.filled_run(store, name="kept")
        store.write_means(run_key)
        store.delete_run(run_key)
        for call in (lambda: store.layout(run_key), lambda: store.read_layers(run_key, [0], 0, 1),
                     lambda: store.sample_ids(run_key), lambda: store.labels(run_key),
                     lambda: store.offsets(run_key), lambda: store.means(run_key),
                     lambda: store.nbytes_stored(run_key)):
            with pytest.raises(NotFound):
                call()
        # the other run is untouched
        np.testing.assert_array_equal(store.read_layers(kept, [1], 0, N), self.expected(kept_numbers, [1], 0, N))

    def test_handles_on_the_same_storage_see_each_others_deletes(self, store, tmp_path):
        # the server deletes runs through its handle while long-lived capture actors and metric
        # tasks hold their own handles on the same storage
        run_key, layout, _ = self.filled_run(store)
        other_handle = self.make_store(tmp_path)
        assert other_handle.layout(run_key) == layout
        store.delete_run(run_key)
        with pytest.raises(NotFound):
            other_handle.layout(run_key)
        # a capture of the same key again, by a server with another shard size
        resized = replace(layout, shard_rows=SHARD_ROWS + 1)
        other_handle.create_run(run_key, resized, [f"s{i}" for i in range(N)], None, None)
        assert other_handle.layout(run_key) == resized
        assert store.layout(run_key) == resized

    def test_a_late_write_after_a_delete_never_reads_as_the_run(self, store, tmp_path):
        # a cancelled capture's last task may still write a shard after the server deleted the run
        run_key, layout, _ = self.filled_run(store)
        late = self.make_store(tmp_path)
        stored, numbers = make_values(layout, seed=3)
        late.write_shard(run_key, 1, stored[SHARD_ROWS:2 * SHARD_ROWS], shard_sums(numbers, layout, 1))
        store.delete_run(run_key)
        try:  # a backend may notice the delete, or write into the deleted run's folder
            late.write_shard(run_key, 0, stored[:SHARD_ROWS], shard_sums(numbers, layout, 0))
        except NotFound:
            pass
        assert run_key not in store.run_keys()
        with pytest.raises(NotFound):
            store.layout(run_key)
        self.create(store, run_key, layout)  # captured again: the leftover shard is gone, not read
        with pytest.raises(DataLoss, match="shard 0 .*is missing"):
            store.read_layers(run_key, [0], 0, SHARD_ROWS)

    def test_a_deleted_run_can_be_created_again(self, store):
        run_key, layout, _ = self.filled_run(store)
        store.delete_run(run_key)
        other = replace(layout, dtype="float16")
        self.create(store, run_key, other)
        assert store.layout(run_key) == other
        _, numbers = self.write_all(store, run_key, other, seed=5)
        np.testing.assert_array_equal(store.read_layers(run_key, [0], 0, N), self.expected(numbers, [0], 0, N))

    def test_unknown_run_raises_not_found(self, store):
        self.filled_run(store)  # the store is not empty
        unknown = key("never created")
        for call in (lambda: store.layout(unknown), lambda: store.read_layers(unknown, [0], 0, 1),
                     lambda: store.read_layers(unknown, [0, 1], 0, 1), lambda: store.sample_ids(unknown),
                     lambda: store.labels(unknown), lambda: store.offsets(unknown),
                     lambda: store.means(unknown), lambda: store.write_means(unknown),
                     lambda: store.nbytes_stored(unknown),
                     lambda: store.write_shard(unknown, 0, np.zeros((SHARD_ROWS, NUM_STATES, WIDTH), np.float32),
                                               np.zeros((NUM_STATES, WIDTH)))):
            with pytest.raises(NotFound) as info:
                call()
            assert unknown[:12] in str(info.value)

    # ---- the store describes its runs ---------------------------------------------------------
    def test_runs_carry_their_spec_chunk_rows_and_commit_marker(self, store, tmp_path):
        spec = {"model": "m" * 64, "dataset": "d" * 64, "pooling": "mean", "dtype": "float32"}
        run_key, layout = key("described"), pooled_layout()
        store.create_run(run_key, layout, [f"s{i}" for i in range(N)], None, None, spec)
        other, _, _ = self.filled_run(store, name="no spec")
        assert store.run_keys() == sorted([run_key, other])
        assert store.spec(run_key) == spec and store.spec(other) is None
        assert store.chunk_rows(run_key) == {} and not store.is_committed(run_key)
        stored, numbers = make_values(layout)
        for shard in (2, 0, 1):  # any order, as shards finish
            start, stop = layout.shard_range(shard)
            store.write_shard(run_key, shard, stored[start:stop], shard_sums(numbers, layout, shard),
                              *((None,) + kept_with(run_key, layout, shard) if shard != 1 else ()))
        rows = store.chunk_rows(run_key)  # shard 1 was written without any: it has none
        expected = [kept_with(run_key, layout, shard) for shard in (0, 2)]
        assert set(rows) == set(expected[0][0])
        assert all(same_cells(cells, expected[0][0][column] + expected[1][0][column]) for column, cells in rows.items())
        assert store.shard_details(run_key, 1) == (None, None)
        assert store.write_layer_stats(run_key) is None  # not every shard has statistics
        read_rows, read_stats = self.make_store(tmp_path).shard_details(run_key, 2)  # another handle
        assert all(same_cells(read_rows[c], expected[1][0][c]) for c in expected[1][0]) and read_rows.keys() == \
            expected[1][0].keys()
        assert read_stats == expected[1][1]
        for column in ("checksum", "nan_count", "inf_count", "rows"):
            assert all(type(cell) is int for cell in read_rows[column])
        store.mark_committed(run_key)
        assert store.is_committed(run_key) and not store.is_committed(other)
        assert self.make_store(tmp_path).is_committed(run_key)  # another handle sees it
        store.delete_run(run_key)
        assert store.run_keys() == [other] and not store.is_committed(run_key)

    # ---- integrity: what verify reads and a repair drops -----------------------------------------
    def test_shard_presence_layer_sums_and_array_shapes(self, store):
        run_key, layout, numbers = self.filled_run(store, "bfloat16")
        assert all(store.shard_present(run_key, s) for s in range(layout.num_shards))
        np.testing.assert_allclose(store.layer_sums(run_key, 1), shard_sums(numbers, layout, 1))
        store.write_means(run_key)
        shapes = store.array_shapes(run_key)
        assert shapes["acts"] == ((N, NUM_STATES, WIDTH), "uint16")
        assert shapes["means"] == ((NUM_STATES, WIDTH), "float64")
        assert shapes["sample_id_offsets"] == ((N + 1,), "int64")

    def test_dropped_shards_are_gone_and_written_again_alike(self, store):
        offsets = np.array([0, 3, 7, 9, 11])
        run_key, layout = key("dropped"), token_layout(offsets)
        self.create(store, run_key, layout, offsets=offsets)
        stored, numbers = make_values(layout)
        ids = np.arange(layout.rows) + 100

        def write(shard):
            start, stop = layout.shard_range(shard)
            store.write_shard(run_key, shard, stored[start:stop], shard_sums(numbers, layout, shard), ids[start:stop],
                              *kept_with(run_key, layout, shard))

        for shard in range(layout.num_shards):
            write(shard)
        store.write_means(run_key)
        store.mark_committed(run_key)
        store.drop_shards(run_key, [1])
        assert not store.is_committed(run_key) and not store.shard_present(run_key, 1)
        assert store.shard_present(run_key, 0) and store.shard_present(run_key, 2)
        assert store.chunk_rows(run_key)["shard"] == [0] * layout.num_states + [2] * layout.num_states
        assert store.shard_details(run_key, 1) == (None, None)
        with pytest.raises(NotFound):
            store.means(run_key)
        with pytest.raises(DataLoss, match="shard 1 of array 'tokens'"):
            store.read_layers(run_key, [0], 0, layout.rows)
        every = list(range(layout.num_states))  # whole shards, one request each: no existence check first
        with pytest.raises(DataLoss, match="shard 1 of array 'tokens' .*is missing"):
            store.read_layers(run_key, every, *layout.shard_range(1))
        np.testing.assert_array_equal(store.read_layers(run_key, every, *layout.shard_range(2)),
                                      self.expected(numbers, every, *layout.shard_range(2)))
        with pytest.raises(DataLoss, match="shard 1 of array 'layer_sums' is missing"):
            store.layer_sums(run_key, 1)
        write(1)
        np.testing.assert_array_equal(store.read_layers(run_key, [0, 3], 0, layout.rows),
                                      self.expected(numbers, [0, 3], 0, layout.rows))
        np.testing.assert_array_equal(store.read_layers(run_key, every, *layout.shard_range(1)),
                                      self.expected(numbers, every, *layout.shard_range(1)))
        np.testing.assert_array_equal(store.token_ids(run_key, 2, 10), ids[2:10])

