"""A shard's write on the host: chunk rows and statistics from the stored numbers (every storage
dtype, NaN and Inf), the same with or without the extremes made beside the forward pass, the
checksums summed once, and a writer process that never imports torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from actstore.metrics.layer_stats import LayerStats
from actstore.workers.capture import prepare_shards
from actstore.workers.shard_writes import chunk_metadata, chunk_rows, stored_numbers


def _shard(dtype: str):
    rng = np.random.default_rng(3)
    values = torch.from_numpy(rng.standard_normal((40, 4, 6)).astype(np.float32) * 3)
    values[5, 1, 2] = float("nan")
    values[9, 1, 3] = float("inf")
    values[20, 2, 0] = 1e6  # Inf in float16, finite in bfloat16 and float32
    (prepared,) = prepare_shards(values, [(0, 40)], dtype)
    return prepared, values.to(getattr(torch, dtype)).float().numpy().astype(np.float64)  # exact: a wider float


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_chunk_rows_describe_the_stored_numbers(dtype):
    """Against numpy on the same cast: finite extremes and NaN/Inf counts per layer, the crc32c of
    each layer's stored bytes; the extremes made with the cast or here give the same rows."""
    import crc32c

    prepared, cast = _shard(dtype)
    rows = chunk_rows("k" * 64, 3, prepared)
    assert rows == chunk_metadata("k" * 64, 3, prepared.stored)
    for layer in range(4):
        part = cast[:, layer]
        finite = part[np.isfinite(part)]
        assert rows["min"][layer] == finite.min() and rows["max"][layer] == finite.max()
        assert rows["nan_count"][layer] == np.isnan(part).sum() and rows["inf_count"][layer] == np.isinf(part).sum()
        assert rows["checksum"][layer] == crc32c.crc32c(prepared.layers[layer].tobytes())
    assert rows["nan_count"] == [0, 1, 0, 0] and rows["inf_count"] == [0, 1, int(dtype == "float16"), 0]
    assert rows["rows"] == [40] * 4 and rows["shard"] == [3] * 4


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_statistics_are_of_the_stored_numbers(dtype):
    """bfloat16's uint16 bits are decoded first (statistics of the bits would be nonsense); the
    finite numbers' mean and std against float64 numpy."""
    prepared, cast = _shard(dtype)
    numbers = stored_numbers(prepared.stored)
    np.testing.assert_array_equal(numbers.astype(np.float64), cast)
    stats = LayerStats.empty(4).update(numbers).finalize()
    assert LayerStats.from_dict(prepared.stats).finalize() == stats
    for layer in (0, 3):  # the layers without NaN or Inf
        part = cast[:, layer]
        assert stats["mean"][layer] == pytest.approx(part.mean(), rel=1e-12)
        assert stats["std"][layer] == pytest.approx(part.std(), rel=1e-12)


def test_a_writer_process_never_imports_torch(tmp_path):
    """What a one-CPU write task runs, in a fresh interpreter: open the store, write a prepared
    shard, and torch is still not imported (its import was most of a fresh writer's start)."""
    prepared, _ = _shard("float16")
    np.save(tmp_path / "layers.npy", prepared.layers)
    script = textwrap.dedent(f"""
        import sys
        import numpy as np
        from actstore.store.array_store import RunLayout
        from actstore.store.handle import StoreHandle
        from actstore.workers.shard_writes import chunk_metadata, reduced_on_host, write_prepared
        layers = np.load({str(tmp_path / "layers.npy")!r})
        arrays = StoreHandle({str(tmp_path / "store")!r}).open()
        layout = RunLayout(n=40, rows=40, num_states=4, width=6, dtype="float16", pooling="mean", shard_rows=40)
        arrays.create_run("a" * 64, layout, [str(i) for i in range(40)], None, None)
        rows = write_prepared(arrays, "a" * 64, 0, reduced_on_host(layers, layers.sum(axis=1, dtype=np.float64)))
        assert rows == chunk_metadata("a" * 64, 0, layers.transpose(1, 0, 2))
        read = arrays.read_layers("a" * 64, [0, 1, 2, 3], 0, 40)
        assert np.array_equal(read, layers, equal_nan=True), "read back differs"
        assert "torch" not in sys.modules, "torch was imported"
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


@pytest.mark.parametrize("compress", [False, True])
def test_a_shard_written_with_its_rows_checksums_reads_back_and_a_flipped_byte_is_data_loss(tmp_path, compress):
    """An uncompressed shard's inner chunks take the chunk rows' crc32c (summed once, by the
    writer) as their codec's: the stored crc32c is the one zarr's codec computes, so plain
    zarr-python reads the shard and a flipped byte of it fails its check; a compressed one sums
    its compressed bytes."""
    import zarr

    from actstore.errors import DataLoss
    from actstore.store.array_store import RunLayout
    from actstore.store.handle import StoreHandle
    from actstore.workers.shard_writes import write_prepared

    prepared, _ = _shard("float16")
    arrays = StoreHandle(str(tmp_path / "store")).open()
    layout = RunLayout(n=40, rows=40, num_states=4, width=6, dtype="float16", pooling="mean", shard_rows=40)
    key = "b" * 64
    arrays.create_run(key, layout, [str(i) for i in range(40)], None, None, compress=compress)
    write_prepared(arrays, key, 0, prepared)
    plain = zarr.open_array(str(tmp_path / "store" / "runs" / key / "acts"), mode="r")
    np.testing.assert_array_equal(plain[:], prepared.stored)
    shard = tmp_path / "store" / "runs" / key / "acts" / "c" / "0" / "0" / "0"
    data = bytearray(shard.read_bytes())
    data[7] ^= 0x10
    shard.write_bytes(bytes(data))
    with pytest.raises(DataLoss):
        StoreHandle(str(tmp_path / "store")).open().read_layers(key, [0], 0, 40)
