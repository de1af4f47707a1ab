"""The allowed dependency directions between actstore's packages, checked on every import
statement (module level and inside functions), so the layering cannot rot.

Lowest first; a package may import only the packages listed for it (and itself):
    errors, _proto, event_loop         nothing of ours
    records                            nothing of ours (the records server and client both describe)
    wire, options                      _proto; errors
    measures                           errors, options; metrics (the registry, and its measures'
                                       numerics loaded where they run)
    config                             errors, options (option defaults live in one table)
    metrics                            nothing of ours
    store                              errors, config, metrics, event_loop, records
    modeling                           + store
    training                           + modeling
    workers                            + training
    server                             + workers
    client                             _proto, errors, options, wire, event_loop, records, measures (importable without
                                       torch/Ray)
    report                             client (its answers' own plots, written to files for the CLI and demo)
    cli, demo, experiment              anything
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "actstore"

BASE = {"errors", "config", "event_loop", "records"}
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "event_loop": set(),
    "wire": {"_proto"},
    "options": {"errors"},
    "measures": {"errors", "options", "metrics"},
    "records": set(),
    "_proto": set(),
    "config": {"errors", "options"},
    "metrics": set(),
    "report": {"client"},
    "store": BASE | {"metrics"},
    "modeling": BASE | {"metrics", "store"},
    "training": BASE | {"metrics", "store", "modeling"},
    "workers": BASE | {"metrics", "store", "modeling", "training"},
    "server": BASE | {"metrics", "store", "modeling", "training", "workers", "wire", "options", "_proto",
                      "measures"},
    "client": {"_proto", "errors", "options", "wire", "event_loop", "records", "measures"},
}
TOP = {"cli", "demo", "experiment", "__init__"}


def _package(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return parts[0]


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, first component below `actstore`) of every import of ours in the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module + "." + alias.name for alias in node.names] if node.module == "actstore" \
                else [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "actstore" and len(parts) > 1:
                found.append((node.lineno, parts[1]))
    return found


def _files() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if "_proto" not in p.parts)


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down(path):
    package = _package(path)
    if package in TOP:
        return
    assert package in ALLOWED, f"{package} is a new package: give it a place in tests/test_layers.py"
    wrong = [(line, target) for line, target in _imports(path)
             if target != package and target not in ALLOWED[package]]
    assert not wrong, f"{path.relative_to(ROOT)} imports upward or sideways: {wrong}"


def test_the_checker_sees_function_level_imports(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from actstore.server import app\n    import actstore.workers.capture\n")
    assert _imports(sample) == [(2, "server"), (3, "workers")]
