"""One-byte storage end to end (issue 39): a capture with --dtype int8 stores codes and each shard's
steps and offsets, every reader decodes them (read_activations, to_xarray, batches, the torch
dataset), its values are within half a step of the float32 capture's, the dtype enters the run
key, and verify checks the new arrays."""

from __future__ import annotations

import numpy as np
import pytest

from actstore.store import quantised
from tests.server.captured import read_all, register_toy

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def runs(module_client, tiny_models):
    """The toy reviews captured by bert as float32 and int8, pooled (cls) and token-level."""
    client = module_client
    register_toy(client, tiny_models)
    return {(dtype, pooling): client.capture("bert", "toy", dtype=dtype, pooling=pooling).run_key
            for dtype in ("float32", "int8") for pooling in ("cls", "tokens")}


def _read(client, run):
    return read_all(client, run, client.describe(run).num_layers)


def _steps(client, run):
    """The steps of each row's shard (rows, L+1, d), read with plain zarr through to_xarray's location."""
    import zarr

    location = client.locate_run(run)
    group = zarr.open_group(store=zarr.storage.LocalStore(location.store, read_only=True), path=location.group,
                            mode="r")
    shard_rows = group[location.array].shards[0]
    return np.repeat(group["scales"][:, 0], shard_rows, 0)[:location.rows]


@pytest.mark.parametrize("pooling", ["cls", "tokens"])
def test_int8_values_are_within_half_a_step_of_the_float32_capture(module_client, runs, pooling):
    client = module_client
    exact = _read(client, runs["float32", pooling])
    stored = _read(client, runs["int8", pooling])
    assert stored.dtype == np.float32 and stored.shape == exact.shape
    described = client.describe(runs["int8", pooling])
    assert described.dtype == "int8" and described.status == "committed"
    steps = _steps(client, runs["int8", pooling])
    # half a step, plus the float32 rounding of the decode (the two captures compute the same float32 values)
    slack = 4 * np.spacing(np.abs(exact).max())
    assert np.all(np.abs(stored.astype(np.float64) - exact) <= steps / 2 + slack)
    assert not np.array_equal(stored, exact)  # rounded, really


def test_the_dtype_enters_the_run_key(module_client, runs):
    assert len({runs[dtype, "cls"] for dtype in ("float32", "int8")}) == 2
    again = module_client.capture("bert", "toy", dtype="int8", pooling="cls")
    assert again.cache_hit and again.run_key == runs["int8", "cls"]


@pytest.mark.parametrize("pooling", ["cls", "tokens"])
def test_every_reader_decodes(module_client, runs, pooling):
    client = module_client
    run = runs["int8", pooling]
    stored = _read(client, run)
    view = client.to_xarray(run)
    assert view.dtype == np.float32 and view.attrs["stored_dtype"] == "int8"
    np.testing.assert_array_equal(view.values, stored)
    rows = np.concatenate([batch.rows for batch in client.batches(run, batch_size=7, shuffle=True)])
    values = np.concatenate([batch.values for batch in client.batches(run, batch_size=7, shuffle=True)])
    assert values.dtype == np.float32
    np.testing.assert_array_equal(values, stored[rows])
    dataset = client.torch_dataset(run, batch_size=16, shuffle=False, layers=[1])
    first = next(iter(dataset))
    np.testing.assert_array_equal(first["values"].numpy(), stored[first["rows"].numpy()][:, [1]])


def test_plain_zarr_reads_the_codes_and_the_documented_decode_gives_the_values(module_client, runs):
    import zarr

    client = module_client
    run = runs["int8", "tokens"]
    location = client.locate_run(run)
    g = zarr.open_group(store=zarr.storage.LocalStore(location.store, read_only=True), path=location.group, mode="r")
    codes = g["tokens"][:]
    assert codes.dtype == np.int8
    n, s = codes.shape[0], g["tokens"].shards[0]
    x = codes * np.repeat(g["scales"][:, 0], s, 0)[:n] + np.repeat(g["scales"][:, 1], s, 0)[:n]
    np.testing.assert_array_equal(x, _read(client, run))
    assert quantised.SCALES == "scales"


def test_verify_checks_the_codes_and_scales(module_client, runs):
    report = module_client.verify([runs["int8", "cls"], runs["int8", "tokens"]])
    assert [(verdict.status, verdict.damage) for verdict in report.runs] == [("ok", [])] * 2
