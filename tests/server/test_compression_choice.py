"""A new run's activations are compressed only where it pays (ACTSTORE_COMPRESS_MIN_SAVING): the
first float16 run of a model is compressed and measured, and saves under 10%, so the next one is
stored with its checksum alone; its values are the same bytes a compressed store holds, plain zarr
reads it, and a flipped byte in it is still DATA_LOSS."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

from actstore.client import Client
from actstore.errors import DataLoss
from actstore.server.app import start_server
from tests.conftest import make_settings
from tests.factories import sentences


def inner_codecs(store, run_key: str) -> list[str]:
    meta = json.loads((store / "runs" / run_key / "acts" / "zarr.json").read_text())
    (sharding,) = meta["codecs"]
    return [codec["name"] for codec in sharding["configuration"]["codecs"]]


def capture_two(store, **overrides) -> list[tuple[str, list[np.ndarray]]]:
    server = start_server(make_settings(store, **overrides))
    try:
        with Client(f"127.0.0.1:{server.port}") as c:
            c.register_model(server_model, name="bert")
            runs = []
            for i in range(2):
                c.register_dataset(texts=sentences(24, seed=10 + i), name=f"toy{i}")
                key = c.capture("bert", f"toy{i}", pooling="mean").run_key
                runs.append((key, [c.read_activations(key, layer)[0] for layer in range(4)]))
            return runs
    finally:
        server.stop()


server_model = None


@pytest.fixture(autouse=True)
def model(tiny_models):
    global server_model
    server_model = tiny_models["bert"]


def test_a_second_run_skips_the_compressor_that_saved_under_a_tenth(tmp_path, ray_cluster):
    chosen, always = tmp_path / "chosen", tmp_path / "always"
    chosen_runs = capture_two(chosen)
    always_runs = capture_two(always, compress_min_saving=0.0)
    assert inner_codecs(chosen, chosen_runs[0][0])[-2:] == ["blosc", "crc32c"]
    assert inner_codecs(chosen, chosen_runs[1][0]) == ["bytes", "crc32c"]  # float16 saved ~3%: no Blosc
    assert all(inner_codecs(always, key)[-2:] == ["blosc", "crc32c"] for key, _ in always_runs)
    for (key_a, layers_a), (key_b, layers_b) in zip(chosen_runs, always_runs):
        assert key_a == key_b
        for a, b in zip(layers_a, layers_b):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    key, layers = chosen_runs[1]
    plain = zarr.open_array(store=str(chosen / "runs" / key / "acts"), mode="r")
    np.testing.assert_array_equal(plain[:, 2, :], layers[2])

    shard = chosen / "runs" / key / "acts" / "c" / "0" / "0" / "0"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0x01
    shard.write_bytes(bytes(data))
    server = start_server(make_settings(chosen))
    try:
        with Client(f"127.0.0.1:{server.port}") as c, pytest.raises(DataLoss, match="crc32c"):
            c.cka(key)
    finally:
        server.stop()
