"""`actstore --version` prints the one version the package declares: pyproject.toml's, as the
installed metadata carries it (tests/test_install.py checks the same from a fresh venv)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import actstore

REPO = Path(__file__).resolve().parents[1]


def test_version_flag_prints_pyprojects_version():
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    proc = subprocess.run([sys.executable, "-m", "actstore.cli", "--version"], check=False, capture_output=True,
                          text=True, cwd="/", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"actstore {declared}\n"
    assert actstore.__version__ == version("actstore") == declared
