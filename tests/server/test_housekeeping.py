"""Housekeeping against real servers: catalog backups (on demand, on a schedule, at shutdown) and
restore, `gc` of every kind of garbage (dry run first), and job progress across a restart."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from actstore.client import Client
from actstore.errors import DataLoss, PermissionDenied
from actstore.server.app import start_server
from actstore.server.auth import create_token
from actstore.store.catalog import backups
from actstore.store.format.arrays import COMMIT_MARKER
from tests.conftest import make_settings
from tests.factories import sentences
from tests.server.test_resume import _free_port, _in_process, _registered, _serve, _stop

pytestmark = pytest.mark.long  # minutes of servers, clusters or venvs: started first (tests/conftest.py)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "actstore.cli", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "ACTSTORE_ADDRESS": ""})


def _populate(client: Client, models) -> list[str]:
    client.register_model(models["bert"], name="bert")
    client.register_dataset(texts=sentences(24, seed=3), name="toy")
    return [client.capture("bert", "toy", pooling=p).run_key for p in ("cls", "mean")]


@pytest.fixture(scope="module")
def template(tmp_path_factory, ray_cluster, tiny_models) -> tuple[Path, list[str]]:
    """A stopped store holding `_populate`'s runs (3 shards each), and no backup: a test copies it
    instead of capturing the same runs again."""
    store = tmp_path_factory.mktemp("template") / "store"
    server = start_server(make_settings(store, catalog_backup_seconds=0))
    try:
        with Client(f"127.0.0.1:{server.port}") as client:
            runs = _populate(client, tiny_models)
    finally:
        server.stop()  # its catalog closed: a copy is whole
    return store, runs


def _copy(template: tuple[Path, list[str]], store: Path) -> list[str]:
    shutil.copytree(template[0], store)
    return template[1]


# ---- backups and restore ------------------------------------------------------------------------
def test_backup_damage_restore_and_the_runs_are_back(tmp_path, template):
    store = tmp_path / "store"
    runs = _copy(template, store)
    server = start_server(make_settings(store, catalog_backup_seconds=0))  # only the backup asked for
    try:
        with Client(f"127.0.0.1:{server.port}") as client:
            made = client.backup_catalog()
            assert Path(made.path).parent == store / "backups" and made.bytes > 0 and made.kept == [made.path]
    finally:
        server.stop()
    assert backups.list_backups(store / "catalog.duckdb") == [Path(made.path)], "0 = no backup at shutdown"
    catalog = store / "catalog.duckdb"
    data = bytearray(catalog.read_bytes())
    data[:4096] = os.urandom(4096)  # the header: DuckDB cannot open it
    catalog.write_bytes(bytes(data))

    with pytest.raises(DataLoss) as info:
        start_server(make_settings(store))
    assert f"actstore catalog restore {made.path}" in str(info.value) and "catalog rebuild" in str(info.value)

    restored = _cli("catalog", "restore", "--catalog", str(catalog))
    assert restored.returncode == 0, restored.stderr
    assert f"restored {catalog} from {made.path}" in restored.stdout
    assert [p.name for p in store.iterdir() if p.name.startswith("catalog.duckdb.replaced-")], "damaged file gone"

    server = start_server(make_settings(store))
    try:
        with Client(f"127.0.0.1:{server.port}") as client:
            assert sorted(r.run_key for r in client.runs(status="committed")) == sorted(runs)
            assert client.cka(runs[0]).biased.shape == (4, 4)  # the arrays are reachable again
    finally:
        server.stop()


def test_restore_refuses_while_a_server_holds_the_catalog(tmp_path, ray_cluster):
    store = tmp_path / "store"
    server = start_server(make_settings(store))
    try:
        with Client(f"127.0.0.1:{server.port}") as client:
            client.backup_catalog()
        before = sorted(p.name for p in store.iterdir())
        refused = _cli("catalog", "restore", "--catalog", str(store / "catalog.duckdb"))
        assert refused.returncode == 2
        assert "in use by a running actstore server" in refused.stderr and "stop the server" in refused.stderr
        assert "Traceback" not in refused.stderr
        assert sorted(p.name for p in store.iterdir()) == before, "restore touched the live catalog"
        with Client(f"127.0.0.1:{server.port}") as client:
            assert client.runs() == []  # still serving
    finally:
        server.stop()


def test_rebuild_records_the_readable_shards_and_names_the_lost_ones(tmp_path, template):
    store = tmp_path / "store"
    damaged, intact = _copy(template, store)
    shards = store / "runs" / damaged / "acts" / "c"
    (shards / "1" / "0" / "0").unlink()
    (shards / "2" / "0" / "0").write_bytes(os.urandom(4096))
    (store / "catalog.duckdb").rename(tmp_path / "lost.duckdb")

    rebuilt = _cli("catalog", "rebuild", "--store", str(store))
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "2 runs (1 committed)" in rebuilt.stdout
    [line] = [line for line in rebuilt.stdout.splitlines() if damaged[:12] in line]
    assert "2 of 3 shards" in line and "shard 1 is missing" in line and "shard 2 of array" in line, line
    assert "crc32c" in line and "submit the same capture again" in line and "verify" not in line, line
    assert not [p for p in store.iterdir() if "staging" in p.name]

    server = start_server(make_settings(store))
    try:
        with Client(f"127.0.0.1:{server.port}") as client:
            run = client.describe(damaged)
            assert (run.status, run.recorded_shards) == ("failed", 1)
            assert client.describe(intact).status == "committed"
            capture = line.split("`")[1].split()  # the command the report gives
            again = _cli("--address", f"127.0.0.1:{server.port}", *capture[1:], "-q")
            assert again.returncode == 0, again.stderr
            assert client.describe(damaged).status == "committed"
            assert client.verify([damaged]).runs[0].status == "ok"
            assert client.cka(damaged).biased.shape == (4, 4)
    finally:
        server.stop()


def test_backups_on_a_schedule_and_at_shutdown_keep_the_last_k(tmp_path, ray_cluster):
    store = tmp_path / "store"
    server = start_server(make_settings(store, catalog_backup_seconds=0.2, catalog_backups_kept=2))
    try:
        deadline = time.monotonic() + 30
        while len(backups.list_backups(store / "catalog.duckdb")) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        server.stop()
    kept = backups.list_backups(store / "catalog.duckdb")
    assert len(kept) == 2
    server = start_server(make_settings(store, catalog_backup_seconds=3600, catalog_backups_kept=2))
    server.stop()
    newest = backups.list_backups(store / "catalog.duckdb")
    assert len(newest) == 2 and newest[-1] not in kept, "no backup at a clean shutdown"


def test_backup_and_gc_are_admin_only(tmp_path, ray_cluster, monkeypatch):
    monkeypatch.delenv("ACTSTORE_TOKEN", raising=False)
    server = start_server(make_settings(tmp_path / "store", auth=True))
    try:
        tokens = {role: create_token(server.service.catalog, role, role) for role in ("writer", "admin")}
        with Client(f"127.0.0.1:{server.port}", token=tokens["writer"]) as client:
            for call in (client.backup_catalog, client.collect_garbage):
                with pytest.raises(PermissionDenied, match="admin"):
                    call()
        with Client(f"127.0.0.1:{server.port}", token=tokens["admin"]) as client:
            assert client.collect_garbage().items == []
            assert client.backup_catalog().bytes > 0
    finally:
        server.stop()


# ---- gc -----------------------------------------------------------------------------------------
@pytest.fixture
def populated(tmp_path, template):
    runs = _copy(template, tmp_path / "store")
    server = start_server(make_settings(tmp_path / "store"))
    try:
        with Client(f"127.0.0.1:{server.port}") as client:
            yield server, client, runs
    finally:
        server.stop()


def _kinds(report) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for item in report.items:
        found.setdefault(item.kind, []).append(item.name)
    return found


def test_gc_of_cached_results_by_age_and_by_size_budget(populated):
    server, client, runs = populated
    client.cka(runs[0])
    client.cos(runs[1])
    results = server.service.catalog.results.cached()  # oldest first
    assert len(results) == 2
    assert client.collect_garbage().items == [], "fresh results are not older than 7d"

    dry = client.collect_garbage(older_than="0s")
    assert not dry.applied and sorted(_kinds(dry)["result"]) == sorted(r[0] for r in results)
    assert all(item.bytes > 0 for item in dry.items) and dry.total_bytes == sum(r[2] for r in results)
    assert client.cka(runs[0]).provenance.cached, "a dry run deleted a result"

    budget = client.collect_garbage(max_bytes=results[1][2], apply=True)  # room for the newest only
    assert budget.applied and [i.name for i in budget.items] == [results[0][0]]
    assert "budget" in budget.items[0].reason
    assert not client.cka(runs[0]).provenance.cached  # recomputed: its cached result was removed
    assert client.cos(runs[1]).provenance.cached

    removed = client.collect_garbage(older_than="0s", apply=True)
    assert len(removed.items) == 2 and server.service.catalog.results.cached() == []
    assert client.collect_garbage(older_than="0s").items == []


def test_gc_of_orphaned_and_failed_runs_never_of_committed_ones(populated):
    server, client, runs = populated
    store = Path(server.service.settings.store_root)
    keep, orphan = runs
    catalog = server.service.catalog
    # a deletion cut short after the catalog and the commit marker went: the folder is left
    catalog.runs.delete(orphan)
    (store / "runs" / orphan / COMMIT_MARKER).unlink()
    dry = client.collect_garbage()
    assert _kinds(dry) == {"orphaned-run": [orphan]} and dry.items[0].bytes > 0
    assert (store / "runs" / orphan).is_dir(), "a dry run deleted a folder"

    catalog.runs.set_status(keep, "failed")  # as a capture that failed leaves it
    assert "failed-run" not in _kinds(client.collect_garbage()), "a fresh failed run is younger than 7d"
    assert _kinds(client.collect_garbage(older_than="0s"))["failed-run"] == [keep]
    catalog.runs.set_status(keep, "committed")
    assert _kinds(client.collect_garbage(older_than="0s")) == {"orphaned-run": [orphan]}

    applied = client.collect_garbage(older_than="0s", apply=True)
    assert _kinds(applied) == {"orphaned-run": [orphan]} and not (store / "runs" / orphan).exists()
    assert client.read_activations(keep, 1)[0].shape == (24, 16), "a committed run lost its arrays"

    catalog.runs.set_status(keep, "failed")
    applied = client.collect_garbage(older_than="0s", apply=True)
    assert _kinds(applied) == {"failed-run": [keep]}
    assert client.runs() == [] and not (store / "runs" / keep).exists()


def test_gc_keeps_a_committed_run_that_the_catalog_lost(populated):
    server, client, runs = populated
    store = Path(server.service.settings.store_root)
    server.service.catalog.runs.delete(runs[0])  # as a catalog restored from an older backup lacks it
    report = client.collect_garbage(older_than="0s", apply=True)
    assert report.items == [] and any(runs[0] in line and "catalog rebuild" in line for line in report.kept)
    assert (store / "runs" / runs[0] / COMMIT_MARKER).exists()


def _leftover_partials(store: Path, key: str) -> Path:
    folder = store / "partials" / key
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tile-0.npz").write_bytes(b"\x01" * 1000)
    return folder


def test_gc_of_matrix_job_partials(populated):
    server, client, runs = populated
    store = Path(server.service.settings.store_root)
    job = client.wait(client.submit_cka_matrix(runs).job_id)
    assert job.status == "done"
    finished = _leftover_partials(store, job.target)  # as a crash between storing and cleaning leaves them
    assert "partials" not in _kinds(client.collect_garbage()), "fresh partials of a finished job are kept 7d"
    dry = client.collect_garbage(older_than="0s")
    assert _kinds(dry)["partials"] == [job.target] and finished.is_dir()
    assert "done" in next(i for i in dry.items if i.kind == "partials").reason

    # an unfinished job of an earlier server: the next start resumes it from its partials
    server.service.catalog.jobs.update(job.job_id, status="running")
    assert "partials" not in _kinds(client.collect_garbage(older_than="0s"))

    # a live job: never, even when its runs are gone
    release = threading.Event()
    server.service.jobs.start("cka-matrix", job.target, {"runs": runs}, lambda state: release.wait(60))
    try:
        client.delete_run(runs[1])
        assert "partials" not in _kinds(client.collect_garbage(older_than="0s", apply=True))
        assert finished.is_dir()
    finally:
        release.set()
    while server.service.jobs.live_for(job.target) is not None:
        time.sleep(0.05)

    # the job's run was deleted: its partials go at any age
    report = client.collect_garbage(apply=True)
    assert _kinds(report) == {"partials": [job.target]} and "deleted run" in report.items[0].reason
    assert report.items[0].bytes == 1000 and not finished.exists()


def test_gc_cli_is_a_dry_run_unless_apply(populated):
    server, client, runs = populated
    client.cka(runs[0])
    address = f"127.0.0.1:{server.port}"
    dry = _cli("gc", "--address", address, "--older-than", "0s")
    assert dry.returncode == 0, dry.stderr
    assert "would remove 1 items" in dry.stdout and "--apply" in dry.stdout and "result" in dry.stdout
    assert len(server.service.catalog.results.cached()) == 1
    applied = _cli("gc", "--address", address, "--older-than", "0s", "--apply")
    assert applied.returncode == 0 and "removed 1 items" in applied.stdout
    assert server.service.catalog.results.cached() == []
    bad = _cli("gc", "--address", address, "--older-than", "a week")
    assert bad.returncode == 2 and "INVALID_ARGUMENT" in bad.stderr and "7d" in bad.stderr


# ---- job state across a restart -----------------------------------------------------------------
def test_job_progress_survives_a_server_crash(tmp_path, ray_cluster, tiny_models, monkeypatch):
    """A server process SIGKILLed mid-capture; the next server on the store (in this process, not
    resuming) lists the job as interrupted with the progress the killed one last wrote."""
    store, port = tmp_path / "store", _free_port()
    _registered(store, None, tiny_models, sentences(400, seed=9))
    monkeypatch.setenv("ACTSTORE_JOB_PROGRESS_SECONDS", "0")
    server = _serve(store, port, ray_cluster)
    try:
        with Client(f"127.0.0.1:{port}") as client:
            job = client.submit_capture("bert", "big")
            for state in client.watch(job.job_id):
                if state.done >= 3:
                    break
    finally:
        _stop(server, signal.SIGKILL)

    with _in_process(store, None, resume_on_start=False) as client:
        (listed,) = client.jobs()
        assert listed.job_id == job.job_id and listed.status == "interrupted"
        assert listed.total == 50 and 3 <= listed.done < 50, (listed.done, listed.total)
        assert client.job(job.job_id).done == listed.done


def test_gc_and_backups_on_an_object_store(s3_bucket, tmp_path, ray_cluster, tiny_models):
    import boto3

    server_dir = tmp_path / "server-dir"
    server = start_server(make_settings(s3_bucket, server_dir=str(server_dir)))
    bucket, prefix = s3_bucket.removeprefix("s3://").split("/", 1)
    s3 = boto3.client("s3")

    def objects(run: str) -> list[str]:
        return [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/runs/{run}/").get("Contents", [])]

    try:
        with Client(f"127.0.0.1:{server.port}") as client:
            keep, orphan = _populate(client, tiny_models)
            made = client.backup_catalog()
            assert Path(made.path).parent == server_dir / "backups", "backups live beside the catalog"
            server.service.catalog.runs.delete(orphan)
            s3.delete_object(Bucket=bucket, Key=f"{prefix}/runs/{orphan}/{COMMIT_MARKER}")
            dry = client.collect_garbage()
            assert _kinds(dry) == {"orphaned-run": [orphan]} and dry.items[0].bytes > 0 and objects(orphan)
            assert _kinds(client.collect_garbage(apply=True)) == {"orphaned-run": [orphan]}
            assert objects(orphan) == [] and objects(keep)
            assert client.read_activations(keep, 1)[0].shape == (24, 16)
    finally:
        server.stop()
