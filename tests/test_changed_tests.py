"""scripts/changed_tests.py: the test files a change touches (`make test-changed`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "changed_tests.py"
spec = importlib.util.spec_from_file_location("changed_tests", SCRIPT)
changed_tests = importlib.util.module_from_spec(spec)
spec.loader.exec_module(changed_tests)


def test_a_module_selects_the_tests_that_mirror_or_import_it():
    chosen = changed_tests.tests_for(["actstore/metrics/probes/ridge.py"])
    assert {"tests/metrics/test_probes.py", "tests/server/test_probes.py"} <= set(chosen)
    assert "tests/test_options.py" in changed_tests.tests_for(["actstore/options.py"])  # imports it
    assert "tests/store/test_atomic.py" in changed_tests.tests_for(["actstore/store/atomic.py"])  # mirrors it


def test_a_changed_test_selects_itself_and_other_files_nothing():
    assert changed_tests.tests_for(["tests/metrics/test_lens.py", "README.md", "Makefile"]) == [
        "tests/metrics/test_lens.py"]
