"""Installing actstore as a user does (issue 26): `python -m build` of the checkout's files, and
`pip install actstore` with no extras into a fresh virtual environment, whose client and CLI then
talk to a real server started here. Twice: with the newest versions the base requirements allow,
and with each pinned to its declared floor (so the floors are tested, not just written down).

`pip install 'actstore[readers]'` is installed fresh too: a run as a lazy xarray read straight from
the store's Zarr arrays, SQL as a pandas DataFrame, without torch, Ray or DuckDB.

The newest versions are also installed on Python 3.12 and 3.13 (issue 26 item 2), with the same
client smoke against this Python's server. Those interpreters are found as ACTSTORE_TEST_PYTHONS
lists them (paths, space-separated: .ci/run sets it, and a missing one then fails), otherwise on
PATH or under pyenv (a missing one is then skipped). The server side on 3.12/3.13 is
tests/test_floors.py's (slow: torch==2.13.0 for those Pythons is PyPI's CUDA build, ~3.5 GB).

Needs the package index (pip installs grpcio, protobuf, numpy, tqdm into each venv, ~20 s each)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import numpy as np
import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests.factories import copy_checkout, sentences

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
STUBS = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "actstore" / "_proto").rglob("*")
               if p.suffix in {".py", ".pyi"} and "__pycache__" not in p.parts)
# what a client-only install must not bring: the server's and the readers' packages
HEAVY = ("torch", "ray", "zarr", "duckdb", "transformers", "pandas", "pyarrow", "xarray", "scipy")


def _clean_env() -> dict[str, str]:
    """The environment of a user's shell: nothing pointing into this checkout or this venv."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("ACTSTORE_")}


def _run(cmd: list[str], cwd: Path, timeout: int = 300) -> str:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=_clean_env(), capture_output=True, text=True,
                          check=False, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}: exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    """`python -m build` (sdist, then the wheel from the unpacked sdist) of the files a fresh clone
    has: git's tracked files plus those it would track, copied out so nothing is built in the tree."""
    root = tmp_path_factory.mktemp("build")
    src = root / "src"
    copy_checkout(src)
    # --no-isolation: the build backend is this environment's setuptools (build checks that it
    # satisfies [build-system] requires), so no index is needed for the build itself
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", root / "dist", src], cwd=root)
    [wheel] = (root / "dist").glob("*.whl")
    [sdist] = (root / "dist").glob("*.tar.gz")
    return {"wheel": wheel, "sdist": sdist, "root": root}


def test_build_makes_a_wheel_and_sdist_with_the_stubs_that_pass_twine_check(dists):
    version = PROJECT["version"]
    assert dists["wheel"].name == f"actstore-{version}-py3-none-any.whl"
    assert dists["sdist"].name == f"actstore-{version}.tar.gz"
    with zipfile.ZipFile(dists["wheel"]) as wheel:
        in_wheel = {name: wheel.read(name) for name in wheel.namelist()}
    with tarfile.open(dists["sdist"]) as sdist:
        prefix = f"actstore-{version}/"
        in_sdist = {m.name.removeprefix(prefix): sdist.extractfile(m).read() for m in sdist.getmembers() if m.isfile()}
    for stub in STUBS:  # every generated stub, byte for byte the committed one
        committed = (REPO / stub).read_bytes()
        assert in_wheel.get(stub) == committed, f"the wheel lacks or changes {stub}"
        assert in_sdist.get(stub) == committed, f"the sdist lacks or changes {stub}"
    # the sdist can regenerate them: the .proto sources and the pinned generator
    for name in ("proto/actstore/v1/actstore.proto", "scripts/generate_protos.py", "scripts/protoc-tools.txt"):
        assert name in in_sdist, f"the sdist lacks {name}"
    metadata = in_wheel[f"actstore-{version}.dist-info/METADATA"].decode()
    assert f"\nVersion: {version}\n" in metadata
    # no heavy requirement outside an extra
    base = [line.removeprefix("Requires-Dist: ") for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    unconditional = {Requirement(r).name for r in base if "extra ==" not in r}
    assert unconditional == {Requirement(r).name for r in PROJECT["dependencies"]}, unconditional
    out = _run([sys.executable, "-m", "twine", "check", "--strict", dists["wheel"], dists["sdist"]], cwd=dists["root"])
    assert out.count("PASSED") == 2, out


def _floors() -> list[str]:
    """name==floor for each base requirement that applies to this Python."""
    pins = []
    for line in PROJECT["dependencies"]:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate():
            [floor] = [spec.version for spec in req.specifier if spec.operator == ">="]
            pins.append(f"{req.name}=={floor}")
    return pins


# Run in the fresh venv, from a folder outside the checkout: the installed client, on its own.
CLIENT_SCRIPT = r"""
import importlib.metadata as md, importlib.util, json, sys
import actstore, actstore.client
from actstore.client import Client

address, model_path, texts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
report = {"file": actstore.__file__, "version": actstore.__version__, "python": "%d.%d" % sys.version_info[:2],
          "installed": {d.metadata["Name"].lower(): d.version for d in md.distributions()},
          "findable": [m for m in HEAVY if importlib.util.find_spec(m) is not None]}
with Client(address) as client:
    client.register_model(model_path, name="tiny-bert-venv")
    client.register_dataset(texts=texts, name="venv-texts")
    run = client.capture("tiny-bert-venv", "venv-texts", pooling="mean").run_key
    cka = client.cka(run)
    report.update(run=run, biased=cka.biased.tolist(), runs=[r.run_key for r in client.runs()])
report["loaded"] = sorted(m for m in HEAVY if m in sys.modules)
print(json.dumps(report))
"""


TEXTS = sentences(10, seed=11)


@pytest.fixture(scope="module")
def stored_run(module_client, tiny_models) -> str:
    """The run the venv clients ask for, captured here first: their own capture of the same model
    and texts is then answered from the store (the same run key), which keeps each venv test short."""
    module_client.register_model(tiny_models["bert"], name="tiny-bert")
    module_client.register_dataset(texts=TEXTS, name="texts")
    return module_client.capture("tiny-bert", "texts", pooling="mean").run_key


OTHER_PYTHONS = ("3.12", "3.13")


def _interpreter(version: str) -> str:
    """The python<version> to make a venv with: from ACTSTORE_TEST_PYTHONS (required there), else
    found on PATH or under pyenv, else the test is skipped."""
    listed = os.environ.get("ACTSTORE_TEST_PYTHONS")
    if listed:
        ask = "import sys; print(*sys.version_info[:2], sep='.')"
        found = [p for p in listed.split()
                 if subprocess.run([p, "-c", ask], capture_output=True, text=True).stdout.strip() == version]
        assert found, f"ACTSTORE_TEST_PYTHONS ({listed}) has no Python {version}"
        return found[0]
    candidates = [shutil.which(f"python{version}")]
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates += sorted(pyenv_root.glob(f"versions/{version}.*/bin/python{version}"), reverse=True)
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, "-c", "import venv"], capture_output=True, check=False).returncode == 0:
            return str(candidate)
    pytest.skip(f"no Python {version} here (set ACTSTORE_TEST_PYTHONS, as .ci/run does)")


@pytest.mark.parametrize("versions,python_version", [("newest", None), ("floors", None)]
                         + [("newest", v) for v in OTHER_PYTHONS])
def test_client_only_install_talks_to_a_running_server(versions, python_version, dists, tmp_path, module_server,
                                                       module_client, tiny_models, stored_run):
    venv = tmp_path / "venv"
    interpreter = _interpreter(python_version) if python_version else sys.executable
    # a bare venv, filled by this environment's pip (`pip --python`): no system site-packages
    _run([interpreter, "-m", "venv", "--without-pip", venv], cwd=tmp_path)
    python = venv / "bin" / "python"
    constraints = []
    if versions == "floors":
        (tmp_path / "floors.txt").write_text("\n".join(_floors()) + "\n")
        constraints = ["-c", tmp_path / "floors.txt"]
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--disable-pip-version-check",
          *constraints, dists["wheel"]], cwd=tmp_path, timeout=600)

    address = f"127.0.0.1:{module_server.port}"
    script = f"HEAVY = {HEAVY!r}\n" + CLIENT_SCRIPT
    report = json.loads(_run([python, "-c", script, address, tiny_models["bert"], json.dumps(TEXTS)], cwd=tmp_path))
    assert report["run"] == stored_run  # the same model and texts, registered over the wire: the same run

    assert Path(report["file"]).is_relative_to(venv), report["file"]  # the installed package, not the checkout
    assert report["python"] == (python_version or f"{sys.version_info[0]}.{sys.version_info[1]}")
    assert report["version"] == PROJECT["version"]
    installed = report["installed"]
    assert not [name for name in HEAVY if name in installed], f"a client-only install brought {installed}"
    assert report["findable"] == [] and report["loaded"] == []
    if versions == "floors":
        for pin in _floors():
            name, floor = pin.split("==")
            assert Version(installed[name]) == Version(floor), f"{name} {installed[name]}, not the floor {floor}"
    # the venv client's answer is the server's: the same CKA as this environment's client gets
    matrix = np.array(report["biased"])
    np.testing.assert_allclose(matrix, module_client.cka(report["run"]).biased, rtol=1e-12)
    np.testing.assert_allclose(np.diag(matrix), 1.0, atol=1e-6)
    assert report["run"] in report["runs"]

    # the console script: its version, and a command against the server
    actstore = venv / "bin" / "actstore"
    assert _run([actstore, "--version"], cwd=tmp_path) == f"actstore {PROJECT['version']}\n"
    assert report["run"][:8] in _run([actstore, "--address", address, "runs"], cwd=tmp_path)


# Run in the fresh [readers] venv: a run as a lazy xarray straight from the store's Zarr arrays, and
# SQL as a DataFrame, with the readers' packages and without the server's.
READERS_SCRIPT = r"""
import importlib.metadata as md, json, sys
from actstore.client import Client

address, run = sys.argv[1], sys.argv[2]
with Client(address) as client:
    view = client.to_xarray(run)
    frame = client.sql("SELECT run_key, n FROM runs").to_pandas()
print(json.dumps({"dims": list(view.dims), "shape": list(view.shape), "layer2": view.sel(layer=2).values.tolist(),
                  "frame": frame.to_dict("list"), "type": type(view).__module__ + "." + type(view).__name__,
                  "installed": sorted(d.metadata["Name"].lower() for d in md.distributions())}))
"""


def test_readers_install_reads_a_run_as_xarray_and_sql_as_pandas(dists, tmp_path, module_server, module_client,
                                                                   stored_run):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path)
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--disable-pip-version-check",
          f"{dists['wheel']}[readers]"], cwd=tmp_path, timeout=600)
    report = json.loads(_run([python, "-c", READERS_SCRIPT, f"127.0.0.1:{module_server.port}", stored_run],
                             cwd=tmp_path))
    assert report["type"] == "xarray.core.dataarray.DataArray" and report["dims"] == ["sample", "layer", "feature"]
    expected = module_client.read_activations(stored_run, 2)[0]
    assert report["shape"][0] == expected.shape[0] and report["shape"][2] == expected.shape[1]
    np.testing.assert_array_equal(np.array(report["layer2"], dtype=expected.dtype), expected)
    assert stored_run in report["frame"]["run_key"]
    installed = set(report["installed"])
    assert {"xarray", "zarr", "pandas"} <= installed
    assert not installed & {"torch", "ray", "duckdb", "transformers"}, installed
