"""The measure registry (`actstore.measures`): specs are checked when registered, an identifier is
defined once, options are resolved by the spec, a third-party package registers through the
`actstore.measures` entry point group (a real installed distribution's metadata, in a fresh
interpreter), a broken plug-in does not hide the built-ins, and listing the measures (what the
thin client and the CLI do) loads none of the numerics."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from actstore import measures
from actstore.errors import InvalidArgument
from actstore.options import SIMILARITY

REPO = Path(__file__).resolve().parents[2]


def _python(code: str, *paths: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, paths), str(REPO)])}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                          check=False)


def _plugin(root: Path, module: str, body: str) -> Path:
    """An installed distribution `module`-0.1 whose entry point in actstore.measures names `module`."""
    (root / f"{module}.py").write_text(textwrap.dedent(body))
    info = root / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[actstore.measures]\n{module} = {module}\n")
    return root


def test_a_spec_is_checked_and_an_identifier_is_defined_once():
    with pytest.raises(ValueError, match="needs must be"):
        measures.Measure("x-score", "x", "gram", "m:f")
    with pytest.raises(ValueError, match="fills .* name options it does not take"):
        measures.Measure("x-alpha={alpha}-score", "x", measures.MOMENTS, "m:f", fills={"alpha": "alpha"})
    with pytest.raises(ValueError, match="module:attribute"):
        measures.Measure("x-score", "x", measures.MOMENTS, "no_colon")
    existing = measures.get("cca-score")
    assert measures.register(existing) is existing  # the same spec again is harmless
    with pytest.raises(ValueError, match="registered twice"):
        measures.register(measures.Measure("cca-score", "another cca", measures.MOMENTS, "m:f"))


def test_options_are_resolved_by_the_spec():
    shape = measures.get("shape_metric-alpha={alpha}-distance=angular")
    assert shape.resolve({}) == {"alpha": SIMILARITY.alpha.default}
    assert shape.filled(shape.resolve({"alpha": 0})) == "shape_metric-alpha=0-distance=angular"
    with pytest.raises(InvalidArgument, match="alpha 1.5 must be in"):
        shape.resolve({"alpha": 1.5})
    with pytest.raises(InvalidArgument, match="does not take k"):
        shape.resolve({"k": 3})
    with pytest.raises(InvalidArgument, match="not one of .*nbs-score"):
        measures.get("no-such-measure")
    with pytest.raises(InvalidArgument, match="not one of"):
        measures.get("rsa-rdm=cosine-compare=pearson", needs=measures.MOMENTS)


def test_a_third_party_measure_registers_through_the_entry_point_group(tmp_path):
    root = _plugin(tmp_path, "thirdparty_measure", '''
        from actstore.measures import MOMENTS, Measure, register
        from actstore.options import Option

        def mean_offset():
            raise AssertionError("only the server builds it")

        register(Measure("mean_offset-scale={scale}-score", "a plug-in's measure", MOMENTS,
                         "thirdparty_measure:mean_offset", options=(Option("scale", float, 2.0, minimum=0),),
                         fills={"scale": "scale"}, source="a test"))
    ''')
    code = ("from actstore import measures; spec = measures.get('mean_offset-scale={scale}-score'); "
            "print(spec.filled(spec.resolve({'scale': 0.5})), len(measures.measures()))")
    proc = _python(code, root)
    assert proc.returncode == 0, proc.stderr
    filled, count = proc.stdout.split()
    assert filled == "mean_offset-scale=0.5-score" and int(count) == len(measures.measures()) + 1
    cli = subprocess.run([sys.executable, "-m", "actstore.cli", "similarity", "--help"], capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{REPO}"}, timeout=120,
                         check=False)
    assert cli.returncode == 0 and "mean_offset-scale={scale}-score" in cli.stdout and "--scale" in cli.stdout


def test_a_broken_plugin_is_logged_and_the_built_ins_stay(tmp_path):
    root = _plugin(tmp_path, "broken_measure", "raise ImportError('missing dependency of the plug-in')\n")
    proc = _python("from actstore import measures; print(measures.get('nbs-score').identifier)", root)
    assert proc.returncode == 0 and proc.stdout.strip() == "nbs-score", proc.stderr
    assert "broken_measure" in proc.stderr and "missing dependency of the plug-in" in proc.stderr


def test_listing_the_measures_loads_no_numerics():
    code = ("import sys; import actstore.client; from actstore import measures; measures.measures(); "
            "print(sorted(m for m in sys.modules if m.startswith(('actstore.metrics', 'scipy', 'torch'))))")
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
