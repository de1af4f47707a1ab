"""The test files a change touches, for `make test-changed` (the whole suite is what CI runs).

    python scripts/changed_tests.py [BASE]        # default BASE: HEAD (the working tree's changes)

A changed test file is selected itself. A changed module `actstore/<path>/<name>.py` selects the
test files that mirror it (`tests/**/test_<name>.py` or `test_<name>s.py`, the package's layout; a
module of a subpackage below the top rooms also its package's, `metrics/probes/ridge.py` ->
`test_probes.py`) and every test file that imports it by name (`actstore.<path>.<name>`, or
`from actstore.<path> import <name>`). Other changed
files (docs, the Makefile) select nothing. Prints one path a line, sorted.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def changed(base: str) -> list[str]:
    def git(*args: str) -> list[str]:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()

    return sorted(set(git("diff", "--name-only", base)) | set(git("ls-files", "--others", "--exclude-standard")))


def tests_for(paths: list[str]) -> list[str]:
    tests = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py"))
    texts = {test: (ROOT / test).read_text(encoding="utf-8") for test in tests}
    chosen: set[str] = set()
    for path in paths:
        if path in texts:
            chosen.add(path)
            continue
        if not (path.startswith("actstore/") and path.endswith(".py")):
            continue
        parts = Path(path).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        dotted, name = ".".join(parts), parts[-1]
        parent = ".".join(parts[:-1])
        mirrors = {name, *(parts[-2:-1] if len(parts) > 3 else ())}  # actstore/<room>/<package>/<module>
        names = {f"test_{m}{plural}.py" for m in mirrors for plural in ("", "s")}
        imports = re.compile(rf"\b{re.escape(dotted)}\b|from {re.escape(parent)} import [^\n]*\b{re.escape(name)}\b")
        chosen |= {test for test, text in texts.items() if Path(test).name in names or imports.search(text)}
    return sorted(chosen)


if __name__ == "__main__":
    print("\n".join(tests_for(changed(sys.argv[1] if len(sys.argv) > 1 else "HEAD"))))
