# Every target that runs code first runs scripts/setup.sh, which is quick when all is installed.
SHELL := bash
PYTHON ?= python
export PYTHON

.PHONY: setup demo test test-quick test-changed test-all test-floors bench gpu-check protos wheelhouse

setup:
	bash scripts/setup.sh

demo: setup
	actstore demo

# The default pytest config deselects slow tests. A failing pytest fails the target (make itself
# then exits 2); pytest's exit code 5, no tests collected, is a failure too. The suite mostly waits
# (Ray, servers, subprocesses), so its files are spread over TEST_WORKERS processes (pytest-xdist;
# a file stays in one process, so its module fixtures are made once); TEST_WORKERS=0: one process.
# The files marked `long` go first (tests/conftest.py) and keep that order (--no-loadscope-reorder:
# xdist would start the files with the most tests first and the one-test scenarios of minutes last).
# -p no:benchmark: pytest-benchmark, where a machine has it, warns beside xdist (warnings are errors
# here); our benchmarks are the bench/ scripts.
# --max-worker-restart 0: a worker that dies (a crash of the process, not a failing test) ends the
# run with that test failed, where a replacement worker under --dist loadfile can wait forever
# (pytest-dev/pytest-xdist#784, #1313): a CI run that never ends says nothing of what broke.
TEST_WORKERS ?= 3
test: setup
	$(PYTHON) -m pytest -q -p no:benchmark -n $(TEST_WORKERS) --max-worker-restart 0 --dist loadfile --no-loadscope-reorder

# An author's quick loop (no Ray cluster, no server of minutes, under 3 minutes): every test that is
# not slow, not in a `long` file and uses no Ray cluster (`ray`: set from a test's fixtures by
# tests/conftest.py): the metrics, the store, options, measures, the CLI's parsing, the client's checks.
test-quick: setup
	$(PYTHON) -m pytest -q -p no:benchmark -n $(TEST_WORKERS) -m "not slow and not long and not ray"

# The test files a change touches (scripts/changed_tests.py: changed tests, the test files that
# mirror or import each changed module), against BASE (default HEAD: the working tree's changes).
BASE ?= HEAD
test-changed: setup
	@files=$$($(PYTHON) scripts/changed_tests.py $(BASE)); \
	if [ -z "$$files" ]; then echo "no test file mirrors or imports what changed since $(BASE)"; exit 0; fi; \
	echo "$$files"; $(PYTHON) -m pytest -q -p no:benchmark -n $(TEST_WORKERS) --max-worker-restart 0 --dist loadfile $$files

test-all: setup
	$(PYTHON) -m pytest -q -m ''

# actstore[server] installed in a fresh venv at every direct dependency's declared floor, then a
# server, a capture, a CKA and a verify from that venv; and at the newest allowed versions on
# Python 3.12 and 3.13 where those are found (tests/test_floors.py; slow, 3.5-5 min each)
test-floors: setup
	$(PYTHON) -m pytest -q -m slow tests/test_floors.py

bench: setup
	@set -e; found=0; \
	for f in bench/*.py; do \
		[ -e "$$f" ] || continue; found=1; \
		echo "== $$f"; $(PYTHON) "$$f"; \
	done; \
	[ $$found = 1 ] || echo "no benchmarks in bench/"

# the CUDA tests and GPU benchmarks (scripts/gpu_check.sh): on a machine with a GPU
gpu-check: setup
	bash scripts/gpu_check.sh

protos:
	$(PYTHON) scripts/generate_protos.py

# A folder of wheels for a cluster with no package index (scripts/wheelhouse.py; README,
# "Offline clusters"): actstore[server] and its dependencies for the target, torch excluded.
#   make wheelhouse TARGET_PYTHON=3.12 TARGET_PLATFORM=manylinux_2_28_x86_64 [HAVE=freeze.txt] [WHEELHOUSE=dir]
WHEELHOUSE ?= wheelhouse
wheelhouse:
	$(PYTHON) scripts/wheelhouse.py --out $(WHEELHOUSE) \
		$(if $(TARGET_PYTHON),--python-version $(TARGET_PYTHON)) \
		$(if $(TARGET_PLATFORM),--platform $(TARGET_PLATFORM)) \
		$(if $(HAVE),--have $(HAVE))
