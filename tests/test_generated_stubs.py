"""The committed stubs are exactly what scripts/generate_protos.py makes from proto/, and the thin
client and the metrics stay free of the heavy parts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMITTED = REPO / "actstore" / "_proto"
FIX = "the committed stubs are stale: run `python scripts/generate_protos.py` and commit actstore/_proto"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def _python(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True,
                          env=_env(), cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts and p.suffix in {".py", ".pyi"}}


def test_committed_stubs_match_a_fresh_generation(tmp_path):
    out = tmp_path / "proto-out"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "generate_protos.py"), "--out", str(out)],
                          check=False, capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, f"generate_protos.py failed:\n{proc.stdout}\n{proc.stderr}"
    fresh, committed = _files(out), _files(COMMITTED)
    assert "actstore/v1/actstore_pb2.py" in fresh and "actstore/v1/actstore_pb2_grpc.py" in fresh
    assert "actstore/v1/actstore_pb2.pyi" in fresh
    assert sorted(fresh) == sorted(committed), (
        f"{FIX}\nonly generated: {sorted(set(fresh) - set(committed))}\n"
        f"only committed: {sorted(set(committed) - set(fresh))}")
    differing = [name for name in fresh if fresh[name] != committed[name]]
    assert not differing, f"{FIX}\ndiffering files: {differing}"
    # the rewrite to actstore._proto left no import of a top-level `actstore.v1`
    grpc_module = fresh["actstore/v1/actstore_pb2_grpc.py"].decode()
    assert "from actstore._proto.actstore.v1 import actstore_pb2" in grpc_module
    assert "from actstore.v1 import" not in grpc_module


def test_thin_client_imports_no_heavy_packages():
    loaded = _python("import actstore.client, sys; "
                     "print(sorted(m for m in ('ray','torch','duckdb','zarr','transformers') if m in sys.modules))")
    assert loaded == "[]", f"importing actstore.client pulled in {loaded}"


def test_metrics_import_nothing_else_of_actstore():
    loaded = _python(
        "import sys, actstore.metrics.similarity, actstore.metrics.entropy, actstore.metrics.lens; "
        "print(sorted(m for m in sys.modules if m.startswith('actstore.') and not m.startswith('actstore.metrics')))")
    assert loaded == "[]", f"actstore.metrics imports {loaded}"
