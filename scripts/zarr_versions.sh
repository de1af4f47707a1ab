#!/usr/bin/env bash
# Run tests/store/test_codecs.py against other zarr-python (and numcodecs) releases, each in a
# throwaway virtual environment under ${ZARR_VENVS:-/tmp/actstore-zarr-versions}; the project's
# own environment is not touched. The store writes and reads zarr's objects itself
# (actstore/store/format/zarr_spec.py), so these are the releases whose objects it must match byte for
# byte, and which must read what it writes.
#
#   bash scripts/zarr_versions.sh                         the oldest supported release, with the
#                                                         oldest numcodecs, on this Python
#   bash scripts/zarr_versions.sh SPEC...                 SPEC: pip requirements joined by commas,
#                                                         e.g. 'zarr==3.4.2' or 'zarr==3.1.0,numcodecs==0.15.1'
#   PYTHON=/path/to/python3.13 bash scripts/zarr_versions.sh 'zarr==3.4.2' 'zarr==3.3.0'
#
# zarr 3.2 and newer need Python >= 3.12 (PYTHON names one). The module needs only zarr,
# numcodecs, crc32c and pytest, so it runs without the project's conftest (--noconftest: torch).
# Passed: zarr 3.1.0 + numcodecs 0.15.1 (Python 3.11), zarr 3.1.6 + numcodecs 0.16.6 (the
# project's environment), zarr 3.2.1, 3.3.0 and 3.4.2 + numcodecs 0.17.1 (Python 3.13).
# tests/store/data/make_zarr_fixtures.py records arrays a release writes, for the suite itself.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python}
VENVS=${ZARR_VENVS:-/tmp/actstore-zarr-versions}
[[ $# -gt 0 ]] || set -- "zarr==3.1.0,numcodecs==0.15.1"

failed=0
for spec in "$@"; do
    name=$("$PY" -c 'import sys; print("py%d%d" % sys.version_info[:2])')-$(echo "$spec" | tr -c 'A-Za-z0-9.\n' '-')
    venv="$VENVS/$name"
    if [[ ! -e $venv/.installed ]]; then
        rm -rf "$venv"
        "$PY" -m venv "$venv"
        IFS=, read -r -a requirements <<< "$spec"
        if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check "${requirements[@]}" crc32c pytest \
                pytest-timeout; then
            echo "FAILED: cannot install $spec on $("$PY" --version)" >&2
            failed=1
            continue
        fi
        touch "$venv/.installed"
    fi
    versions=$("$venv/bin/python" -c 'import sys, zarr, numcodecs, numpy
print(f"Python {sys.version.split()[0]}, zarr {zarr.__version__}, numcodecs {numcodecs.__version__}, numpy {numpy.__version__}")')
    echo "== $versions"
    if ! PYTHONPATH="$ROOT" "$venv/bin/python" -m pytest -q --noconftest -p no:cacheprovider tests/store/test_codecs.py; then
        echo "FAILED: $versions" >&2
        failed=1
    fi
done
exit $failed
