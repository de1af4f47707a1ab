"""A catalog rebuilt after its server was killed opens. A server killed with SIGKILL leaves its
write-ahead log beside the catalog; the operator deletes the catalog (or moves it aside, as the
DATA_LOSS advice says) and runs `actstore catalog rebuild`; the next `serve` must open the new file,
not replay the dead server's log onto it and exit ("WAL does not match database file"). The killed
server and the refused `serve` are processes of their own; the servers that open a rebuilt catalog
run in this process (`serve` opens it with the same `start_server`). Real DuckDB files, a local store
and one on the loopback S3 server."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from actstore.client import Client
from tests.factories import sentences
from tests.server.test_housekeeping import _cli
from tests.server.test_resume import _free_port, _in_process, _registered, _serve, _stop

pytestmark = pytest.mark.long  # minutes of servers, clusters or venvs: started first (tests/conftest.py)


@pytest.fixture(params=["local", "s3"])
def where(request, tmp_path):
    """(store, server dir or None, the catalog file): the catalog of an s3:// store lives in the
    server's own directory."""
    if request.param == "local":
        return tmp_path / "store", None, tmp_path / "store" / "catalog.duckdb"
    return request.getfixturevalue("s3_bucket"), tmp_path / "server", tmp_path / "server" / "catalog.duckdb"


def _rebuild(store, server_dir, *more: str) -> subprocess.CompletedProcess:
    extra = ["--server-dir", str(server_dir)] if server_dir is not None else []
    return _cli("catalog", "rebuild", "--store", str(store), *extra, *more)


def _check_serves(store, server_dir, runs: list[str]) -> None:
    with _in_process(store, server_dir) as client:  # raises if it cannot open the catalog
        assert sorted(r.run_key for r in client.runs(status="committed")) == sorted(runs)
        assert client.cka(runs[0]).biased.shape == (4, 4)  # the arrays are reachable through it


def _refused(store, server_dir, ray_address) -> str:
    """The output of a `serve` that exits at once (a catalog it cannot open)."""
    env = {**os.environ, "RAY_ADDRESS": ray_address, "ACTSTORE_ADDRESS": ""}
    if server_dir is not None:
        env["ACTSTORE_SERVER_DIR"] = str(server_dir)
    proc = subprocess.run([sys.executable, "-m", "actstore.cli", "serve", "--store", str(store), "--port",
                           str(_free_port())], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    return proc.stderr


def test_kill_then_delete_then_rebuild_then_serve(where, ray_cluster, tiny_models):
    store, server_dir, catalog = where
    wal = catalog.with_name(catalog.name + ".wal")
    port = _free_port()
    _registered(store, server_dir, tiny_models, sentences(24, seed=3))
    server = _serve(store, port, ray_cluster, server_dir)
    try:
        with Client(f"127.0.0.1:{port}") as client:
            runs = [client.capture("bert", "big", pooling=p).run_key for p in ("cls", "mean")]
    finally:
        _stop(server, signal.SIGKILL)
    assert wal.exists(), "the killed server left no write-ahead log: nothing here is tested"
    left = wal.read_bytes()

    catalog.unlink()  # the operator deletes the file the README names; its log stays beside it
    rebuilt = _rebuild(store, server_dir)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "2 runs (2 committed)" in rebuilt.stdout, rebuilt.stdout
    aside_name = r"catalog\.duckdb\.replaced-\d{8}T\d{6}\.\d{6}Z\.wal"
    [aside] = [p for p in catalog.parent.iterdir() if re.fullmatch(aside_name, p.name)]
    assert not wal.exists() and aside.read_bytes() == left, "the dead server's log is kept, aside"
    assert "moved aside: the write-ahead log the lost catalog left beside it (catalog.duckdb.wal" in rebuilt.stdout
    assert str(aside) in rebuilt.stdout, rebuilt.stdout
    _check_serves(store, server_dir, runs)  # before the fix: DATA_LOSS, "WAL does not match"

    # the DATA_LOSS advice, followed as written, works: a foreign log beside a good catalog (what a
    # rebuild used to leave) stops `serve`; move the catalog aside and rebuild as the message says
    wal.write_bytes(left)
    refused = _refused(store, server_dir, ray_cluster)
    assert "error (DATA_LOSS)" in refused and "WAL does not match database file" in refused, refused
    assert "Traceback" not in refused
    assert "moves the damaged file and its write-ahead log catalog.duckdb.wal aside" in refused, refused
    advice = re.search(r"`actstore catalog rebuild --store STORE --catalog (\S+)`", refused)
    assert advice and advice.group(1) == str(catalog), refused
    catalog.rename(catalog.with_name("catalog.duckdb.damaged"))  # "move catalog.duckdb aside yourself"
    again = _rebuild(store, server_dir, "--catalog", advice.group(1))
    assert again.returncode == 0, again.stderr
    assert not wal.exists() and "moved aside: the write-ahead log" in again.stdout, again.stdout
    _check_serves(store, server_dir, runs)


def test_a_rebuild_without_a_leftover_log_says_nothing_of_one(tmp_path, ray_cluster):
    store = tmp_path / "store"
    port = _free_port()
    server = _serve(store, port, ray_cluster)
    _stop(server, signal.SIGTERM)  # a clean stop checkpoints: no log is left
    catalog = store / "catalog.duckdb"
    assert not catalog.with_name("catalog.duckdb.wal").exists()
    catalog.unlink()
    rebuilt = _rebuild(store, None)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "moved aside" not in rebuilt.stdout and not [p for p in store.iterdir() if "replaced" in p.name]
