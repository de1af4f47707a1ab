"""The thin client stands alone: importing it loads no server, no torch/Ray/Zarr/DuckDB, and it
finds the embedded server only through the `actstore.servers` entry point."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

from actstore.errors import FailedPrecondition

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "ray", "zarr", "duckdb")
CHECK = ("import actstore.client, sys; "
         f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r} or m.startswith('actstore.server')); "
         "assert not bad, bad; "
         "print(sorted(m for m in sys.modules if m.startswith('actstore')))")
# what the client may import of actstore: the stubs, errors, options, wire, the shared records, the
# measure registry (not its numerics) and itself
ALLOWED = ("actstore._proto", "actstore.errors", "actstore.options", "actstore.wire", "actstore.records",
           "actstore.measures", "actstore.client")


def test_importing_the_client_loads_no_server_and_no_heavy_package():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    loaded = eval(proc.stdout)  # a printed list of module names
    assert all(m == "actstore" or m.startswith(ALLOWED) for m in loaded), loaded


def test_the_embedded_server_is_an_entry_point():
    (point,) = importlib.metadata.entry_points(group="actstore.servers", name="embedded")
    assert point.value == "actstore.server.app:start_embedded"
    from actstore.server.app import start_embedded

    assert point.load() is start_embedded


def test_embedded_without_a_server_says_how_to_install_one(monkeypatch):
    import actstore.client as client_module

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **_: [])
    with pytest.raises(FailedPrecondition, match=r"pip install 'actstore\[server\]'"):
        client_module.Client.embedded("/nonexistent")


def test_embedded_with_a_broken_server_install_says_how_to_fix_it(monkeypatch):
    import actstore.client as client_module

    class Missing:
        def load(self):
            raise ModuleNotFoundError("No module named 'ray'")

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **_: [Missing()])
    with pytest.raises(FailedPrecondition, match=r"No module named 'ray'.*pip install 'actstore\[server\]'"):
        client_module.Client.embedded("/nonexistent")
