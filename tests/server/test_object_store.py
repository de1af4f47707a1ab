"""The whole service on an S3-compatible object store (moto's server on loopback): capture, every
kind of query against independent formulas, corruption detection, and `catalog rebuild`, with
nothing but the catalog on the server's local disk."""

from __future__ import annotations

import subprocess
import sys

import boto3
import numpy as np
import pytest

from actstore.errors import DataLoss
from tests.factories import sentences
from tests.formulas import cka_numpy, debiased_numpy


@pytest.fixture(scope="module")
def s3_module_bucket(s3_server):
    import uuid

    name = f"module-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket=name)
    return f"s3://{name}/team"


@pytest.fixture(scope="module")
def s3_service(s3_module_bucket, tmp_path_factory, ray_cluster):
    from actstore.server.app import start_server
    from tests.conftest import make_settings

    data_dir = tmp_path_factory.mktemp("data-dir")
    running = start_server(make_settings(s3_module_bucket, server_dir=str(data_dir)))
    yield running, data_dir
    running.stop()


@pytest.fixture(scope="module")
def s3_client(s3_service):
    from actstore.client import Client

    server, _ = s3_service
    with Client(f"127.0.0.1:{server.port}") as c:
        yield c


@pytest.fixture(scope="module")
def captured(s3_client, tiny_models):
    s3_client.register_model(tiny_models["bert"], name="bert")
    s3_client.register_model(tiny_models["bert24"], name="bert24")
    s3_client.register_dataset(texts=sentences(40), labels=[i % 3 for i in range(40)], name="toy")
    return {name: s3_client.capture(name, "toy", pooling="mean").run_key for name in ("bert", "bert24")}


def _layers(client, run, count):
    return [client.read_activations(run, layer)[0].astype(np.float64) for layer in range(count)]


def test_capture_writes_no_activation_byte_to_local_disk(s3_service, captured, s3_module_bucket):
    _, data_dir = s3_service
    local = sorted(str(p.relative_to(data_dir)) for p in data_dir.rglob("*") if p.is_file())
    # the catalog, and the catalog's backups beside it (made on a schedule and when the server stops)
    assert local and all(name.startswith(("catalog.duckdb", "backups/catalog-")) for name in local), local
    bucket, prefix = s3_module_bucket.removeprefix("s3://").split("/", 1)
    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]]
    for run in captured.values():
        assert any(k.startswith(f"{prefix}/runs/{run}/acts/c/") for k in keys)
        assert f"{prefix}/runs/{run}/committed.json" in keys
    assert any(k.startswith(f"{prefix}/models/") and k.endswith("/.complete") for k in keys)
    assert any(k.startswith(f"{prefix}/datasets/") and k.endswith("/.complete") for k in keys)


def test_queries_on_the_object_store_match_the_formulas(s3_client, captured):
    a, b = captured["bert"], captured["bert24"]
    xs, ys = _layers(s3_client, a, 4), _layers(s3_client, b, 4)
    result = s3_client.cka(a, b)
    expected = np.array([[cka_numpy(x, y) for y in ys] for x in xs])
    np.testing.assert_allclose(result.biased, expected, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(result.debiased[3, 3], debiased_numpy(xs[3], ys[3]), rtol=1e-6, atol=1e-9)
    matrix = s3_client.cka_matrix([a, b])
    np.testing.assert_allclose(matrix.block(0, 1), expected, rtol=1e-6, atol=1e-9)
    cos = s3_client.cos(a, layers_a=[1], layers_b=[2], center="none")
    reference = np.mean(np.sum(xs[1] * xs[2], 1) / (np.linalg.norm(xs[1], axis=1) * np.linalg.norm(xs[2], axis=1)))
    np.testing.assert_allclose(cos.mean[0, 0], reference, rtol=1e-6)
    assert np.isfinite(s3_client.entropy("dataset_entropy", a).values).all()
    assert s3_client.neural_collapse(a, layers=[3]).values[0] > 0


def _as_written_before(url: str, run: str) -> None:
    """Rewrite a run as actstore wrote it before its shards carried their chunk rows and statistics:
    its array without the attribute for them, each shard object without them and two JSON objects
    beside it (through the store's writer for such runs, which a resumed capture of one takes)."""
    import zarr

    from actstore.store.format.arrays import ZarrArrayStore

    arrays = ZarrArrayStore(url)
    layout = arrays.layout(run)
    assert layout.dtype == "float16"  # read back as stored
    every = list(range(layout.num_states))
    shards = [(arrays.read_layers(run, every, *layout.shard_range(shard)).transpose(1, 0, 2),
               arrays.layer_sums(run, shard), *arrays.shard_details(run, shard)) for shard in range(layout.num_shards)]
    del zarr.open_array(store=arrays._zarr, path=f"runs/{run}/{layout.array_name}", mode="r+").attrs["shard_details"]
    older = ZarrArrayStore(url)
    for shard, (values, sums, rows, stats) in enumerate(shards):
        older.write_shard(run, shard, np.ascontiguousarray(values), sums, None, rows, stats)


def _chunk_rows(catalog, run: str) -> list[tuple]:
    cursor = catalog.cursor()
    try:
        return cursor.execute("SELECT shard, layer, rows, checksum, min, max, nan_count, inf_count FROM chunks "
                              "WHERE run_key = ? ORDER BY shard, layer", [run]).fetchall()
    finally:
        cursor.close()


def test_catalog_rebuild_from_the_object_store_alone(s3_service, s3_client, captured, s3_module_bucket, tmp_path):
    # one run as shards now carry their chunk rows, one as runs written before keep them (JSON objects)
    older = s3_client.capture("bert", "toy", pooling="last").run_key
    _as_written_before(s3_module_bucket, older)
    bucket, prefix = s3_module_bucket.removeprefix("s3://").split("/", 1)
    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]]
    assert f"{prefix}/runs/{older}/chunk_rows/0.json" in keys
    assert not any(k.startswith(f"{prefix}/runs/{captured['bert']}/chunk_rows/") for k in keys)
    fresh = tmp_path / "rebuilt.duckdb"
    out = subprocess.run([sys.executable, "-m", "actstore.cli", "catalog", "rebuild", "--store", s3_module_bucket,
                          "--catalog", str(fresh)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "2 models, 1 datasets, 0 label sets, 3 runs (3 committed)" in out.stdout
    assert "cached metric results" in out.stdout  # what it says it could not recover
    from actstore.store.catalog import Catalog

    original = s3_client.describe(captured["bert"])
    serving = s3_service[0].service.catalog
    catalog = Catalog(fresh)
    try:
        run = catalog.runs.get_committed(captured["bert"])
        health = catalog.chunks.health(run.run_key, run.num_layers)
        assert (run.n, run.rows, run.num_shards, run.width) == (original.n, original.rows, original.num_shards,
                                                               original.width)
        assert health.recorded_shards == original.num_shards
        assert {m.aliases[0] for m in catalog.models.all()} == {"bert", "bert24"}
        for key in (captured["bert"], older):  # every chunk row as the capture recorded it
            assert catalog.runs.get_committed(key) and _chunk_rows(catalog, key) == _chunk_rows(serving, key)
    finally:
        catalog.close()
    again = subprocess.run([sys.executable, "-m", "actstore.cli", "catalog", "rebuild", "--store", s3_module_bucket,
                            "--catalog", str(fresh)], capture_output=True, text=True, timeout=300)
    assert again.returncode == 2 and "exists" in again.stderr and "Traceback" not in again.stderr


def test_a_vanished_shard_object_is_data_loss_naming_run_and_shard(s3_client, captured, s3_module_bucket):
    run = s3_client.capture("bert", "toy", pooling="cls").run_key
    bucket, prefix = s3_module_bucket.removeprefix("s3://").split("/", 1)
    boto3.client("s3").delete_object(Bucket=bucket, Key=f"{prefix}/runs/{run}/acts/c/2/0/0")
    with pytest.raises(DataLoss, match=rf"run {run[:12]}: shard 2"):
        s3_client.cka(run)


def test_a_token_level_capture_on_the_object_store(s3_client, captured, tiny_models):
    """The layout (each prompt's token rows) comes from the server's `TokenLayouts` process, which
    reads the model's tokenizer and the texts out of the object store, as the replicas do."""
    from transformers import AutoTokenizer

    run = s3_client.capture("bert", "toy", pooling="tokens").run_key
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["bert"])
    counts = [len(tokenizer(text)["input_ids"]) for text in sentences(40)]
    info = s3_client.describe(run)
    assert info.status == "committed" and info.rows == sum(counts) and info.n == 40
    values, _ = s3_client.read_activations(run, 1)
    assert values.shape == (sum(counts), 16)
