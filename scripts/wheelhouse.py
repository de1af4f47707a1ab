"""Build a wheelhouse: a folder of wheels from which an offline machine (a GPU cluster that reaches
no package index) installs actstore's server with `pip install --no-index --find-links`.

    python scripts/wheelhouse.py --out wheelhouse --python-version 3.12 --platform manylinux_2_28_x86_64
    python scripts/wheelhouse.py --out wheelhouse --have target-freeze.txt ...   # skip what the target has

Run it on a machine that reaches the index (any OS: only wheels for the target are downloaded, never
built). The folder holds actstore's own wheel and every wheel `actstore[server]` needs for the
target Python and platform, except:

- torch (always): a cluster brings its own CUDA build. The target must already have the torch
  version actstore pins (its local build label, e.g. 2.13.0+cu128, is fine); torch's own
  dependencies come with it there and are not fetched unless another package needs them.
- everything listed in --have (the output of `pip freeze` or `pip list --format=freeze` on the
  target): those exact versions are resolved against, so the rest fits them, and not downloaded.

How: each package the target has stands in for the resolver as an empty placeholder wheel of the
target's version (with a local label of its own, so that only the placeholder matches the pin); pip resolves
and downloads the rest with --only-binary=:all: for the target's tags, and the placeholders are
removed from the folder afterwards. Then, on the target:

    pip install --no-index --find-links wheelhouse 'actstore[server]'
"""

from __future__ import annotations

import argparse
import base64
import email.parser
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the local version label a placeholder gets (2.13.0 -> 2.13.0+wheelhouse, 2.13.0+cu128 ->
# 2.13.0+cu128.wheelhouse): the pin `torch==2.13.0+wheelhouse` matches only the placeholder, and
# the project's `torch==2.13.0` accepts it
LABEL = "wheelhouse"


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _platforms(platform: str) -> list[str]:
    """A manylinux_2_X platform runs every older manylinux wheel too; pip only expands the legacy
    aliases (manylinux2014), so list them: manylinux_2_28_x86_64 -> 2_28, 2_27, ..., 2_5 and the
    manylinux1/2010/2014 aliases. Anything else is passed on as given."""
    match = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    if not match:
        return [platform]
    glibc, arch = int(match.group(1)), match.group(2)
    names = [f"manylinux_2_{minor}_{arch}" for minor in range(glibc, 4, -1)]
    aliases = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    names += [f"{alias}_{arch}" for minor, alias in aliases.items() if minor <= glibc]
    return names


def _placeholder(folder: Path, name: str, version: str) -> Path:
    """An empty wheel that says `name version` is installed, with no requirements."""
    dist = re.sub(r"[-_.]+", "_", name)
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: actstore-wheelhouse\nRoot-Is-Purelib: true\n"
                         "Tag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join(record + [f"{info}/RECORD,,"]) + "\n"
    wheel = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return wheel


def _read_have(path: Path) -> dict[str, str]:
    """name -> version from `pip freeze` lines (name==version); editable and URL lines are skipped."""
    have = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        if match:
            have[_normalize(match.group(1))] = match.group(2)
    return have


def _build_project_wheel(out: Path) -> Path:
    """actstore's wheel, built from a copy of the checkout's files (git's tracked and untracked-but-
    not-ignored files where this is a git checkout), so nothing is built inside the tree."""
    with tempfile.TemporaryDirectory(prefix="actstore-src-") as tmp:
        src = Path(tmp) / "src"
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                                capture_output=True, check=False)
        if listed.returncode == 0:
            for name in filter(None, listed.stdout.decode().split("\0")):
                if (ROOT / name).is_file():
                    (src / name).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(ROOT / name, src / name)
        else:
            shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", "build", "dist", "*.egg-info",
                                                                     "__pycache__", "actstore-data*"))
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", str(out), str(src)],
                       check=True)
    [wheel] = out.glob("actstore-*.whl")
    return wheel


def _requirement_pin(wheel: Path, name: str) -> str:
    """The exact version the wheel's metadata pins `name` to (torch==X in the server extra)."""
    with zipfile.ZipFile(wheel) as zf:
        [meta] = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        message = email.parser.Parser().parsestr(zf.read(meta).decode())
    for line in message.get_all("Requires-Dist") or []:
        match = re.match(rf"{re.escape(name)}\s*\(?==\s*([^\s,;)]+)", line, re.IGNORECASE)
        if match:
            return match.group(1)
    raise SystemExit(f"{wheel.name} does not pin {name} to one version")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the wheelhouse folder (created; must be empty)")
    parser.add_argument("--python-version", help="the target's Python, e.g. 3.12 (default: this Python's)")
    parser.add_argument("--platform", help="the target's platform tag, e.g. manylinux_2_28_x86_64 "
                                           "(default: this machine's)")
    parser.add_argument("--have", type=Path, help="`pip freeze` of the target: packages not to download")
    parser.add_argument("--extras", default="server", help="actstore's extras to include (default: server)")
    parser.add_argument("--wheel", type=Path, help="actstore's wheel, if built already (default: build one)")
    args = parser.parse_args(argv)

    out = args.out.resolve()
    if out.exists() and any(out.iterdir()):
        parser.error(f"{out} is not empty")
    out.mkdir(parents=True, exist_ok=True)
    if args.wheel:
        wheel = Path(shutil.copy2(args.wheel, out))
    else:
        wheel = _build_project_wheel(out)

    have = _read_have(args.have) if args.have else {}
    torch_pin = _requirement_pin(wheel, "torch")
    if "torch" in have and have["torch"].split("+")[0] != torch_pin:
        raise SystemExit(f"the target has torch {have['torch']}; actstore[server] needs torch=={torch_pin} "
                         "(any local build of it, e.g. +cu128)")
    # torch is always the target's own; its version as the project pins it
    have.setdefault("torch", torch_pin)
    have.pop("actstore", None)

    with tempfile.TemporaryDirectory(prefix="wheelhouse-") as tmp:
        placeholders = Path(tmp) / "placeholders"
        placeholders.mkdir()
        pins = []
        for name, version in sorted(have.items()):
            # always a label of our own: a real wheel of the same version (2.13.0+cpu in a
            # find-links folder) would otherwise win on its more specific tag
            labelled = f"{version}.{LABEL}" if "+" in version else f"{version}+{LABEL}"
            _placeholder(placeholders, name, labelled)
            pins.append(f"{name}=={labelled}")
        constraints = Path(tmp) / "have.txt"
        constraints.write_text("\n".join(pins) + "\n")

        target = []
        if args.python_version:
            target += ["--python-version", args.python_version, "--implementation", "cp"]
        for platform in _platforms(args.platform) if args.platform else []:
            target += ["--platform", platform]
        cmd = [sys.executable, "-m", "pip", "download", "--dest", str(out), "--only-binary=:all:", *target,
               "--find-links", str(placeholders), "-c", str(constraints), f"{wheel}[{args.extras}]"]
        print("wheelhouse:", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        for stand_in in placeholders.iterdir():
            (out / stand_in.name).unlink(missing_ok=True)

    wheels = sorted(p for p in out.iterdir() if p.suffix == ".whl")
    leaked = [p.name for p in wheels if _normalize(p.name.split("-")[0]) == "torch"]
    if leaked:
        raise SystemExit(f"torch reached the wheelhouse: {leaked}")
    size = sum(p.stat().st_size for p in wheels)
    print(f"wheelhouse: {len(wheels)} wheels, {size / 2**20:.0f} MiB in {out}")
    print(f"install on the target (torch=={torch_pin} already there):\n"
          f"    pip install --no-index --find-links {out} 'actstore[{args.extras}]'")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    sys.exit(main())
