"""The contract every storage backend keeps (`store.backends`), as a pytest suite, like
zarr-python's ``zarr.testing.store.StoreTests``: a backend's test module subclasses `BackendTests`
as ``Test<Backend>`` and gives it a ``root`` fixture (a fresh, empty root of its scheme), as
``tests/store/test_backends.py`` does. The class's name does not start with ``Test``, so pytest
never collects it alone. Only tests import this module (it imports pytest, a test dependency;
`store.backends` does not import it).

It checks the backend's zarr store (get, ranged get, set, list, list_prefix, list_dir, delete,
exists), that a second open of the root sees the same bytes, that its direct paths
(`Backend.directory`, `Backend.objects`) reach the same objects, its options, its check, and
its files area where it has one.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from zarr.abc.store import OffsetByteRequest, RangeByteRequest, Store, SuffixByteRequest
from zarr.buffer import default_buffer_prototype
from zarr.buffer.cpu import Buffer

from actstore.event_loop import sync
from actstore.store.array_store import RunLayout
from actstore.store.backends import Backend, backend_for, schemes
from actstore.store.backends.retries import RetryPolicy
from actstore.store.format.arrays import ZarrArrayStore

DATA = bytes(range(256)) * 4  # 1 kB, every byte value


def put(store: Store, key: str, data: bytes) -> None:
    sync(store.set(key, Buffer.from_bytes(data)))


def get(store: Store, key: str, byte_range=None) -> bytes | None:
    found = sync(store.get(key, default_buffer_prototype(), byte_range))
    return None if found is None else found.to_bytes()


def listed(store: Store, method: str, *args: str) -> list[str]:
    async def collect() -> list[str]:
        return [name async for name in getattr(store, method)(*args)]

    return sorted(sync(collect()))


class BackendTests:
    @pytest.fixture
    def root(self) -> str:
        raise NotImplementedError("a backend's test class gives a fresh, empty root of its scheme")

    @pytest.fixture
    def backend(self, root: str) -> Backend:
        return backend_for(root)

    @pytest.fixture
    def store(self, backend: Backend, root: str) -> Store:
        return backend.open(root, None, RetryPolicy())

    def test_the_root_finds_its_registered_backend(self, backend, root):
        assert backend.scheme in schemes() and backend_for(root) is backend

    def test_a_set_object_reads_back_whole(self, store):
        put(store, "a/b/c", DATA)
        assert get(store, "a/b/c") == DATA
        assert sync(store.getsize("a/b/c")) == len(DATA)

    def test_an_absent_object_is_none(self, store):
        assert get(store, "nothing/here") is None
        assert not sync(store.exists("nothing/here"))

    def test_byte_ranges_read_their_part(self, store):
        put(store, "ranged", DATA)
        assert get(store, "ranged", RangeByteRequest(10, 300)) == DATA[10:300]
        assert get(store, "ranged", OffsetByteRequest(1000)) == DATA[1000:]
        assert get(store, "ranged", SuffixByteRequest(24)) == DATA[-24:]
        found = sync(store.get_partial_values(default_buffer_prototype(),
                                              [("ranged", RangeByteRequest(0, 4)), ("ranged", None)]))
        assert [f.to_bytes() for f in found] == [DATA[:4], DATA]

    def test_a_set_replaces_the_object_whole(self, store):
        put(store, "replaced", DATA)
        put(store, "replaced", b"short")
        assert get(store, "replaced") == b"short"

    def test_exists(self, store):
        put(store, "runs/r/zarr.json", b"{}")
        assert sync(store.exists("runs/r/zarr.json"))
        assert not sync(store.exists("runs/r/other.json"))

    def test_listings(self, store):
        for name in ("runs/a/zarr.json", "runs/a/acts/c/0/0/0", "runs/b/zarr.json", "models/m/.complete"):
            put(store, name, b"x")
        assert listed(store, "list") == ["models/m/.complete", "runs/a/acts/c/0/0/0", "runs/a/zarr.json",
                                         "runs/b/zarr.json"]
        assert listed(store, "list_prefix", "runs/a/") == ["runs/a/acts/c/0/0/0", "runs/a/zarr.json"]
        assert listed(store, "list_dir", "runs") == ["a", "b"]
        assert listed(store, "list_prefix", "none/") == []

    def test_deletes(self, store):
        for name in ("runs/a/zarr.json", "runs/a/acts/c/0/0/0", "runs/b/zarr.json"):
            put(store, name, b"x")
        sync(store.delete("runs/b/zarr.json"))
        sync(store.delete("runs/b/zarr.json"))  # an absent object: nothing to do
        assert not sync(store.exists("runs/b/zarr.json"))
        sync(store.delete_dir("runs/a"))
        assert listed(store, "list") == []

    def test_a_second_open_sees_the_same_bytes(self, backend, root, store):
        put(store, "shared", DATA)
        again = backend.open(root, None, RetryPolicy())
        assert get(again, "shared") == DATA
        put(again, "back", b"y")
        assert get(store, "back") == b"y"

    def test_the_direct_paths_reach_the_same_objects(self, backend, root, store):
        import obstore

        put(store, "runs/r/acts/c/0/0/0", DATA)
        directory, objects = backend.directory(root), backend.objects(store)
        if directory is not None:  # the array store reads and writes these files itself
            assert (directory / "runs/r/acts/c/0/0/0").read_bytes() == DATA
        if objects is not None:  # ... or makes these blocking calls
            assert bytes(obstore.get(objects, "runs/r/acts/c/0/0/0").bytes()) == DATA
            obstore.put(objects, "direct", b"z")
            assert get(store, "direct") == b"z"

    def test_its_options_travel_with_a_handle_and_it_is_reachable(self, backend, root):
        options = backend.options()
        assert pickle.loads(pickle.dumps(options)) == options and hash(options) is not None
        backend.check(root, options, RetryPolicy())
        assert backend.cache_dir(root).is_absolute()

    def test_an_array_store_over_it_reads_what_it_wrote(self, root):
        layout = RunLayout(n=6, rows=6, num_states=2, width=3, dtype="float32", pooling="mean", shard_rows=4)
        values = np.arange(36, dtype=np.float32).reshape(6, 2, 3)
        arrays = ZarrArrayStore(root)
        run = "0" * 64
        arrays.create_run(run, layout, [f"s{i}" for i in range(6)], None, None)
        for shard in range(layout.num_shards):
            start, stop = layout.shard_range(shard)
            arrays.write_shard(run, shard, values[start:stop], values[start:stop].sum(0).astype(np.float64))
        fresh = ZarrArrayStore(root)  # nothing remembered
        np.testing.assert_array_equal(fresh.read_layers(run, [1, 0], 0, 6), values.transpose(1, 0, 2)[[1, 0]])
        assert fresh.run_keys() == [run] and fresh.sample_ids(run) == [f"s{i}" for i in range(6)]

    def test_its_files_area_keeps_whole_folders(self, backend, root):
        files = backend.files(root, None, RetryPolicy())
        if files is None:
            pytest.skip(f"{backend.scheme}:// stores have no files area")

        def build(folder):
            (folder / "sub").mkdir(parents=True)
            (folder / "config.json").write_text("{}")
            (folder / "sub" / "weights.bin").write_bytes(DATA)

        ref = files.write_folder("models/m1", build)
        assert files.exists("models/m1") and not files.exists("models/m2")
        assert files.folders("models") == ["models/m1"]
        local = files.local(ref)
        assert (local / "sub" / "weights.bin").read_bytes() == DATA and (local / "config.json").read_text() == "{}"
        files.write("models/m1", "status.json", b"1")
        assert files.read("models/m1", "status.json") == b"1" and files.read("models/m1", "absent") is None
        files.remove("models/m1")
        assert not files.exists("models/m1") and files.folders("models") == []
