"""Content-addressed keys: canonical JSON, run keys, result keys."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from actstore.store.keys import (
    CAPTURE_VERSION,
    POOLINGS,
    SITE,
    STORAGE_DTYPES,
    canonical_json,
    result_key,
    run_key,
    run_spec,
    sha256_hex,
)

REPO = Path(__file__).resolve().parents[2]
MODEL, DATASET = "a" * 64, "b" * 64
BASE = {"model_digest": MODEL, "dataset_digest": DATASET, "num_layers": 2, "pooling": "mean",
        "max_len": 128, "dtype": "float16"}
RUNS = ["c" * 64, "d" * 64]
OPTIONS = {"debiased": True, "layers": [0, 1]}

# These digests are hard-coded on purpose: they guard key stability across actstore versions.
# Run and result keys name stored arrays and results in every team member's shared store; if
# one of these changes, every existing run and cached result becomes unreachable. Change them
# only together with CAPTURE_VERSION (or a metric's definition version) and a migration.
EXPECTED_RUN_KEY = "efc5080fd0e3423db1a75e51ec9fb022957ce6f672bd1a74e58207aca0e4d295"
EXPECTED_RESULT_KEY = "fc6a09c149b1eb809210626d521f42062dd68e4ae987d509b0ed236606c90237"


# ---- canonical_json ----------------------------------------------------------------------
def test_canonical_json_is_key_order_independent():
    a = {"b": 1, "a": {"y": [1, 2], "x": None}, "c": "s"}
    b = {"c": "s", "a": {"x": None, "y": [1, 2]}, "b": 1}
    assert list(a) != list(b)
    assert canonical_json(a) == canonical_json(b)
    assert canonical_json(a) == '{"a":{"x":null,"y":[1,2]},"b":1,"c":"s"}'


def test_canonical_json_is_whitespace_free():
    value = {"k": [1, {"n": [True, False, None]}], "text": "keeps its spaces"}
    text = canonical_json(value)
    assert text == '{"k":[1,{"n":[true,false,null]}],"text":"keeps its spaces"}'
    assert "\n" not in text and ": " not in text and ", " not in text
    assert json.loads(text) == value


def test_canonical_json_is_ascii():
    text = canonical_json({"name": "café 日本 🙂"})
    assert text.isascii()
    assert json.loads(text) == {"name": "café 日本 🙂"}


def test_list_order_matters():
    assert canonical_json([1, 2]) != canonical_json([2, 1])


def test_sha256_hex_is_sha256_of_the_canonical_json():
    value = {"z": 1, "a": [2]}
    assert sha256_hex(value) == hashlib.sha256(b'{"a":[2],"z":1}').hexdigest()
    assert sha256_hex(value) == sha256_hex({"a": [2], "z": 1})


# ---- run keys ----------------------------------------------------------------------------
def test_run_spec_fields():
    spec = run_spec(**BASE)
    assert spec == {"model": MODEL, "dataset": DATASET, "site": SITE, "layers": [0, 1, 2],
                    "pooling": "mean", "max_len": 128, "dtype": "float16",
                    "capture_version": CAPTURE_VERSION}
    assert "mean" in POOLINGS and "float16" in STORAGE_DTYPES


def test_run_key_is_fixed_for_a_fixed_spec():
    # see the note on EXPECTED_RUN_KEY: this guards key stability across versions
    spec = run_spec(**BASE)
    assert canonical_json(spec) == (
        '{"capture_version":1,"dataset":"' + DATASET + '","dtype":"float16","layers":[0,1,2],'
        '"max_len":128,"model":"' + MODEL + '","pooling":"mean","site":"residual-stream"}'
    )
    assert run_key(spec) == EXPECTED_RUN_KEY


def test_run_key_ignores_dict_order():
    spec = run_spec(**BASE)
    assert run_key(dict(reversed(list(spec.items())))) == run_key(spec)


@pytest.mark.parametrize(("field", "value"), [
    ("model_digest", "e" * 64),
    ("dataset_digest", "f" * 64),
    ("pooling", "cls"),
    ("pooling", "last"),
    ("pooling", "tokens"),
    ("max_len", 129),
    ("max_len", 512),
    ("dtype", "float32"),
    ("dtype", "bfloat16"),
    ("num_layers", 3),
    ("num_layers", 1),
])
def test_run_key_changes_when_any_field_changes(field, value):
    assert BASE[field] != value
    assert run_key(run_spec(**{**BASE, field: value})) != run_key(run_spec(**BASE))


def test_run_keys_of_all_variants_are_distinct():
    keys = {run_key(run_spec(**{**BASE, "pooling": p, "dtype": d, "num_layers": n}))
            for p in POOLINGS for d in STORAGE_DTYPES for n in (1, 2, 6)}
    assert len(keys) == len(POOLINGS) * len(STORAGE_DTYPES) * 3


def test_run_key_changes_with_site_and_capture_version():
    spec = run_spec(**BASE)
    assert run_key({**spec, "site": "attention-out"}) != run_key(spec)
    assert run_key({**spec, "capture_version": CAPTURE_VERSION + 1}) != run_key(spec)


def test_keys_are_stable_across_processes():
    script = textwrap.dedent(f"""
        from actstore.store.keys import result_key, run_key, run_spec
        print(run_key(run_spec(**{BASE!r})))
        print(result_key("cka", 1, {OPTIONS!r}, {RUNS!r}))
    """)
    outputs = []
    for seed in ("0", "12345"):  # str hashing is randomised per process; keys must not depend on it
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout.split())
    assert outputs[0] == outputs[1] == [run_key(run_spec(**BASE)), result_key("cka", 1, OPTIONS, RUNS)]
    assert outputs[0] == [EXPECTED_RUN_KEY, EXPECTED_RESULT_KEY]


# ---- result keys -------------------------------------------------------------------------
def test_result_key_is_fixed_for_fixed_inputs():
    # see the note on EXPECTED_RESULT_KEY: this guards key stability across versions
    assert result_key("cka", 1, OPTIONS, RUNS) == EXPECTED_RESULT_KEY
    assert result_key("cka", 1, OPTIONS, RUNS) == sha256_hex(
        {"metric": "cka", "version": 1, "options": OPTIONS, "runs": RUNS})


def test_result_key_ignores_option_order():
    assert result_key("cka", 1, {"layers": [0, 1], "debiased": True}, RUNS) == result_key("cka", 1, OPTIONS, RUNS)


@pytest.mark.parametrize(("metric", "version", "options", "runs"), [
    ("cos", 1, OPTIONS, RUNS),
    ("cka", 2, OPTIONS, RUNS),
    ("cka", 1, {"debiased": False, "layers": [0, 1]}, RUNS),
    ("cka", 1, {"debiased": True, "layers": [0, 2]}, RUNS),
    ("cka", 1, {"debiased": True}, RUNS),
    ("cka", 1, {**OPTIONS, "kernel": "linear"}, RUNS),
    ("cka", 1, OPTIONS, ["c" * 64, "e" * 64]),
    ("cka", 1, OPTIONS, ["c" * 64]),
    ("cka", 1, OPTIONS, list(reversed(RUNS))),  # A vs B is not B vs A (a matrix transposes)
])
def test_result_key_changes_when_any_field_changes(metric, version, options, runs):
    assert result_key(metric, version, options, runs) != result_key("cka", 1, OPTIONS, RUNS)


def test_run_and_result_keys_are_sha256_hex():
    for k in (run_key(run_spec(**BASE)), result_key("cka", 1, OPTIONS, RUNS)):
        assert len(k) == 64 and set(k) <= set("0123456789abcdef")


def test_the_resid_post_site_keeps_the_key_runs_had_before_sites():
    from actstore.store.keys import site_of

    assert run_key(run_spec(**BASE, site="resid_post")) == run_key(run_spec(**BASE)) == EXPECTED_RUN_KEY
    assert site_of(run_spec(**BASE)) == "resid_post" and site_of({}) == "resid_post"
    mlp = run_spec(**BASE, site="mlp_out", modules="encoder.layer.*.output.dense")
    attn = run_spec(**BASE, site="attn_out", modules="encoder.layer.*.attention.output.dense")
    assert len({run_key(mlp), run_key(attn), EXPECTED_RUN_KEY}) == 3
    assert site_of(mlp) == "mlp_out" and mlp["modules"] == "encoder.layer.*.output.dense"
