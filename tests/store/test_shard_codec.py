"""store.shard_codec: whole shards and chunks in exactly the bytes zarr writes for them.

Every case writes the same shard twice, once through `ZarrArrayStore.write_shard` and once
through zarr's own array assignment into an identical run, and compares every stored file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

from actstore.store.array_store import RunLayout
from actstore.store.arrays import ZarrArrayStore
from actstore.store.shard_codec import encode_shard, whole_chunk

RUN = "a" * 64
ROWS, STATES, WIDTH, SHARD_ROWS = 40, 5, 24, 16  # shards [0, 16), [16, 32) and the edge shard [32, 40)


def layout(dtype: str, pooling: str = "tokens") -> RunLayout:
    return RunLayout(n=8, rows=ROWS, num_states=STATES, width=WIDTH, dtype=dtype, pooling=pooling,
                     shard_rows=SHARD_ROWS)


def stored_values(dtype: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    floats = torch.from_numpy(rng.standard_normal((ROWS, STATES, WIDTH)).astype(np.float32) * 4)
    if dtype == "bfloat16":
        return floats.bfloat16().view(torch.int16).numpy().view(np.uint16)
    return floats.to(getattr(torch, dtype)).numpy()


def make(root: Path, dtype: str, compressor: str, pooling: str = "tokens") -> ZarrArrayStore:
    store = ZarrArrayStore(root, compressor)
    offsets = np.array([0, 5, 12, 20, 26, 31, 33, 38, 40]) if pooling == "tokens" else None
    store.create_run(RUN, layout(dtype, pooling), [f"s{i}" for i in range(8)], None, offsets, {"k": 1})
    return store


def zarr_write(root: Path, name: str, shard: int, values, sums, ids) -> None:
    """The reference: zarr's own write path for the same shard."""
    group = zarr.open_group(root / "runs" / RUN, mode="r+")
    start, stop = shard * SHARD_ROWS, min((shard + 1) * SHARD_ROWS, ROWS)
    group[name][start:stop] = values
    group["layer_sums"][shard] = sums
    if ids is not None:
        group["token_ids"][start:stop] = ids


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def both(tmp_path: Path, dtype: str, compressor: str, values: np.ndarray, shards=(0, 1, 2), pooling="tokens",
         sums=None) -> tuple[dict, dict]:
    ours = make(tmp_path / "ours", dtype, compressor, pooling)
    make(tmp_path / "zarr", dtype, compressor, pooling)
    name = "tokens" if pooling == "tokens" else "acts"
    for shard in shards:
        start, stop = shard * SHARD_ROWS, min((shard + 1) * SHARD_ROWS, ROWS)
        block = values[start:stop]
        shard_sums = block.astype(np.float64).sum(0) if sums is None else sums
        ids = np.arange(start, stop, dtype=np.int64) * 7 if pooling == "tokens" else None
        ours.write_shard(RUN, shard, block, shard_sums, ids)
        zarr_write(tmp_path / "zarr", name, shard, block, shard_sums, ids)
    return files(tmp_path / "ours"), files(tmp_path / "zarr")


@pytest.mark.parametrize("dtype", ["float16", "float32", "bfloat16"])
@pytest.mark.parametrize("compressor", ["lz4", "zstd"])
def test_written_shards_are_zarrs_bytes(tmp_path, dtype, compressor):
    ours, theirs = both(tmp_path, dtype, compressor, stored_values(dtype))
    assert ours == theirs
    assert any(name.endswith("tokens/c/1/0/0") for name in ours)


def test_pooled_runs_too(tmp_path):
    ours, theirs = both(tmp_path, "float16", "lz4", stored_values("float16"), pooling="mean")
    assert ours == theirs and any(name.endswith("acts/c/0/0/0") for name in ours)


def test_the_encoder_takes_whole_shards_and_declines_the_edge_shard(tmp_path):
    store = make(tmp_path, "float16", "lz4")
    group = zarr.open_group(tmp_path, mode="r")[f"runs/{RUN}"]  # keys are relative to the store's root
    array = group["tokens"]
    values = stored_values("float16")
    key, blob = whole_chunk(array, 1, values[16:32])
    assert key == f"runs/{RUN}/tokens/c/1/0/0" and len(blob) > 0
    assert whole_chunk(array, 2, values[32:40]) is None  # cut short by the array's end: zarr pads it
    assert whole_chunk(array, 1, values[16:32].astype(np.float32)) is None  # needs a cast
    sums = values[16:32].astype(np.float64).sum(0)
    assert whole_chunk(group["layer_sums"], 1, sums)[0] == f"runs/{RUN}/layer_sums/c/1/0/0"
    assert store.layout(RUN).rows == ROWS


def test_a_layer_equal_to_the_fill_value_goes_through_zarr(tmp_path):
    values = stored_values("float16")
    values[0:16, 2, :] = 0  # zarr leaves this inner chunk out of the shard
    values[16:32, 3, :] = np.float16(-0.0)  # -0.0 is not the fill value's bit pattern: kept
    array = zarr.open_group(make(tmp_path / "probe", "float16", "lz4").root / "runs" / RUN)["tokens"]
    assert encode_shard(array.metadata, values[0:16]) is None
    assert encode_shard(array.metadata, values[16:32]) is not None
    ours, theirs = both(tmp_path, "float16", "lz4", values)
    assert ours == theirs


def test_zero_layer_sums_and_an_all_zero_shard_match_zarr(tmp_path):
    values = stored_values("float32")
    values[16:32] = 0  # zarr writes no object for an all-fill shard (nor its zero sums)
    ours, theirs = both(tmp_path, "float32", "lz4", values, sums=np.zeros((STATES, WIDTH)))
    assert ours == theirs
    assert not any(name.endswith("tokens/c/1/0/0") for name in ours)


def test_rewriting_replaces_the_shard(tmp_path):
    values, other = stored_values("float16", 0), stored_values("float16", 1)
    store = make(tmp_path, "float16", "lz4")
    for block in (other, values):
        store.write_shard(RUN, 0, block[:16], block[:16].astype(np.float64).sum(0), np.arange(16))
    np.testing.assert_array_equal(store.read_layers(RUN, list(range(STATES)), 0, 16), values[:16].transpose(1, 0, 2))
    np.testing.assert_array_equal(store.token_ids(RUN, 0, 16), np.arange(16))
