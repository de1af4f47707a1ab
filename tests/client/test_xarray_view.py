"""The client's own Zarr reader (`client.xarray_view`) against arrays written by the store's Zarr
backend, on a local directory and on an S3 server (moto on loopback, the AWS_* variables set):
bfloat16 widened as the server widens it, token-level coordinates, a damaged chunk raising."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from actstore.client.readers import RunLocation
from actstore.client.xarray_view import open_run
from actstore.errors import DataLoss
from actstore.store.array_store import RunLayout
from actstore.store.format.arrays import ZarrArrayStore

KEY = "k" * 64


def write_run(root, dtype: str, pooling: str) -> tuple[ZarrArrayStore, RunLocation]:
    rng = np.random.default_rng(0)
    n = 6
    offsets = np.array([0, 3, 5, 9, 10, 14, 17]) if pooling == "tokens" else None
    rows = int(offsets[-1]) if offsets is not None else n
    layout = RunLayout(n=n, rows=rows, num_states=3, width=5, dtype=dtype, pooling=pooling, shard_rows=4)
    store = ZarrArrayStore(root)
    store.create_run(KEY, layout, [f"id{i}" for i in range(n)], np.arange(n) % 2, offsets)
    for shard in range(layout.num_shards):
        lo, hi = layout.shard_range(shard)
        values = rng.standard_normal((hi - lo, 3, 5)).astype(np.float32)
        stored = (values.view(np.uint32) >> 16).astype(np.uint16) if dtype == "bfloat16" else values.astype(dtype)
        store.write_shard(KEY, shard, stored, values.sum(axis=0).astype(np.float64))
    location = RunLocation(KEY, str(root), f"runs/{KEY}", layout.array_name, dtype, pooling, n, rows, 2, 5)
    return store, location


def stored(store: ZarrArrayStore, location: RunLocation) -> np.ndarray:
    return np.moveaxis(store.read_layers(KEY, [0, 1, 2], 0, location.rows), 0, 1)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_pooled_run_reads_as_the_store_reads_it(tmp_path, dtype):
    store, location = write_run(tmp_path, dtype, "mean")
    array = open_run(location)
    assert array.dims == ("sample", "layer", "feature") and array.shape == (6, 3, 5)
    assert array.dtype == (np.float32 if dtype == "bfloat16" else np.dtype(dtype))
    np.testing.assert_array_equal(array.values, stored(store, location))
    np.testing.assert_array_equal(array.isel(sample=[4, 1], layer=2).values, stored(store, location)[[4, 1], 2])
    assert array.coords["sample_id"].values.tolist() == [f"id{i}" for i in range(6)]
    assert array.coords["label"].values.tolist() == [0, 1, 0, 1, 0, 1]


def test_token_level_run_has_per_token_sample_coordinates(tmp_path):
    store, location = write_run(tmp_path, "float16", "tokens")
    array = open_run(location)
    assert array.dims == ("token", "layer", "feature") and array.shape == (17, 3, 5)
    assert array.coords["sample"].values.tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 4, 4, 4, 4, 5, 5, 5]
    assert array.coords["sample_id"].values[5] == "id2" and array.coords["label"].values[9] == 1
    np.testing.assert_array_equal(array.values, stored(store, location))


def test_a_damaged_chunk_raises_instead_of_returning_numbers(tmp_path):
    _, location = write_run(tmp_path, "float16", "mean")
    shard = Path(tmp_path, "runs", KEY, "acts", "c", "0", "0", "0")
    raw = bytearray(shard.read_bytes())
    raw[40] ^= 0xFF
    shard.write_bytes(bytes(raw))
    array = open_run(location)
    with pytest.raises(DataLoss, match="damaged.*checksum.*actstore verify"):
        array.isel(sample=slice(0, 4)).values  # noqa: B018 - reading is the point


@pytest.mark.parametrize("pooling", ["mean", "tokens"])
def test_a_missing_shard_raises_instead_of_reading_as_zeros(tmp_path, pooling):
    store, location = write_run(tmp_path, "float16", pooling)
    first = stored(store, location)[:4]
    Path(tmp_path, "runs", KEY, location.array, "c", "1", "0", "0").unlink()  # zarr reads it as its fill value
    array = open_run(location)
    np.testing.assert_array_equal(array.isel({array.dims[0]: slice(0, 4)}).values, first)  # shard 0 is whole
    for rows in (slice(4, 6), [0, 5], 4):
        with pytest.raises(DataLoss, match=f"run {KEY[:12]}: shard\\(s\\) 1 of .* missing from the store.*verify"):
            array.isel({array.dims[0]: rows}).values  # noqa: B018 - reading is the point


def test_an_s3_store_is_read_with_the_aws_variables(s3_bucket):
    store, location = write_run(s3_bucket, "float16", "mean")
    array = open_run(location)
    np.testing.assert_array_equal(array.values, stored(store, location))
    assert array.coords["sample_id"].values.tolist()[-1] == "id5"
