"""House rules: the tree passes `ruff check` with pyproject's [tool.ruff] settings (ruff is in the
test extra). Run `ruff check --fix actstore tests bench` to fix what can be fixed automatically."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ruff_check_passes():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
                           "actstore", "tests", "bench"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          check=False)
    assert "No module named ruff" not in proc.stderr, "ruff is missing: pip install -e '.[test]'"
    assert proc.returncode == 0, f"ruff check found problems (ruff check --fix fixes the [*] ones):\n" \
                                 f"{proc.stdout}{proc.stderr}"
