"""Catalog backups and restore on real DuckDB files: consistent copies while writing, the last K
kept, restore that moves the current file aside, refusal while another process holds the catalog."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import duckdb
import pytest

from actstore.errors import DataLoss, NotFound, Unavailable
from actstore.store.catalog import Catalog, ModelRecord, backups


def _model(i: int) -> ModelRecord:
    return ModelRecord(digest=f"{i:064d}", kind="encoder", arch="x", num_layers=1, hidden_size=2,
                       max_positions=None, path="/m", has_head=False, lineage={"i": i})


def _count_models(path) -> int:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute("SELECT count(*) FROM models").fetchone()[0]
    finally:
        con.close()


@pytest.fixture
def catalog_path(tmp_path):
    return tmp_path / "server" / "catalog.duckdb"


def test_backups_are_whole_catalogs_and_only_the_last_k_are_kept(catalog_path):
    catalog = Catalog(catalog_path)
    made = []
    for i in range(5):
        catalog.models.add(_model(i))
        made.append(catalog.backup(keep=3))
    catalog.close()
    kept = backups.list_backups(catalog_path)
    assert kept == made[-3:] and all(p.parent == catalog_path.parent / "backups" for p in kept)
    assert [_count_models(p) for p in kept] == [3, 4, 5]  # each is the catalog at its moment
    assert backups.latest_backup(catalog_path) == made[-1]
    assert not [p for p in kept[0].parent.iterdir() if p.name.startswith(".")], "a staging file is left"


def test_a_backup_taken_while_another_thread_writes_is_consistent(catalog_path):
    catalog = Catalog(catalog_path)
    stop = threading.Event()

    def write() -> None:
        i = 0
        while not stop.is_set():
            catalog.models.add(_model(i))
            i += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        time.sleep(0.2)
        taken = [catalog.backup(keep=10) for _ in range(5)]
    finally:
        stop.set()
        writer.join()
    catalog.close()
    counts = [_count_models(p) for p in taken]
    assert counts == sorted(counts) and counts[0] > 0, counts


def test_restore_puts_the_latest_backup_back_and_keeps_the_damaged_file(catalog_path):
    catalog = Catalog(catalog_path)
    catalog.models.add(_model(1))
    backup = catalog.backup(keep=2)
    catalog.models.add(_model(2))
    catalog.close()
    catalog_path.write_bytes(b"\x00damaged" * 4096)
    with pytest.raises(DataLoss) as info:
        Catalog(catalog_path)
    message = str(info.value)
    assert f"actstore catalog restore {backup} --catalog {catalog_path}" in message, message
    assert "actstore catalog rebuild" in message

    restored, aside = backups.restore(catalog_path)
    assert restored == backup and aside.read_bytes() == b"\x00damaged" * 4096
    assert backup.exists(), "the backup itself stays"
    catalog = Catalog(catalog_path)
    assert [m.digest for m in catalog.models.all()] == [_model(1).digest]
    catalog.close()


def test_the_data_loss_message_says_when_there_is_no_backup(catalog_path):
    catalog_path.parent.mkdir(parents=True)
    catalog_path.write_bytes(b"not a database" * 500)
    with pytest.raises(DataLoss, match="none is in .*backups.*actstore catalog rebuild"):
        Catalog(catalog_path)
    with pytest.raises(NotFound, match="no backups"):
        backups.restore(catalog_path)


def test_restore_moves_a_write_ahead_log_aside(catalog_path):
    catalog = Catalog(catalog_path)
    catalog.models.add(_model(1))
    catalog.backup(keep=2)
    catalog.close()
    wal = catalog_path.with_name(catalog_path.name + ".wal")
    wal.write_bytes(b"a stale log")
    _, aside = backups.restore(catalog_path)
    assert not wal.exists() and aside.with_name(aside.name + ".wal").read_bytes() == b"a stale log"
    assert _count_models(catalog_path) == 1


def test_a_damaged_backup_is_refused_and_the_catalog_is_untouched(catalog_path, tmp_path):
    catalog = Catalog(catalog_path)
    catalog.models.add(_model(1))
    catalog.close()
    bad = tmp_path / "bad.duckdb"
    bad.write_bytes(b"nope" * 1000)
    before = catalog_path.read_bytes()
    with pytest.raises(DataLoss, match="not a usable catalog"):
        backups.restore(catalog_path, bad)
    assert catalog_path.read_bytes() == before
    assert sorted(p.name for p in catalog_path.parent.iterdir()) == ["catalog.duckdb"]


def test_restore_is_refused_while_another_process_holds_the_catalog(catalog_path):
    catalog = Catalog(catalog_path)
    catalog.backup(keep=2)
    catalog.close()
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import duckdb, sys; c = duckdb.connect({str(catalog_path)!r}); "
                               "print('open', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"open"
        with pytest.raises(Unavailable, match="in use by a running actstore server.*stop the server"):
            backups.restore(catalog_path)
        assert sorted(p.name for p in catalog_path.parent.iterdir()) == ["backups", "catalog.duckdb"]
    finally:
        holder.stdin.close()
        holder.wait(10)
        holder.stdout.close()


def test_the_catalog_stays_locked_after_a_backup(catalog_path):
    """A byte copy would open the file and so drop DuckDB's POSIX lock: a second server could open it."""
    catalog = Catalog(catalog_path)
    try:
        catalog.models.add(_model(1))
        catalog.backup(keep=2)
        probe = subprocess.run([sys.executable, "-c", f"import duckdb; duckdb.connect({str(catalog_path)!r})"],
                               capture_output=True, text=True, timeout=60)
        assert probe.returncode != 0 and "lock" in probe.stderr, probe.stderr
    finally:
        catalog.close()
