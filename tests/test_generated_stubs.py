"""The committed stubs are exactly what scripts/generate_protos.py makes from proto/, pyproject.toml's
grpcio and protobuf floors are the versions those stubs check for at import, and the thin client and
the metrics stay free of the heavy parts."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

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


def _stub_needs() -> tuple[set[Version], set[Version]]:
    """The grpcio versions the *_pb2_grpc.py stubs raise below (GRPC_GENERATED_VERSION) and the
    protobuf runtimes the *_pb2.py modules refuse below (ValidateProtobufRuntimeVersion's gencode)."""
    grpc_needs, protobuf_needs = set(), set()
    for path in sorted(COMMITTED.rglob("*_pb2_grpc.py")):
        found = re.findall(r"^GRPC_GENERATED_VERSION = '([^']+)'$", path.read_text(), flags=re.M)
        assert len(found) == 1, f"{path.name}: no GRPC_GENERATED_VERSION (the grpcio-tools changed the format?)"
        grpc_needs.add(Version(found[0]))
    for path in sorted(COMMITTED.rglob("*_pb2.py")):
        calls = [node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call)
                 and getattr(node.func, "attr", "") == "ValidateProtobufRuntimeVersion"]
        assert len(calls) == 1, f"{path.name}: no ValidateProtobufRuntimeVersion call"
        major, minor, patch, suffix = (ast.literal_eval(arg) for arg in calls[0].args[1:5])
        protobuf_needs.add(Version(f"{major}.{minor}.{patch}{suffix}"))
    return grpc_needs, protobuf_needs


def _floor(requirements: list[str], name: str) -> Version:
    """The lowest version `name`'s requirement admits, from its >= (or ==) clause."""
    [req] = [Requirement(line) for line in requirements if Requirement(line).name == name]
    floors = [Version(spec.version) for spec in req.specifier if spec.operator in (">=", "==", "~=")]
    assert floors, f"pyproject.toml declares no floor for {name}: {req}"
    return max(floors)


def test_declared_grpcio_and_protobuf_floors_are_what_the_stubs_check_for():
    grpc_needs, protobuf_needs = _stub_needs()
    assert len(grpc_needs) == 1 and len(protobuf_needs) == 1, (
        f"the stubs were made by different generators: {grpc_needs} {protobuf_needs}")
    [grpc_need], [protobuf_need] = grpc_needs, protobuf_needs
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    base = project["dependencies"]
    # The client's own requirements carry the floors: `pip install actstore` must give a grpcio and
    # a protobuf the stubs import under. A floor below the stubs' need is the bug of issue 26 (a
    # user's grpcio 1.84 satisfied grpcio>=1.70 and the stubs raised RuntimeError at import).
    assert _floor(base, "grpcio") >= grpc_need, (
        f"pyproject.toml declares grpcio>={_floor(base, 'grpcio')}, the stubs raise below {grpc_need}")
    assert _floor(base, "protobuf") >= protobuf_need, (
        f"pyproject.toml declares protobuf>={_floor(base, 'protobuf')}, the stubs refuse runtimes below "
        f"{protobuf_need}")
    # and no higher than their release line: a floor above the stubs' needs would shut out users for
    # nothing (protobuf's floor is 5.29.1 for gencode 5.29.0, which PyPI yanked; raise these here,
    # with a reason, if other code comes to need more)
    for name, need in (("grpcio", grpc_need), ("protobuf", protobuf_need)):
        assert _floor(base, name).release[:2] == need.release[:2], (
            f"pyproject.toml declares {name}>={_floor(base, name)}, the stubs need only {need}")
    # the generator's pin is what wrote them: regenerating with it keeps these floors
    tools = dict(line.split("==") for line in (REPO / "scripts" / "protoc-tools.txt").read_text().splitlines()
                 if line.strip() and not line.startswith("#"))
    assert Version(tools["grpcio-tools"]) == grpc_need, (
        f"scripts/protoc-tools.txt pins grpcio-tools=={tools['grpcio-tools']}, the stubs say {grpc_need}: {FIX}")
    # the server's grpc packages do not go below the client's grpcio
    for extra in ("server",):
        for line in project["optional-dependencies"][extra]:
            req = Requirement(line)
            if req.name.startswith("grpcio"):
                assert _floor([line], req.name) >= grpc_need, f"{extra}: {line} is below the stubs' grpcio {grpc_need}"


def test_thin_client_imports_no_heavy_packages():
    loaded = _python("import actstore.client, sys; "
                     "print(sorted(m for m in ('ray','torch','duckdb','zarr','transformers') if m in sys.modules))")
    assert loaded == "[]", f"importing actstore.client pulled in {loaded}"


def test_metrics_import_nothing_else_of_actstore():
    loaded = _python(
        "import sys, actstore.metrics.similarity, actstore.metrics.entropy, actstore.metrics.lens; "
        "print(sorted(m for m in sys.modules if m.startswith('actstore.') and not m.startswith('actstore.metrics')))")
    assert loaded == "[]", f"actstore.metrics imports {loaded}"
