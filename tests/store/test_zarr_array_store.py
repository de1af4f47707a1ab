"""ZarrArrayStore: the ArrayStore contract plus what is specific to Zarr v3 on disk (shard files,
inner chunks that decode alone, codec metadata, crc32c corruption detection)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from zarr.storage import WrapperStore

from actstore.errors import DataLoss, NotFound
from actstore.store.array_store import bf16_bits_to_float32, decode_stored
from actstore.store.format import shard_details
from actstore.store.format.arrays import ZarrArrayStore
from actstore.store.format.shard_details import COLUMNS
from actstore.store.testing import ArrayStoreContract
from actstore.store.testing.runs import (
    NUM_STATES,
    SHARD_ROWS,
    WIDTH,
    N,
    kept_with,
    key,
    make_values,
    pooled_layout,
    same_cells,
    shard_sums,
    token_layout,
)
from actstore.store.upkeep.scrub import check_shard


class TestZarrArrayStore(ArrayStoreContract):
    def make_store(self, tmp_path: Path) -> ZarrArrayStore:
        return ZarrArrayStore(tmp_path / "store")

    # ---- chunk layout on disk -------------------------------------------------------------
    @staticmethod
    def files_under(path: Path) -> list[Path]:
        return sorted(p for p in path.rglob("*") if p.is_file())

    def test_a_fresh_handle_reads_and_writes_a_shard_in_few_requests(self, store, tmp_path):
        # each request is a round trip on an object store: opening reads the group's and the
        # array's metadata once (zarr 3 only, no probing for zarr 2 keys); then one request a shard
        run_key, layout, numbers = self.filled_run(store)
        requests = []

        class Counted(WrapperStore):
            async def get(self, key, prototype, byte_range=None):
                requests.append(("get", key.rsplit(run_key + "/", 1)[-1]))
                return await self._store.get(key, prototype, byte_range)

            async def set(self, key, value):
                requests.append(("set", key.rsplit(run_key + "/", 1)[-1]))
                return await self._store.set(key, value)

            async def exists(self, key):
                requests.append(("exists", key.rsplit(run_key + "/", 1)[-1]))
                return await self._store.exists(key)

        fresh = self.make_store(tmp_path)
        # every request through the counter: no direct reads and writes of the keys' files
        fresh._zarr, fresh._files_at = Counted(fresh._zarr), None
        every = list(range(NUM_STATES))
        np.testing.assert_array_equal(fresh.read_layers(run_key, every, 0, SHARD_ROWS),
                                      self.expected(numbers, every, 0, SHARD_ROWS))
        assert requests == [("get", "zarr.json"), ("get", "acts/zarr.json"), ("get", "acts/c/0/0/0")]
        requests.clear()
        fresh.read_layers(run_key, every, SHARD_ROWS, N)  # two shards, fetched together
        assert sorted(requests) == [("get", "acts/c/1/0/0"), ("get", "acts/c/2/0/0")]
        requests.clear()
        start, stop = layout.shard_range(1)
        fresh.write_shard(run_key, 1, numbers[start:stop], numbers[start:stop].sum(0, dtype=np.float64),
                          None, *kept_with(run_key, layout, 1))
        assert requests == [("set", "acts/c/1/0/0")]  # its layer sums, chunk rows and statistics inside it
        requests.clear()
        fresh.layer_sums(run_key, 2)
        assert requests == [("exists", "zarr.json"), ("get", "acts/c/2/0/0")]  # the shard's end only
        requests.clear()
        fresh.write_means(run_key)
        reads = sorted(r for r in requests if r[0] == "get" and "/c/" in r[1])
        assert reads == [("get", f"acts/c/{s}/0/0") for s in range(3)]  # one each, all at once

    def test_threads_that_meet_a_run_at_once_open_it_once(self, store, tmp_path):
        from concurrent.futures import ThreadPoolExecutor

        run_key, layout, numbers = self.filled_run(store)
        opened = []

        class Counted(WrapperStore):
            async def get(self, key, prototype, byte_range=None):
                if key.endswith("zarr.json"):
                    opened.append(key.rsplit(run_key + "/", 1)[-1])
                return await self._store.get(key, prototype, byte_range)

        fresh = self.make_store(tmp_path)
        fresh._zarr = Counted(fresh._zarr)
        every = list(range(NUM_STATES))
        with ThreadPoolExecutor(8) as pool:
            read = list(pool.map(lambda s: fresh.read_layers(run_key, every, *layout.shard_range(s)), [0, 1, 2] * 4))
        for shard, values in zip([0, 1, 2] * 4, read):
            np.testing.assert_array_equal(values, self.expected(numbers, every, *layout.shard_range(shard)))
        assert sorted(opened) == ["acts/zarr.json", "zarr.json"]

    def test_one_file_per_shard(self, store, tmp_path):
        run_key, layout, _ = self.filled_run(store)
        acts = tmp_path / "store" / "runs" / run_key / "acts"
        chunk_files = [p for p in self.files_under(acts) if p.name != "zarr.json"]
        # chunk keys are c/<shard>/0/0: one shard along rows, all layers and the width in it
        assert [p.relative_to(acts).parts for p in chunk_files] == [
            ("c", str(s), "0", "0") for s in range(layout.num_shards)
        ]
        assert store.nbytes_stored(run_key) >= sum(p.stat().st_size for p in chunk_files)
        # the layer sums travel inside the shard files: no other file per shard
        assert not (tmp_path / "store" / "runs" / run_key / "layer_sums").exists()

    @pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
    def test_zarr_reads_shards_that_carry_their_layer_sums(self, store, tmp_path, dtype):
        run_key, layout, numbers = self.filled_run(store, dtype)
        array = zarr.open_array(str(tmp_path / "store" / "runs" / run_key / "acts"), mode="r")
        np.testing.assert_array_equal(decode_stored(array[:], dtype), numbers)
        np.testing.assert_array_equal(decode_stored(array[5:7, 2], dtype), numbers[5:7, 2])
        sums = array.attrs["layer_sums"]  # what the attribute says, read as it says
        assert sums["shape"] == [NUM_STATES, WIDTH] and sums["data_type"] == "float64"
        assert [c["name"] for c in sums["codecs"]] == ["bytes", "crc32c"]
        data = (tmp_path / "store" / "runs" / run_key / "acts" / "c" / "1" / "0" / "0").read_bytes()
        block = data[-(16 * NUM_STATES + 4) - (8 * NUM_STATES * WIDTH + 4):-(16 * NUM_STATES + 4)]
        start, stop = layout.shard_range(1)
        np.testing.assert_array_equal(np.frombuffer(block[:-4], "<f8").reshape(NUM_STATES, WIDTH),
                                      numbers[start:stop].sum(axis=0, dtype=np.float64))

    def test_token_runs_store_a_tokens_array(self, store, tmp_path):
        offsets = np.array([0, 6, 13], dtype=np.int64)
        layout = token_layout(offsets)
        self.create(store, key("tok"), layout, offsets=offsets)
        self.write_all(store, key("tok"), layout)
        run_dir = tmp_path / "store" / "runs" / key("tok")
        assert (run_dir / "tokens" / "zarr.json").exists()
        assert not (run_dir / "acts").exists()
        assert len([p for p in self.files_under(run_dir / "tokens") if p.name != "zarr.json"]) == 4

    def test_delete_run_removes_the_directory(self, store, tmp_path):
        run_key, _, _ = self.filled_run(store)
        assert (tmp_path / "store" / "runs" / run_key).is_dir()
        store.delete_run(run_key)
        assert not (tmp_path / "store" / "runs" / run_key).exists()
        store.delete_run(run_key)  # deleting again is a no-op

    # ---- one layer reads alone; corruption is detected ------------------------------------
    @staticmethod
    def shard_index(shard_file: Path, num_states: int) -> np.ndarray:
        """(offset, nbytes) of each inner chunk, from the index at the end of the shard file
        (index_location "end": num_states pairs of little-endian uint64, then a crc32c)."""
        data = shard_file.read_bytes()
        return np.frombuffer(data[-(16 * num_states + 4):-4], dtype="<u8").reshape(num_states, 2)

    @staticmethod
    def flip_byte(path: Path, position: int) -> None:
        data = bytearray(path.read_bytes())
        data[position] ^= 0xFF
        path.write_bytes(bytes(data))

    @pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
    def test_reading_one_layer_decodes_only_its_inner_chunk(self, store, tmp_path, dtype):
        run_key, layout, numbers = self.filled_run(store, dtype)
        shard_file = tmp_path / "store" / "runs" / run_key / "acts" / "c" / "1" / "0" / "0"
        index = self.shard_index(shard_file, NUM_STATES)
        assert sorted(index[:, 0].tolist()) == index[:, 0].tolist()  # chunks stored in layer order
        bad = 2
        offset, nbytes = (int(v) for v in index[bad])
        self.flip_byte(shard_file, offset + nbytes // 2)
        start, stop = layout.shard_range(1)

        # every other layer of the corrupted shard still reads, and reads right
        for layer in (0, 1, 3):
            np.testing.assert_array_equal(store.read_layers(run_key, [layer], start, stop)[0],
                                          numbers[start:stop, layer])
        np.testing.assert_array_equal(store.read_layers(run_key, [0, 3], 0, N),
                                      self.expected(numbers, [0, 3], 0, N))
        # the corrupted layer in the other shards reads too
        np.testing.assert_array_equal(store.read_layers(run_key, [bad], 0, start)[0], numbers[:start, bad])

        # the corrupted inner chunk never comes back as numbers
        for layers, a, b in [([bad], start, stop), ([bad], start + 1, start + 2), ([bad], 0, N),
                             ([0, bad], 0, N), ([bad, 3], start, stop)]:
            with pytest.raises(DataLoss, match="crc32c") as info:
                store.read_layers(run_key, layers, a, b)
            assert run_key[:12] in str(info.value)

    def test_a_corrupted_shard_index_raises_data_loss(self, store, tmp_path):
        run_key, _, numbers = self.filled_run(store)
        shard_file = tmp_path / "store" / "runs" / run_key / "acts" / "c" / "0" / "0" / "0"
        self.flip_byte(shard_file, shard_file.stat().st_size - 10)  # inside the index
        with pytest.raises(DataLoss, match="crc32c"):
            store.read_layers(run_key, [0], 0, SHARD_ROWS)
        np.testing.assert_array_equal(store.read_layers(run_key, [0], SHARD_ROWS, N)[0], numbers[SHARD_ROWS:, 0])

    # ---- codec metadata -------------------------------------------------------------------
    @pytest.mark.parametrize(("dtype", "zarr_dtype", "itemsize"),
                             [("float16", "float16", 2), ("float32", "float32", 4), ("bfloat16", "uint16", 2)])
    @pytest.mark.parametrize("compressor", ["lz4", "zstd"])
    def test_codec_metadata(self, tmp_path, dtype, zarr_dtype, itemsize, compressor):
        store = ZarrArrayStore(tmp_path / "store", compressor=compressor)
        layout = pooled_layout(dtype)
        self.create(store, key("c"), layout)
        meta = json.loads((tmp_path / "store" / "runs" / key("c") / "acts" / "zarr.json").read_text())
        assert meta["zarr_format"] == 3 and meta["node_type"] == "array"
        assert meta["data_type"] == zarr_dtype
        assert meta["shape"] == [N, NUM_STATES, WIDTH]
        assert meta["chunk_grid"]["configuration"]["chunk_shape"] == [SHARD_ROWS, NUM_STATES, WIDTH]
        [sharding] = meta["codecs"]
        assert sharding["name"] == "sharding_indexed"
        config = sharding["configuration"]
        assert config["chunk_shape"] == [SHARD_ROWS, 1, WIDTH]  # inner chunks: one layer each
        names = [c["name"] for c in config["codecs"]]
        assert names == ["bytes", "blosc", "crc32c"]  # the checksum covers the compressed bytes
        blosc = config["codecs"][1]["configuration"]
        assert blosc["shuffle"] == "bitshuffle"
        assert blosc["cname"] == compressor
        assert blosc["typesize"] == itemsize
        assert "crc32c" in [c["name"] for c in config["index_codecs"]]
        sums = meta["attributes"]["layer_sums"]  # each shard object carries its layer sums
        assert sums["where"] == "in each shard object, between its inner chunks and its index"
        assert sums["shape"] == [NUM_STATES, WIDTH] and sums["data_type"] == "float64"

    # ---- incomplete or replaced runs ------------------------------------------------------
    def test_a_group_without_layout_is_not_found(self, store, tmp_path):
        # a create that crashed before its last step leaves a group without the layout attribute
        zarr.open_group(str(tmp_path / "store" / "runs" / key("half")), mode="w")
        with pytest.raises(NotFound, match="never completely created"):
            store.layout(key("half"))

    def test_create_run_after_an_interrupted_create_starts_over(self, store, tmp_path):
        # create_run writes the layout attribute last; a crash before it leaves the group and
        # some arrays behind. The resumed capture calls create_run again, which must succeed.
        run_key, layout = key("interrupted"), pooled_layout("float16")
        group = zarr.open_group(str(tmp_path / "store" / "runs" / run_key), mode="w")
        group.create_array("acts", shape=(N, NUM_STATES, WIDTH), dtype="float16", fill_value=0)
        self.create(store, run_key, layout)
        assert store.layout(run_key) == layout
        _, numbers = self.write_all(store, run_key, layout)
        np.testing.assert_array_equal(store.read_layers(run_key, [1], 0, N)[0], numbers[:, 1])

    def test_create_run_with_another_layout_replaces_the_run(self, store):
        run_key, _, _ = self.filled_run(store)
        other = pooled_layout("float16", n=6)
        self.create(store, run_key, other)
        assert store.layout(run_key) == other
        assert store.sample_ids(run_key) == [f"s{i}" for i in range(6)]
        with pytest.raises(DataLoss, match="shard 0 of array .acts. .* is missing"):  # gone, never read as zeros
            store.read_layers(run_key, [0], 0, 6)

    @pytest.mark.parametrize(("array", "read"), [
        ("means", lambda store, run: store.means(run)),
        ("labels", lambda store, run: store.labels(run)),
        ("sample_ids", lambda store, run: store.sample_ids(run)),
        ("sample_id_offsets", lambda store, run: store.sample_ids(run)),
    ])
    def test_a_flipped_byte_in_any_side_array_is_data_loss_naming_it(self, store, tmp_path, array, read):
        run_key, layout = key("side"), pooled_layout()
        self.create(store, run_key, layout, labels=np.arange(N) % 3)
        self.write_all(store, run_key, layout)
        store.write_means(run_key)
        chunk = next(p for p in (tmp_path / "store" / "runs" / run_key / array / "c").rglob("*") if p.is_file())
        self.flip_byte(chunk, chunk.stat().st_size // 2)
        with pytest.raises(DataLoss, match=rf"run {run_key[:12]}: "):
            read(self.make_store(tmp_path), run_key)

    def test_a_flipped_byte_in_a_shards_layer_sums_is_data_loss_naming_the_shard(self, store, tmp_path):
        run_key, layout, numbers = self.filled_run(store)
        shard_file = tmp_path / "store" / "runs" / run_key / "acts" / "c" / "1" / "0" / "0"
        self.flip_byte(shard_file, shard_file.stat().st_size - (16 * NUM_STATES + 4) - 100)  # in the sums
        fresh = self.make_store(tmp_path)
        for read in (lambda: fresh.layer_sums(run_key, 1), lambda: fresh.write_means(run_key)):
            with pytest.raises(DataLoss, match=rf"run {run_key[:12]}: shard 1 of array 'layer_sums' failed its crc32c"):
                read()
        np.testing.assert_array_equal(fresh.read_layers(run_key, list(range(NUM_STATES)), 0, N),
                                      self.expected(numbers, list(range(NUM_STATES)), 0, N))  # the values still read

    def test_a_truncated_shard_is_data_loss_for_its_layer_sums(self, store, tmp_path):
        run_key, _, _ = self.filled_run(store)
        shard_file = tmp_path / "store" / "runs" / run_key / "acts" / "c" / "2" / "0" / "0"
        shard_file.write_bytes(shard_file.read_bytes()[:100])  # shorter than its sums and index
        with pytest.raises(DataLoss, match="shard 2 of array 'layer_sums'"):
            self.make_store(tmp_path).layer_sums(run_key, 2)

    def test_write_means_adds_up_shards_batch_by_batch(self, store, monkeypatch):
        monkeypatch.setattr(shard_details, "SHARDS_AT_ONCE", 2)  # 3 shards: a batch of 2, then 1
        run_key, _, numbers = self.filled_run(store)
        np.testing.assert_allclose(store.write_means(run_key), numbers.astype(np.float64).mean(axis=0), rtol=1e-12)

    # ---- what a shard object carries besides its values ----------------------------------------
    def described_run(self, store, name="kept"):
        """A run whose every shard was written with its chunk rows and statistics."""
        run_key, layout = key(name), pooled_layout()
        self.create(store, run_key, layout)
        stored, numbers = make_values(layout)
        for shard in range(layout.num_shards):
            start, stop = layout.shard_range(shard)
            store.write_shard(run_key, shard, stored[start:stop], shard_sums(numbers, layout, shard), None,
                              *kept_with(run_key, layout, shard))
        return run_key, layout, numbers

    def test_a_shard_carries_its_rows_and_statistics_before_its_sums(self, store, tmp_path):
        run_key, layout, numbers = self.described_run(store)
        root = tmp_path / "store" / "runs" / run_key
        assert sorted(p.name for p in root.iterdir()) == ["acts", "sample_id_offsets", "sample_ids", "zarr.json"]
        array = zarr.open_array(str(root / "acts"), mode="r")
        np.testing.assert_array_equal(array[:], numbers)  # zarr's own reader does not see them
        details = array.attrs["shard_details"]  # what the attribute says, read as it says
        assert details["shape"] == [NUM_STATES, len(details["columns"])] and details["data_type"] == "float64"
        data = (root / "acts" / "c" / "2" / "0" / "0").read_bytes()
        index, sums = 16 * NUM_STATES + 4, 8 * NUM_STATES * WIDTH + 4
        size = 8 * NUM_STATES * len(details["columns"])
        block = np.frombuffer(data[-index - sums - size - 4:-index - sums - 4], "<f8").reshape(NUM_STATES, -1)
        rows, stats = kept_with(run_key, layout, 2)
        for i, column in enumerate(details["columns"]):
            assert same_cells(block[:, i].tolist(), rows[column] if column in rows else stats[column])
        with pytest.raises(ValueError, match="one per layer"):
            store.write_shard(run_key, 0, np.zeros((SHARD_ROWS, NUM_STATES, WIDTH), np.float32),
                              np.zeros((NUM_STATES, WIDTH)), None, kept_with(run_key, layout, 1)[0])

    def test_a_flipped_byte_anywhere_in_a_shard_is_data_loss_naming_run_and_shard(self, store, tmp_path):
        # every byte of one shard object: inner chunks, chunk rows and statistics, layer sums, index
        run_key, layout, numbers = self.described_run(store)
        shard_file = tmp_path / "store" / "runs" / run_key / "acts" / "c" / "1" / "0" / "0"
        good = shard_file.read_bytes()
        every = list(range(NUM_STATES))
        reads = {"read_layers": lambda s: s.read_layers(run_key, every, 0, N),
                 "layer_sums": lambda s: s.layer_sums(run_key, 1),
                 "shard_details": lambda s: s.shard_details(run_key, 1),
                 "chunk_rows": lambda s: s.chunk_rows(run_key),
                 "write_layer_stats": lambda s: s.write_layer_stats(run_key)}
        # every 9th byte, and the first and last four of each part (where its crc32c lies)
        index, sums, details = 16 * NUM_STATES + 4, 8 * NUM_STATES * WIDTH + 4, 8 * NUM_STATES * len(COLUMNS) + 4
        bounds = np.cumsum([0, len(good) - index - sums - details, details, sums, index])
        ends = {p for a, b in zip(bounds[:-1], bounds[1:]) for p in (*range(a, a + 4), *range(b - 4, b))}
        for position in sorted(set(range(0, len(good), 9)) | ends):
            self.flip_byte(shard_file, position)
            fresh, failed = self.make_store(tmp_path), []
            for name, read in reads.items():
                try:
                    value = read(fresh)
                except DataLoss as exc:
                    assert str(exc).startswith(f"run {run_key[:12]}: shard 1 "), (position, name, exc)
                    failed.append(name)
                    continue
                if name == "read_layers":  # what reads, reads right
                    np.testing.assert_array_equal(value, numbers.transpose(1, 0, 2))
            assert failed, position  # some read sees it, and verify names it
            findings = check_shard(fresh, run_key, 1, {})
            assert findings and all(f.shard == 1 for f in findings), position
            shard_file.write_bytes(good)

    def test_a_shard_written_again_after_a_crash_is_the_same_object_recorded_once(self, store, tmp_path):
        # a crash after a shard's PUT, before the catalog recorded it: the resumed capture writes
        # it again; the store keeps one object, byte for byte the first, and one set of rows
        run_key, layout, numbers = self.described_run(store)
        shard_file = tmp_path / "store" / "runs" / run_key / "acts" / "c" / "1" / "0" / "0"
        first = shard_file.read_bytes()
        start, stop = layout.shard_range(1)
        self.make_store(tmp_path).write_shard(run_key, 1, numbers[start:stop], shard_sums(numbers, layout, 1), None,
                                              *kept_with(run_key, layout, 1))
        assert shard_file.read_bytes() == first
        assert store.chunk_rows(run_key)["shard"] == [s for s in range(layout.num_shards) for _ in range(NUM_STATES)]

    def test_rows_and_statistics_are_read_back_and_merged_at_commit(self, store):
        from actstore.metrics.layer_stats import LayerStats

        run_key, layout, _ = self.described_run(store)
        total = LayerStats.empty(NUM_STATES)
        for shard in range(layout.num_shards):
            total.merge(LayerStats.from_dict(kept_with(run_key, layout, shard)[1]))
        assert store.write_layer_stats(run_key) == total.finalize() == store.layer_stats(run_key)

    # ---- runs written before shards carried their layer sums ----------------------------------
    def older_run(self, store, tmp_path, run_key, layout):
        """A run as written before: a `layer_sums` array, one chunk per shard, and no attribute."""
        self.create(store, run_key, layout)
        root = tmp_path / "store" / "runs" / run_key
        acts = zarr.open_array(str(root / layout.array_name), mode="r+")
        acts.attrs.clear()  # the attribute is all that differs in the array's metadata
        zarr.open_group(str(root), mode="r+").create_array(
            "layer_sums", shape=(layout.num_shards, NUM_STATES, WIDTH), chunks=(1, NUM_STATES, WIDTH),
            dtype="float64", compressors=store._codecs(8), fill_value=0)

    def test_an_older_run_keeps_its_layer_sums_array_also_when_resumed(self, store, tmp_path):
        run_key, layout = key("older"), pooled_layout("float16")
        self.older_run(store, tmp_path, run_key, layout)
        stored, numbers = make_values(layout)
        fresh = self.make_store(tmp_path)  # as a resumed capture's handle, after an upgrade
        for shard in range(layout.num_shards):
            start, stop = layout.shard_range(shard)
            fresh.write_shard(run_key, shard, stored[start:stop], shard_sums(numbers, layout, shard))
        root = tmp_path / "store" / "runs" / run_key
        assert sorted(p.name for p in (root / "layer_sums" / "c").iterdir()) == ["0", "1", "2"]
        shard_file = root / "acts" / "c" / "1" / "0" / "0"
        assert len(shard_file.read_bytes()) == len(store._codec(run_key, "acts").encode(stored[4:8]))  # no sums
        reader = self.make_store(tmp_path)
        np.testing.assert_array_equal(reader.layer_sums(run_key, 1), shard_sums(numbers, layout, 1))
        np.testing.assert_allclose(reader.write_means(run_key), numbers.astype(np.float64).mean(axis=0), rtol=1e-12)
        np.testing.assert_array_equal(reader.read_layers(run_key, [0, 3], 0, N), self.expected(numbers, [0, 3], 0, N))
        self.flip_byte(root / "layer_sums" / "c" / "2" / "0" / "0", 40)
        with pytest.raises(DataLoss, match="shard 2 of array 'layer_sums' failed its crc32c"):
            self.make_store(tmp_path).layer_sums(run_key, 2)
        reader.drop_shards(run_key, [2])
        assert not (root / "layer_sums" / "c" / "2" / "0" / "0").exists() and not reader.shard_present(run_key, 2)
        with pytest.raises(DataLoss, match="shard 2 of array 'layer_sums' is missing"):
            reader.layer_sums(run_key, 2)

    @pytest.mark.parametrize("oldest", [False, True])
    def test_an_older_run_keeps_rows_and_statistics_in_json_objects(self, store, tmp_path, oldest):
        # as written before shards carried them: the array's attribute for them is all that differs
        run_key, layout = key("older-json"), pooled_layout("float16")
        if oldest:
            self.older_run(store, tmp_path, run_key, layout)
        else:
            self.create(store, run_key, layout)
            acts = zarr.open_array(str(tmp_path / "store" / "runs" / run_key / "acts"), mode="r+")
            del acts.attrs["shard_details"]
        stored, numbers = make_values(layout)
        fresh = self.make_store(tmp_path)
        for shard in range(layout.num_shards):
            start, stop = layout.shard_range(shard)
            fresh.write_shard(run_key, shard, stored[start:stop], shard_sums(numbers, layout, shard), None,
                              *kept_with(run_key, layout, shard))
        root = tmp_path / "store" / "runs" / run_key
        assert sorted(p.name for p in (root / "chunk_rows").iterdir()) == ["0.json", "1.json", "2.json"]
        assert sorted(p.name for p in (root / "layer_stats").iterdir()) == ["0.json", "1.json", "2.json"]
        reader = self.make_store(tmp_path)
        rows = reader.chunk_rows(run_key)
        expected = [kept_with(run_key, layout, shard) for shard in range(layout.num_shards)]
        assert all(same_cells(cells, [c for r, _ in expected for c in r[column]]) for column, cells in rows.items())
        assert reader.write_layer_stats(run_key) is not None
        np.testing.assert_array_equal(reader.read_layers(run_key, [0, 3], 0, N), self.expected(numbers, [0, 3], 0, N))
        (root / "layer_stats" / "2.json").write_bytes(b'{"count": [1')
        with pytest.raises(DataLoss, match=rf"run {run_key[:12]}: shard 2 of array 'layer_stats' does not decode"):
            self.make_store(tmp_path).write_layer_stats(run_key)
        assert [f.array for f in check_shard(reader, run_key, 2, {})] == ["layer_stats"]
        reader.drop_shards(run_key, [2])
        assert not (root / "layer_stats" / "2.json").exists() and not (root / "chunk_rows" / "2.json").exists()
        assert reader.shard_details(run_key, 2) == (None, None)

    def test_plain_zarr_and_the_documented_one_line_decode_read_an_int8_run(self, store, tmp_path):
        run_key, layout = key("int8-zarr"), pooled_layout("int8")
        self.create(store, run_key, layout)
        codes, numbers = self.write_all(store, run_key, layout)
        g = zarr.open_group(store=zarr.storage.LocalStore(tmp_path / "store", read_only=True), path=f"runs/{run_key}",
                            mode="r")
        assert g["acts"].dtype == np.int8 and "decode" in g["scales"].attrs
        n, s = g["acts"].shape[0], g["acts"].shards[0]
        # store.format.quantised's docstring, as written there
        x = g["acts"][:] * np.repeat(g["scales"][:, 0], s, 0)[:n] + np.repeat(g["scales"][:, 1], s, 0)[:n]
        np.testing.assert_array_equal(x, numbers)
        np.testing.assert_array_equal(g["acts"][:], codes)

    def test_a_flipped_byte_in_an_int8_runs_scales_is_data_loss_naming_the_shard(self, store, tmp_path):
        run_key, layout = key("int8-flip"), pooled_layout("int8")
        self.create(store, run_key, layout)
        _, numbers = self.write_all(store, run_key, layout)
        chunk = tmp_path / "store" / "runs" / run_key / "scales" / "c" / "1" / "0" / "0" / "0"
        self.flip_byte(chunk, 40)
        fresh = self.make_store(tmp_path)
        # the store reads each shard's own copy (in its object), plain zarr the array's: verify checks both
        np.testing.assert_array_equal(fresh.read_layers(run_key, [2], 0, N), self.expected(numbers, [2], 0, N))
        with pytest.raises(DataLoss, match=rf"run {run_key[:12]}: shard 1 of array 'scales' failed its crc32c"):
            fresh.decoding(run_key, 1)
        assert [(f.array, f.shard) for f in check_shard(fresh, run_key, 1, {})] == [("scales", 1)]
        g = zarr.open_group(store=zarr.storage.LocalStore(tmp_path / "store", read_only=True), path=f"runs/{run_key}",
                            mode="r")
        with pytest.raises(ValueError, match="checksum"):
            g["scales"][1]

    def test_a_flipped_byte_in_a_shards_copy_of_its_scales_is_data_loss_for_every_read(self, store, tmp_path):
        run_key, layout = key("int8-flip-copy"), pooled_layout("int8")
        self.create(store, run_key, layout)
        self.write_all(store, run_key, layout)
        shard_file = tmp_path / "store" / "runs" / run_key / "acts" / "c" / "2" / "0" / "0"
        size = shard_file.stat().st_size
        # the copy lies before the details ((L+1) x 12 float64 + crc), the float32 sums ((L+1) x d + crc), the index
        self.flip_byte(shard_file, size - (16 * NUM_STATES + 4) - (4 * NUM_STATES * WIDTH + 4)
                       - (8 * 12 * NUM_STATES + 4) - 50)
        fresh = self.make_store(tmp_path)
        for layers in ([1], list(range(NUM_STATES))):
            with pytest.raises(DataLoss, match=r"shard 2 of array 'scales'.*failed its crc32c"):
                fresh.read_layers(run_key, layers, 0, N)
        assert ("scales", 2) in [(f.array, f.shard) for f in check_shard(fresh, run_key, 2, {})]

    def test_a_truncated_group_metadata_file_is_data_loss(self, store, tmp_path):
        run_key, _, _ = self.filled_run(store)
        metadata = tmp_path / "store" / "runs" / run_key / "zarr.json"
        metadata.write_bytes(metadata.read_bytes()[:40])
        with pytest.raises(DataLoss, match=f"metadata object runs/{run_key}/zarr.json does not decode"):
            self.make_store(tmp_path).layout(run_key)


# ---- bfloat16 helpers -----------------------------------------------------------------------
def test_bf16_bits_to_float32_matches_torch():
    bits = np.arange(2**16, dtype=np.uint16)  # every bfloat16
    expected = torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16).float().numpy()
    got = bf16_bits_to_float32(bits)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))  # bit-exact, NaNs too


def test_decode_stored():
    bits = np.array([[0x3F80, 0xC000]], dtype=np.uint16)
    np.testing.assert_array_equal(decode_stored(bits, "bfloat16"), np.array([[1.0, -2.0]], np.float32))
    half = np.array([1.5, -2.0], np.float16)
    assert decode_stored(half, "float16") is half

