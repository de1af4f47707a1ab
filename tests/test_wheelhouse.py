"""The offline install (issue 26 item 4): scripts/wheelhouse.py builds a wheelhouse for this
Python (as a cluster's target: --python-version and a manylinux --platform, and --have with the
target's `pip freeze`), and a fresh virtual environment installs actstore[server] from it with pip's
network off: --no-index, no pip configuration (this machine's names extra indexes and find-links
folders), and a proxy that refuses every connection.

The fresh venv first gets torch the way scripts/setup.sh installs it (torch==2.13.0 with
constraints.txt: here a local CPU wheel), standing for the cluster's own CUDA build: the server
imports torch, and the wheelhouse must not carry it. Only then is pip cut off.

Marked slow: the wheelhouse is ~300 MB of wheels downloaded from the index (pip's HTTP cache does
not keep them on this machine), ~3 minutes in all. .ci/run runs it as its own step."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.test_floors import INSTALL_CHECK_TIMEOUT_S

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
SERVER_MODULES = ("actstore.server.app", "actstore.store.format.arrays", "actstore.store.catalog", "ray", "zarr",
                  "duckdb", "transformers", "torch")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(INSTALL_CHECK_TIMEOUT_S)]


def _env(offline: bool = False) -> dict[str, str]:
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("ACTSTORE_")}
    if offline:
        env = {k: v for k, v in env.items() if not k.startswith("PIP_") and k.lower() not in ("no_proxy",)}
        # no config file (this machine's adds extra indexes and a find-links folder), and any
        # connection pip tries goes to a closed port
        env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
                   http_proxy="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9",
                   HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9")
    return env


def _run(cmd: list, cwd: Path, timeout: int = 600, offline: bool = False) -> str:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=_env(offline), capture_output=True, text=True,
                          check=False, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}: exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _names(folder: Path) -> dict[str, str]:
    """name -> version of each wheel in a folder."""
    found = {}
    for wheel in folder.glob("*.whl"):
        name, version = wheel.name.split("-")[:2]
        found[_normalize(name)] = version
    return found


def test_offline_install_from_a_wheelhouse(tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", python]

    # the target's own torch, as scripts/setup.sh installs it; first checked to be a CPU build
    torch = ["torch==2.13.0", "-c", REPO / "constraints.txt"]
    if os.environ.get("TORCH_INDEX_URL"):
        torch += ["--index-url", os.environ["TORCH_INDEX_URL"]]
    plan = json.loads(_run([*pip, "install", "-q", "--dry-run", "--report", "-", *torch], cwd=tmp_path))
    planned = {item["metadata"]["name"].lower() for item in plan["install"]}
    assert not [n for n in planned if n.startswith(("nvidia", "triton"))], \
        f"torch==2.13.0 resolves to a CUDA build here ({sorted(planned)}): set TORCH_INDEX_URL to a CPU index"
    _run([*pip, "install", "-q", *torch], cwd=tmp_path)
    have = tmp_path / "have.txt"
    have.write_text(_run([*pip, "freeze", "--all"], cwd=tmp_path))
    had = {_normalize(line.split("==")[0]) for line in have.read_text().splitlines() if "==" in line}
    assert "torch" in had

    wheelhouse = tmp_path / "wheelhouse"
    major, minor = sys.version_info[:2]
    _run([sys.executable, REPO / "scripts" / "wheelhouse.py", "--out", wheelhouse, "--python-version",
          f"{major}.{minor}", "--platform", "manylinux_2_28_x86_64", "--have", have], cwd=tmp_path)
    wheels = _names(wheelhouse)
    assert wheels.get("actstore") == PROJECT["version"]
    assert not {"torch", "triton"} & set(wheels) and not [n for n in wheels if n.startswith("nvidia")], wheels
    assert not had & set(wheels), f"the wheelhouse carries what the target has: {sorted(had & set(wheels))}"
    assert {"ray", "zarr", "duckdb", "transformers", "grpcio", "numpy"} <= set(wheels), wheels

    # offline: the index, the config's find-links and the network are all out of reach
    _run([*pip, "install", "-q", "--no-index", "--find-links", wheelhouse, "actstore[server]"], cwd=tmp_path,
         offline=True)
    _run([*pip, "check"], cwd=tmp_path, offline=True)

    script = ("import importlib, json, sys\n"
              f"mods = {SERVER_MODULES!r}\n"
              "print(json.dumps({m: importlib.import_module(m).__file__ for m in mods}))\n")
    files = json.loads(_run([python, "-c", script], cwd=tmp_path))
    for module, file in files.items():
        assert Path(file).is_relative_to(venv), f"{module} from {file}, not the venv"
    actstore = venv / "bin" / "actstore"
    assert _run([actstore, "--version"], cwd=tmp_path) == f"actstore {PROJECT['version']}\n"
    assert "serve" in _run([actstore, "--help"], cwd=tmp_path)
