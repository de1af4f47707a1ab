"""Regenerate actstore/_proto from proto/ (the one way the committed stubs are made).

    python scripts/generate_protos.py [--out DIR]

Imports in the generated files are rewritten to live under `actstore._proto`, because a
top-level `actstore.v1` package would not exist at import time.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = ROOT / "proto"


def generate(out: Path) -> list[Path]:
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
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path.relative_to(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
