"""Integrity end to end: real captured runs whose bytes are damaged on disk, queried through the
real gRPC client. Every read path (map tasks, in-memory tasks, prompt tasks, the lens, stitching,
the matrix job, ReadActivations, the server's own reads) says DATA_LOSS naming the run, the array
and the shard (and the layer where there is one); `verify` finds what is damaged, and a repair
plus the same capture again rewrites only the damaged shards, byte for byte as before."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from actstore.errors import DataLoss, FailedPrecondition, InvalidArgument
from tests.factories import sentences
from tests.test_cli import actstore

pytestmark = pytest.mark.long  # minutes of servers, clusters or venvs: started first (tests/conftest.py)

N = 40  # shards of 8 rows (tests/conftest.py make_settings): 5 pooled shards


def run_dir(server, run: str) -> Path:
    return Path(server.service.settings.store_root) / "runs" / run


def flip_chunk(server, run: str, shard: int, layer: int, array: str = "acts") -> None:
    """Flip one byte in the middle of the inner chunk (shard, layer), found through the shard's
    index (at the end: (offset, nbytes) per layer as little-endian uint64, then its crc32c)."""
    path = run_dir(server, run) / array / "c" / str(shard) / "0" / "0"
    data = bytearray(path.read_bytes())
    states = server.service.arrays.layout(run).num_states
    index = np.frombuffer(bytes(data[-(16 * states + 4):-4]), dtype="<u8").reshape(states, 2)
    offset, nbytes = (int(v) for v in index[layer])
    data[offset + nbytes // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def flip_sums(server, run: str, shard: int) -> None:
    """Flip one byte in the middle of the layer sums a shard object carries: float64 (L+1, d) and
    their crc32c, between the inner chunks and the index."""
    path = run_dir(server, run) / "acts" / "c" / str(shard) / "0" / "0"
    layout = server.service.arrays.layout(run)
    data = bytearray(path.read_bytes())
    data[len(data) - (16 * layout.num_states + 4) - (8 * layout.num_states * layout.width + 4) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def chunk_file(array_dir: Path) -> Path:
    """The one chunk file of a small side array."""
    [path] = [p for p in (array_dir / "c").rglob("*") if p.is_file()]
    return path


def flip_file(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def damaged(module_client, module_server, tiny_models):
    """Runs with one damaged chunk each, flipped before any query could cache an answer: four runs
    of two models (each model's replicas started once; a token run of another max_len is a run of
    its own)."""
    c = module_client
    c.register_model(tiny_models["bert"], name="bert")
    c.register_model(tiny_models["gpt2"], name="gpt2")
    c.register_dataset(texts=sentences(N, seed=5), labels=[i % 3 for i in range(N)], name="toy")
    runs = {"pooled": c.capture("bert", "toy", pooling="mean").run_key,
            "means": c.capture("bert", "toy", pooling="cls").run_key,
            "tokens": c.capture("gpt2", "toy", pooling="tokens").run_key,
            "token_ids": c.capture("gpt2", "toy", pooling="tokens", max_len=32).run_key}
    flip_chunk(module_server, runs["pooled"], shard=1, layer=2)
    flip_chunk(module_server, runs["tokens"], shard=1, layer=2, array="tokens")
    flip_file(run_dir(module_server, runs["token_ids"]) / "token_ids" / "c" / "1")
    flip_file(chunk_file(run_dir(module_server, runs["means"]) / "means"))
    return runs


def assert_names(info, run: str, array: str, shard: int, layer: int | None = None) -> None:
    message = str(info.value)
    assert f"run {run[:12]}" in message, message
    where = f"shard {shard} {'' if layer is None else f'layer {layer} '}of array '{array}'"
    assert where in message, message
    assert "verify" in message, message  # says what to do next
    assert "Traceback" not in message and "ray::" not in message, message


POOLED_QUERIES = {
    "cka": lambda c, r: c.cka(r),
    "cos": lambda c, r: c.cos(r, center="none"),
    "minibatch_cka": lambda c, r: c.minibatch_cka(r, batch_size=8),
    "mutual_knn": lambda c, r: c.mutual_knn(r, k=3),
    "dataset_entropy": lambda c, r: c.entropy("dataset_entropy", r),
    "effective_rank": lambda c, r: c.entropy("effective_rank", r),
    "residual_norm": lambda c, r: c.residual_norm(r),
    "neural_collapse": lambda c, r: c.neural_collapse(r, layers=[2]),
    "read_activations": lambda c, r: c.read_activations(r, 2),
    "cka_matrix": lambda c, r: c.cka_matrix([r]),
    "probe_ridge": lambda c, r: c.probe(r, alpha=1.0, folds=2),
    "probe_logistic": lambda c, r: c.probe(r, method="logistic", folds=2),
}


@pytest.mark.parametrize("query", list(POOLED_QUERIES))
def test_a_damaged_chunk_is_data_loss_in_every_pooled_query(module_client, damaged, query):
    with pytest.raises(DataLoss) as info:
        POOLED_QUERIES[query](module_client, damaged["pooled"])
    assert_names(info, damaged["pooled"], "acts", shard=1, layer=2)


TOKEN_QUERIES = {
    "prompt_entropy": lambda c, r: c.entropy("prompt_entropy", r),
    "curvature": lambda c, r: c.entropy("curvature", r),
    "lens": lambda c, r: c.lens(r),
    "stitch": lambda c, r: c.stitch(r, 2, r, 2),
    "read_activations": lambda c, r: c.read_activations(r, 2),
    "probe": lambda c, r: c.probe(r, pool="mean", alpha=1.0, folds=2),
}


@pytest.mark.parametrize("query", list(TOKEN_QUERIES))
def test_a_damaged_chunk_is_data_loss_in_every_token_query(module_client, damaged, query):
    with pytest.raises(DataLoss) as info:
        TOKEN_QUERIES[query](module_client, damaged["tokens"])
    assert_names(info, damaged["tokens"], "tokens", shard=1, layer=2)


def test_a_damaged_token_ids_chunk_is_data_loss_in_the_lens(module_client, damaged):
    with pytest.raises(DataLoss) as info:
        module_client.lens(damaged["token_ids"])
    assert_names(info, damaged["token_ids"], "token_ids", shard=1)


def test_damaged_means_are_data_loss_in_the_server_read(module_client, damaged):
    with pytest.raises(DataLoss, match=rf"run {damaged['means'][:12]}: array 'means' failed its crc32c check"):
        module_client.cos(damaged["means"], center="global-mean")


def test_a_missing_token_ids_chunk_is_data_loss_not_skipped_rows(module_client, module_server, damaged):
    """token_ids read as -1 (no label) where a chunk is missing: the lens would silently skip its rows."""
    c = module_client
    c.register_dataset(texts=sentences(12, seed=13), name="ids")
    run = c.capture("gpt2", "ids", pooling="tokens").run_key
    (run_dir(module_server, run) / "token_ids" / "c" / "1").unlink()
    with pytest.raises(DataLoss) as info:
        c.lens(run)
    assert_names(info, run, "token_ids", shard=1)
    assert "missing" in str(info.value)
    [verdict] = c.verify([run]).runs
    assert [(d.array, d.shard, d.reason) for d in verdict.damage] == [("token_ids", 1, "is missing from the store")]


# ---- verify -------------------------------------------------------------------------------------
def test_verify_finds_each_damaged_chunk_and_names_the_runs_to_recapture(module_client, module_server, damaged):
    report = module_client.verify(list(damaged.values()))
    verdicts = {v.run_key: v for v in report.runs}
    assert all(v.status == "damaged" and v.recapture for v in verdicts.values())
    assert sorted(report.recapture) == sorted(damaged.values())
    pooled = verdicts[damaged["pooled"]]
    assert pooled.shards == 5 and pooled.damaged_shards == [1]
    [hit] = pooled.damage
    assert (hit.array, hit.shard, hit.layer) == ("acts", 1, 2) and "crc32c" in hit.reason
    assert [(d.array, d.shard) for d in verdicts[damaged["token_ids"]].damage] == [("token_ids", 1)]
    assert [(d.array, d.shard, d.layer) for d in verdicts[damaged["means"]].damage] == [("means", -1, -1)]
    assert verdicts[damaged["means"]].damaged_shards == []

    # the CLI prints the table and exits non-zero
    proc = actstore("verify", damaged["pooled"], "-q", server=module_server)
    assert proc.returncode == 1, proc.stderr
    assert "damaged" in proc.stdout and damaged["pooled"] in proc.stdout and "Traceback" not in proc.stderr
    assert re.search(r"acts\s+1\s+2\s+", proc.stdout), proc.stdout
    assert re.search(r"\s5\s+1 \(shard 1\)\s+yes\s", proc.stdout), proc.stdout  # shards read, then damaged ones


def test_verify_checks_the_catalogs_chunk_rows_against_the_shards_present(module_client, module_server):
    module_client.register_dataset(texts=sentences(24, seed=8), name="rows")
    run = module_client.capture("bert", "rows", pooling="cls").run_key
    assert module_client.verify([run]).runs[0].status == "ok"
    shards = run_dir(module_server, run) / "acts" / "c"
    (shards / "2" / "0" / "0").unlink()
    # shards 0 and 1 swapped: every chunk passes its crc32c, but not the checksum the catalog recorded
    first, second = (shards / "0" / "0" / "0").read_bytes(), (shards / "1" / "0" / "0").read_bytes()
    (shards / "0" / "0" / "0").write_bytes(second)
    (shards / "1" / "0" / "0").write_bytes(first)
    [verdict] = module_client.verify([run]).runs
    assert verdict.damaged_shards == [0, 1, 2]
    reasons = {(d.shard, d.layer): d.reason for d in verdict.damage}
    assert "missing" in reasons[(2, -1)]
    # layer 0 of a CLS-pooled run is the same embedding for every sample: the swap shows in layers 1..3
    assert all("recorded in the catalog" in reasons[(s, layer)] for s in (0, 1) for layer in range(1, 4))
    proc = actstore("verify", "--all", "-q", "--json", server=module_server)
    assert proc.returncode == 1 and run in proc.stdout


def test_verify_requests_are_checked(module_client, damaged):
    with pytest.raises(InvalidArgument, match="--all"):
        module_client.verify()
    with pytest.raises(InvalidArgument, match="not both"):
        module_client.verify([damaged["pooled"]], all_runs=True)


def files_of(root: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_repair_then_the_same_capture_rewrites_only_the_damaged_shards(module_client, module_server):
    c = module_client
    c.register_dataset(texts=sentences(32, seed=9), labels=[i % 2 for i in range(32)], name="repair")
    run = c.capture("bert", "repair", pooling="mean").run_key
    root = run_dir(module_server, run)
    clean = files_of(root)
    clean_layers = [c.read_activations(run, layer)[0] for layer in range(4)]
    flip_chunk(module_server, run, shard=1, layer=0)
    flip_sums(module_server, run, shard=3)

    report = c.verify([run], repair=True)
    [verdict] = report.runs
    assert report.repair and verdict.status == "repaired" and verdict.damaged_shards == [1, 3]
    assert {(d.array, d.shard) for d in verdict.damage} == {("acts", 1), ("layer_sums", 3)}, verdict.damage
    assert "crc32c" in next(d.reason for d in verdict.damage if d.array == "layer_sums")
    assert verdict.run_status == "failed" and verdict.recapture
    assert c.describe(run).status == "failed"
    with pytest.raises(FailedPrecondition):
        c.cka(run)

    job = c.capture("bert", "repair", pooling="mean")
    assert not job.cache_hit and job.run_key == run
    assert c.describe(run).status == "committed"
    after = files_of(root)
    assert {name: data for name, (data, _) in after.items()} == {name: data for name, (data, _) in clean.items()}
    rewritten = {name for name in after if after[name][1] != clean[name][1]}
    shard_files = {name for name in rewritten if name.split("/")[0] in ("acts", "layer_sums")}
    assert shard_files == {"acts/c/1/0/0", "acts/c/3/0/0"}, rewritten
    for layer in range(4):
        np.testing.assert_array_equal(c.read_activations(run, layer)[0], clean_layers[layer])
    assert c.verify([run]).runs[0].status == "ok"


@pytest.mark.parametrize("array", ["sample_ids", "group"])
def test_repair_of_a_run_wide_array_deletes_the_run_for_a_whole_capture(module_client, module_server, array):
    c = module_client
    c.register_dataset(texts=sentences(16, seed=10), name="whole")
    run = c.capture("bert", "whole", pooling="mean").run_key
    if array == "group":  # a truncated zarr.json of the run's group
        metadata = run_dir(module_server, run) / "zarr.json"
        metadata.write_bytes(metadata.read_bytes()[:40])
    else:
        flip_file(chunk_file(run_dir(module_server, run) / array))
    [verdict] = c.verify([run], repair=True).runs
    assert verdict.status == "repaired" and verdict.run_status == "deleted"
    assert [d.array for d in verdict.damage] == [array]
    assert run not in {r.run_key for r in c.runs()}
    assert c.capture("bert", "whole", pooling="mean").run_key == run
    assert c.verify([run]).runs[0].status == "ok"


def test_verify_and_repair_on_the_object_store(s3_bucket, tmp_path, tiny_models, ray_cluster):
    import boto3

    from actstore.client import Client
    from actstore.server.app import start_server
    from tests.conftest import make_settings

    running = start_server(make_settings(s3_bucket, server_dir=str(tmp_path / "server")))
    try:
        with Client(f"127.0.0.1:{running.port}") as c:
            c.register_model(tiny_models["bert"], name="bert")
            c.register_dataset(texts=sentences(24, seed=12), name="s3")
            run = c.capture("bert", "s3", pooling="mean").run_key
            clean = [c.read_activations(run, layer)[0] for layer in range(4)]
            assert c.verify(all_runs=True).runs[0].status == "ok"
            bucket, prefix = s3_bucket.removeprefix("s3://").split("/", 1)
            s3 = boto3.client("s3")
            s3.delete_object(Bucket=bucket, Key=f"{prefix}/runs/{run}/acts/c/2/0/0")
            key = f"{prefix}/runs/{run}/acts/c/0/0/0"
            data = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
            data[len(data) // 3] ^= 0xFF
            s3.put_object(Bucket=bucket, Key=key, Body=bytes(data))

            [verdict] = c.verify([run]).runs
            assert verdict.status == "damaged" and verdict.damaged_shards == [0, 2]
            assert c.verify([run], repair=True).runs[0].status == "repaired"
            assert not c.capture("bert", "s3", pooling="mean").cache_hit
            assert c.verify([run]).runs[0].status == "ok"
            for layer in range(4):
                np.testing.assert_array_equal(c.read_activations(run, layer)[0], clean[layer])
    finally:
        running.stop()


def test_verify_needs_a_writer_and_repair_an_admin(tmp_path, ray_cluster, monkeypatch):
    from actstore.client import Client
    from actstore.errors import PermissionDenied
    from actstore.server.app import start_server
    from actstore.server.auth import create_token
    from tests.conftest import make_settings

    monkeypatch.delenv("ACTSTORE_TOKEN", raising=False)
    running = start_server(make_settings(tmp_path / "store", auth=True))
    try:
        catalog = running.service.catalog
        tokens = {role: create_token(catalog, f"{role}-v", role) for role in ("reader", "writer", "admin")}
        address = f"127.0.0.1:{running.port}"
        with Client(address, token=tokens["reader"]) as c, pytest.raises(PermissionDenied, match="SubmitVerify"):
            c.verify(all_runs=True)
        with Client(address, token=tokens["writer"]) as c:
            report = c.verify(all_runs=True)
            assert report.runs == [] and c.verify_report(report.job_id) == report
            with pytest.raises(PermissionDenied, match="SubmitRepair needs the admin role"):
                c.verify(all_runs=True, repair=True)
        with Client(address, token=tokens["admin"]) as c:
            assert c.verify(all_runs=True, repair=True).repair
    finally:
        running.stop()
