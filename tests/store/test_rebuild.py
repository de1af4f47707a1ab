"""`actstore catalog rebuild` on a real local store: the catalog appears whole or not at all."""

from __future__ import annotations

from actstore.cli import main
from actstore.errors import Unavailable
from actstore.store.arrays import ZarrArrayStore


def test_a_rebuild_that_fails_leaves_no_catalog_behind(tmp_path, monkeypatch, capsys):
    store = tmp_path / "store"
    store.mkdir()

    def unreachable(self):
        raise Unavailable("the store stopped answering")

    monkeypatch.setattr(ZarrArrayStore, "run_keys", unreachable)  # after the models and datasets were read
    assert main(["catalog", "rebuild", "--store", str(store)]) == 2
    assert "stopped answering" in capsys.readouterr().err
    assert sorted(p.name for p in store.iterdir()) == [], "a half-built catalog was left"

    monkeypatch.undo()
    assert main(["catalog", "rebuild", "--store", str(store)]) == 0  # nothing in the way of the next one
    assert (store / "catalog.duckdb").is_file()
