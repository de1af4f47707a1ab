"""Regenerate actstore/_proto from proto/ (the one way the committed stubs are made).

    python scripts/generate_protos.py [--out DIR]
    python scripts/generate_protos.py --tools-only     # only make sure the generator is installed

The generator is pinned (scripts/protoc-tools.txt) and runs in a virtual environment of its own,
made on first use under ~/.cache/actstore (or $ACTSTORE_PROTOC_VENV): the grpcio-tools that writes
the stubs decides the oldest grpcio and protobuf they run under, which is what pyproject.toml
declares, so it must not float with whatever grpcio-tools the development environment has.

Imports in the generated files are rewritten to live under `actstore._proto`, because a
top-level `actstore.v1` package would not exist at import time.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = ROOT / "proto"
TOOLS = ROOT / "scripts" / "protoc-tools.txt"
INSIDE = "ACTSTORE_PROTOC_INSIDE"  # set when this script re-runs itself in the generator's venv


def pinned() -> dict[str, str]:
    """name -> version of every line in protoc-tools.txt."""
    pins = {}
    for line in TOOLS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    return pins


def tools_venv() -> Path:
    """The generator's virtual environment, made (once) with exactly protoc-tools.txt in it."""
    key = hashlib.sha256(TOOLS.read_bytes() + sys.version.encode()).hexdigest()[:12]
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "actstore" / f"protoc-{key}"
    env_dir = Path(os.environ.get("ACTSTORE_PROTOC_VENV", default))
    python = env_dir / "bin" / "python"
    done = env_dir / ".installed"
    if done.exists() and done.read_bytes() == TOOLS.read_bytes():
        return env_dir
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "--no-deps", "-r", str(TOOLS)], check=True)
    done.write_bytes(TOOLS.read_bytes())
    return env_dir


def generate(out: Path) -> list[Path]:
    from grpc_tools import protoc  # only inside the generator's venv

    out.mkdir(parents=True, exist_ok=True)
    protos = sorted(PROTO_ROOT.rglob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_out={out}",
        *(str(p.relative_to(PROTO_ROOT)) for p in protos),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    written = sorted(p for p in out.rglob("*") if p.suffix in {".py", ".pyi"})
    for path in written:
        text = re.sub(r"^from actstore\.v1 import", "from actstore._proto.actstore.v1 import",
                      path.read_text(), flags=re.M)
        path.write_text(text)
    for package in {p.parent for p in written} | {out}:
        init = package / "__init__.py"
        if not init.exists():
            init.write_text("")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "actstore" / "_proto")
    parser.add_argument("--tools-only", action="store_true", help="install the pinned generator and stop")
    args = parser.parse_args(argv)
    if not os.environ.get(INSIDE):
        env_dir = tools_venv()
        if args.tools_only:
            print(env_dir)
            return 0
        env = dict(os.environ, **{INSIDE: "1"})
        env["PATH"] = os.pathsep.join([str(env_dir / "bin"), env.get("PATH", "")])  # protoc-gen-mypy
        env.pop("PYTHONPATH", None)
        cmd = [str(env_dir / "bin" / "python"), str(Path(__file__).resolve()), "--out", str(args.out.resolve())]
        return subprocess.run(cmd, env=env, check=False).returncode
    from importlib.metadata import version

    wrong = {name: version(name) for name, want in pinned().items() if version(name) != want}
    if wrong:
        raise SystemExit(f"the generator's venv is not scripts/protoc-tools.txt: {wrong}")
    for path in generate(args.out):
        print(path.relative_to(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
