"""bench/cka_roofline.py end to end on a tiny synthetic run (512 rows, 3 states of width 16): it
writes its run, reads the run's shard files for the roofline and times the query. A refactor of the
store once broke its file listing (the array store's root became the backend's string) and only a
run of the bench showed it; its --int8 run (int8 beside float16) once broke on a coding change to
the int8 shards (their seeds) that no other test reached."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("dtypes", [[], ["--int8"]])
def test_cka_roofline_runs_on_a_tiny_run(tmp_path, dtypes):
    proc = subprocess.run([sys.executable, "-W", "error::DeprecationWarning:actstore", "bench/cka_roofline.py",
                           "--sizes", "512", "--states", "3", "--width", "16", "--shard-rows", "128", *dtypes],
                          cwd=REPO, env={**os.environ, "BENCH_OUT_DIR": str(tmp_path)}, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "n=512: cka wall" in proc.stdout and "wall / roofline" in proc.stdout, proc.stdout
    # its result where it was sent, not over bench/out's real one
    assert json.loads((tmp_path / "cka_roofline.json").read_text())["sizes"] == [512]
