"""A run's damaged metadata objects over a real gRPC server: the group's and the arrays' zarr.json
truncated, not JSON, or with a flipped byte (one that still parses too). Every query kind answers
DATA_LOSS naming the run and the object, never INTERNAL and never numbers; `verify` reports the
object, and a repair deletes the run, so that the same capture writes it whole.

The runs are captured by a server that then stops, and each test module's damage is done to a copy
of that store: a process that opened a run keeps its layout and codecs (a Ray worker too, for the
store it was handed), and would read the intact chunks on without meeting the damage."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from actstore.client import Client
from actstore.errors import DataLoss
from actstore.server.app import start_server
from tests.conftest import make_settings
from tests.factories import sentences

N = 24  # 3 shards of 8 rows (tests/conftest.py make_settings)


def _captured(client: Client, models) -> dict[str, str]:
    client.register_model(models["bert"], name="bert")
    client.register_model(models["bert24"], name="bert24")
    client.register_dataset(texts=sentences(N, seed=21), labels=[i % 3 for i in range(N)], name="meta")
    runs = {case: client.capture("bert", "meta", pooling=pooling).run_key
            for case, pooling in (("group", "cls"), ("acts", "mean"), ("labels", "last"))}
    runs.update({case: client.capture("bert24", "meta", pooling=pooling).run_key
                 for case, pooling in (("layout", "cls"), ("means", "mean"), ("intact", "last"))})
    return runs


def _flip(path: Path, at: int, bit: int = 0xFF) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= bit
    path.write_bytes(bytes(data))


def _damage(root: Path, runs: dict[str, str]) -> None:
    """One kind of damage per run (`root`: the store's runs folder)."""
    group = root / runs["group"] / "zarr.json"
    group.write_bytes(group.read_bytes()[: group.stat().st_size // 2])  # truncated
    acts = root / runs["acts"] / "acts" / "zarr.json"
    acts.write_bytes(acts.read_bytes()[:40])  # truncated
    labels = root / runs["labels"] / "labels" / "zarr.json"
    _flip(labels, labels.stat().st_size // 2)  # a flipped byte: not UTF-8
    (root / runs["means"] / "means" / "zarr.json").write_bytes(b'{"zarr_format": 3, "node_type": "array", ')
    layout = root / runs["layout"] / "zarr.json"  # one bit of the layout's row count: still JSON
    _flip(layout, layout.read_bytes().index(b'"rows": 24') + len(b'"rows": 2'), 0x01)
    assert b'"rows": 25' in layout.read_bytes()


@pytest.fixture(scope="module")
def damaged(tmp_path_factory, ray_cluster, tiny_models):
    origin = tmp_path_factory.mktemp("origin") / "store"
    server = start_server(make_settings(origin))
    try:
        with Client(f"127.0.0.1:{server.port}") as client:
            runs = _captured(client, tiny_models)
    finally:
        server.stop()  # its catalog closed: the copy below is whole
    store = tmp_path_factory.mktemp("damaged") / "store"
    shutil.copytree(origin, store)
    _damage(store / "runs", runs)
    server = start_server(make_settings(store))
    try:
        with Client(f"127.0.0.1:{server.port}") as client:
            yield client, runs
    finally:
        server.stop()


def assert_names(info, run: str, key: str) -> None:
    message = str(info.value)
    assert f"run {run[:12]}" in message and key in message, message
    assert f"`actstore verify {run[:12]} --repair` deletes the run" in message, message  # what to do next
    assert "Traceback" not in message and "ray::" not in message, message


QUERIES = {
    "cka": lambda c, r, other: c.cka(r),
    "cka_pair": lambda c, r, other: c.cka(other, r),
    "cos": lambda c, r, other: c.cos(r, center="none"),
    "dataset_entropy": lambda c, r, other: c.entropy("dataset_entropy", r),
    "batches": lambda c, r, other: list(c.batches(r, batch_size=8, shuffle=False)),
    "read_activations": lambda c, r, other: c.read_activations(r, 2),
}


@pytest.mark.parametrize("query", list(QUERIES))
@pytest.mark.parametrize("case", ["group", "acts"])
def test_a_truncated_metadata_object_is_data_loss_in_every_query(damaged, case, query):
    client, runs = damaged
    run = runs[case]
    other = runs["intact"]  # the pair's other run: readable (CKA takes runs of any widths)
    key = f"runs/{run}/zarr.json" if case == "group" else f"runs/{run}/acts/zarr.json"
    with pytest.raises(DataLoss) as info:
        QUERIES[query](client, run, other)
    assert_names(info, run, key)


@pytest.mark.parametrize("query", ["neural_collapse", "batches"])
def test_array_metadata_with_a_flipped_byte_is_data_loss(damaged, query):
    client, runs = damaged
    run = runs["labels"]
    with pytest.raises(DataLoss) as info:
        if query == "batches":
            list(client.batches(run, batch_size=8))
        else:
            client.neural_collapse(run, layers=[1])
    assert_names(info, run, f"runs/{run}/labels/zarr.json")
    assert "does not decode (UnicodeDecodeError" in str(info.value)


def test_invalid_json_in_the_means_metadata_is_data_loss(damaged):
    client, runs = damaged
    with pytest.raises(DataLoss) as info:
        client.cos(runs["means"], center="global-mean")  # the server reads the means itself
    assert_names(info, runs["means"], f"runs/{runs['means']}/means/zarr.json")


@pytest.mark.parametrize("query", ["cka", "dataset_entropy", "read_activations"])
def test_a_flipped_digit_in_the_layout_is_data_loss_not_numbers(damaged, query):
    """"rows": 24 -> 25 is valid JSON: reads would go on with a row that is not there."""
    client, runs = damaged
    run = runs["layout"]
    with pytest.raises(DataLoss) as info:
        QUERIES[query](client, run, None)
    assert_names(info, run, f"runs/{run}/zarr.json does not match runs/{run}/acts/zarr.json")


def test_verify_reports_each_damaged_metadata_object(damaged):
    client, runs = damaged
    report = client.verify([runs[case] for case in ("group", "acts", "labels", "means", "layout", "intact")])
    verdicts = {v.run_key: v for v in report.runs}
    expected = {"group": ("group", "zarr.json"), "acts": ("acts/zarr.json", "acts/zarr.json"),
                "labels": ("labels/zarr.json", "labels/zarr.json"), "means": ("means/zarr.json", "means/zarr.json"),
                "layout": ("group", "zarr.json) is not the run's in the catalog")}
    for case, (array, said) in expected.items():
        verdict = verdicts[runs[case]]
        assert verdict.status == "damaged" and verdict.recapture, (case, verdict)
        assert [(d.array, d.shard, d.layer) for d in verdict.damage] == [(array, -1, -1)], (case, verdict.damage)
        assert f"runs/{runs[case]}/{said}" in verdict.damage[0].reason, (case, verdict.damage[0].reason)
        assert verdict.damaged_shards == [], case
    assert verdicts[runs["intact"]].status == "ok"
    assert sorted(report.recapture) == sorted(runs[case] for case in expected)


def test_repair_deletes_the_run_and_the_same_capture_writes_it_whole(damaged):
    client, runs = damaged
    run = runs["acts"]
    [verdict] = client.verify([run], repair=True).runs
    assert (verdict.status, verdict.run_status) == ("repaired", "deleted")
    assert client.capture("bert", "meta", pooling="mean").run_key == run
    assert client.verify([run]).runs[0].status == "ok"
    assert np.isfinite(client.cka(run).biased).all()


def test_a_truncated_metadata_object_on_the_object_store(s3_bucket, s3_server, tmp_path, tiny_models, ray_cluster):
    import boto3

    first = tmp_path / "server"
    server = start_server(make_settings(s3_bucket, server_dir=str(first)))
    try:
        with Client(f"127.0.0.1:{server.port}") as client:
            client.register_model(tiny_models["bert"], name="bert")
            client.register_dataset(texts=sentences(16, seed=22), name="s3meta")
            run = client.capture("bert", "s3meta", pooling="mean").run_key
    finally:
        server.stop()
    # a copy under another prefix (and of the server's directory, with the catalog): see the module's docstring
    s3 = boto3.client("s3", endpoint_url=s3_server)
    bucket, prefix = s3_bucket.removeprefix("s3://").split("/", 1)
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for item in page.get("Contents", []):
            s3.copy_object(Bucket=bucket, Key="copy/" + item["Key"], CopySource={"Bucket": bucket, "Key": item["Key"]})
    shutil.copytree(first, tmp_path / "copy")
    key = f"runs/{run}/acts/zarr.json"
    metadata = s3.get_object(Bucket=bucket, Key=f"copy/{prefix}/{key}")["Body"].read()
    s3.put_object(Bucket=bucket, Key=f"copy/{prefix}/{key}", Body=metadata[: len(metadata) // 2])

    server = start_server(make_settings(f"s3://{bucket}/copy/{prefix}", server_dir=str(tmp_path / "copy")))
    try:
        with Client(f"127.0.0.1:{server.port}") as client:
            for query in ("cka", "cos", "dataset_entropy", "batches"):
                with pytest.raises(DataLoss) as info:
                    QUERIES[query](client, run, None)
                assert_names(info, run, key)
            [verdict] = client.verify([run]).runs
            assert [(d.array, d.shard) for d in verdict.damage] == [("acts/zarr.json", -1)], verdict.damage
            assert key in verdict.damage[0].reason
    finally:
        server.stop()
