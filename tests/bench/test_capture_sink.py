"""bench/capture_sink.py's `--check`: the capture's write path after its forward, timed stage by stage,
on a local store (a thread writer, MiniLM-shaped float16 and bfloat16 shards); the first shard reads
back equal and every shard has its catalog rows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_capture_sink_check_runs():
    proc = subprocess.run([sys.executable, "-W", "error::DeprecationWarning:actstore", "bench/capture_sink.py",
                           "--check"], cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "check passed" in proc.stdout, proc.stdout
    assert proc.stdout.count("reads back equal") == 2, proc.stdout
