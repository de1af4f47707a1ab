"""A run's metadata objects damaged on disk (the group's and every array's zarr.json): every read
of `ZarrArrayStore` either returns what was written or raises DataLoss naming the run and the
object, never another exception and never other numbers; the scrub names the object."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from actstore.errors import DataLoss
from actstore.store.format.arrays import ZarrArrayStore
from actstore.store.testing.runs import key, make_values, pooled_layout, shard_sums
from actstore.store.upkeep.scrub import check_run, check_shard

RUN = key("metadata")
OBJECTS = ["zarr.json", "acts/zarr.json", "labels/zarr.json", "means/zarr.json", "sample_ids/zarr.json",
           "sample_id_offsets/zarr.json", "char_spans/zarr.json"]


@pytest.fixture(scope="module")
def origin(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("origin") / "store"
    store = ZarrArrayStore(root)
    layout = pooled_layout("float32")
    store.create_run(RUN, layout, [f"s{i}" for i in range(layout.n)], np.arange(layout.n) % 3, None,
                     spec={"model": "m", "dataset": "d"})
    stored, numbers = make_values(layout, 0)
    for shard in range(layout.num_shards):
        start, stop = layout.shard_range(shard)
        store.write_shard(RUN, shard, stored[start:stop], shard_sums(numbers, layout, shard))
    store.write_means(RUN)
    store.write_char_spans(RUN, np.zeros((layout.rows, 2), np.int32))
    store.mark_committed(RUN)
    return root


READS = {
    "layout": lambda s, layout: s.layout(RUN),
    "spec": lambda s, layout: s.spec(RUN),
    "read_layers": lambda s, layout: s.read_layers(RUN, list(range(layout.num_states)), 0, layout.rows),
    "read_one_layer": lambda s, layout: s.read_layers(RUN, [2], 1, layout.rows - 1),
    "sample_ids": lambda s, layout: s.sample_ids(RUN),
    "labels": lambda s, layout: s.labels(RUN),
    "means": lambda s, layout: s.means(RUN),
    "char_spans": lambda s, layout: s.char_spans(RUN),
    "layer_sums": lambda s, layout: s.layer_sums(RUN, 1),
    "chunk_rows": lambda s, layout: s.chunk_rows(RUN),
    "array_shapes": lambda s, layout: s.array_shapes(RUN),
}


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict) and a and isinstance(next(iter(a.values())), np.ndarray):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def _damaged_copies(data: bytes):
    yield "truncated", data[: len(data) // 2]
    yield "cut at 40 bytes", data[:40]
    yield "empty", b""
    yield "not JSON", b"\x00\xffnot json"
    yield "a JSON list", b"[1, 2, 3]"
    yield "null", b"null"
    for where in (0.2, 0.5, 0.8):  # a flipped byte: not UTF-8 any more
        flipped = bytearray(data)
        flipped[int(len(data) * where)] ^= 0xFF
        yield f"byte {int(len(data) * where)} flipped", bytes(flipped)


@pytest.mark.parametrize("name", OBJECTS)
def test_every_read_of_a_damaged_metadata_object_is_data_loss_naming_it(origin, tmp_path, name):
    layout = ZarrArrayStore(origin).layout(RUN)
    intact = {read: call(ZarrArrayStore(origin), layout) for read, call in READS.items()}
    store = tmp_path / "store"
    shutil.copytree(origin, store)
    path = store / "runs" / RUN / name
    object_key = f"runs/{RUN}/{name}"
    for damage, data in _damaged_copies(path.read_bytes()):
        path.write_bytes(data)
        failed = 0
        for read, call in READS.items():
            try:
                got = call(ZarrArrayStore(store), layout)  # a new handle: nothing remembered
            except DataLoss as exc:
                failed += 1
                assert f"run {RUN[:12]}: its metadata object {object_key} " in str(exc), (damage, read, str(exc))
                assert exc.damage.startswith(f"metadata object {object_key} "), (damage, read, exc.damage)
                assert "--repair` deletes the run" in str(exc) and "Traceback" not in str(exc)
            else:
                assert _same(got, intact[read]), (damage, read)
        assert failed, f"{damage} of {name}: no read noticed"
        findings = check_run(ZarrArrayStore(store), RUN, layout, True, {"model": "m", "dataset": "d"})
        named = "group" if name == "zarr.json" else name
        assert [f.array for f in findings] == [named], (damage, findings)
        assert object_key in findings[0].reason, findings[0].reason
        if name == "acts/zarr.json":  # the scrub of a shard meets it once, not once per layer
            assert [(f.array, f.shard, f.layer) for f in check_shard(ZarrArrayStore(store), RUN, 0, {})] == \
                [("acts/zarr.json", -1, -1)]


@pytest.mark.parametrize("field", ['"rows": 11', '"n": 11', '"width": 8', '"shard_rows": 4', '"num_states": 4'])
def test_a_flipped_digit_of_the_layout_is_data_loss_on_read_not_other_rows(origin, tmp_path, field):
    """Valid JSON still: the run's layout (the group's) is checked against its activation array's
    metadata when a handle first opens the array, so no read goes on with it."""
    store = tmp_path / "store"
    shutil.copytree(origin, store)
    path = store / "runs" / RUN / "zarr.json"
    data = bytearray(path.read_bytes())
    data[data.index(field.encode()) + len(field) - 1] ^= 0x01  # 1 <-> 0, 8 <-> 9, 4 <-> 5
    path.write_bytes(bytes(data))
    fresh = ZarrArrayStore(store)
    layout = fresh.layout(RUN)
    with pytest.raises(DataLoss, match=rf"metadata object runs/{RUN}/zarr.json does not match "
                                       rf"runs/{RUN}/acts/zarr.json \(the layout"):
        fresh.read_layers(RUN, [1], 0, layout.rows)
