"""The `actstore` command as a user runs it: a subprocess against a real server on loopback."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.factories import sentences

REPO = Path(__file__).resolve().parents[1]
N = 12


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACTSTORE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def actstore(*args: str, server=None, cwd: Path | None = None, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess:
    """`actstore ARGS` in a fresh process, without this environment's ACTSTORE_ variables (``env``: these set)."""
    address = ["--address", f"127.0.0.1:{server.port}"] if server is not None else []
    return subprocess.run([sys.executable, "-m", "actstore.cli", *address, *args], check=False,
                          capture_output=True, text=True, env={**_env(), **(env or {})}, cwd=cwd or REPO, timeout=300)


def ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def session(module_server, tiny_models):
    """Register a tiny BERT and a text dataset and capture it, all through the CLI."""
    texts = sentences(N, seed=3)
    outputs = {
        "model": ok(actstore("register-model", str(tiny_models["bert"]), "--name", "tiny-bert", server=module_server)),
        "dataset": ok(actstore("register-dataset", *[a for t in texts for a in ("--text", t)], "--name", "toy",
                               server=module_server)),
        "capture": ok(actstore("capture", "--model", "tiny-bert", "--dataset", "toy", "--pooling", "mean", "-q",
                               server=module_server)),
    }
    match = re.search(r"run ([0-9a-f]{16,})", outputs["capture"])
    assert match, outputs["capture"]
    return {"server": module_server, "run": match.group(1), "texts": texts, **outputs}


# ---- help -----------------------------------------------------------------------------------------
def test_help_explains_where_commands_run():
    out = ok(actstore("--help"))
    assert "--address" in out and "--store" in out and "--token" in out
    for command in ("serve", "register-model", "register-dataset", "capture", "cka", "cos", "read", "token"):
        assert command in out, command


def test_capture_help_lists_the_choices():
    out = ok(actstore("capture", "--help"))
    assert "--model" in out and "--dataset" in out
    assert re.search(r"\{cls,last,mean,tokens\}", out), out
    assert re.search(r"\{float16,float32,bfloat16,int8\}", out), out


def test_bad_choice_is_a_usage_error():
    proc = actstore("capture", "--model", "m", "--dataset", "d", "--pooling", "max")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr and "Traceback" not in proc.stderr


# ---- a session against a server -----------------------------------------------------------------
def test_register_and_capture_report_what_they_did(session):
    assert session["model"].startswith("model ") and "encoder" in session["model"]
    assert "layers 0..3" in session["model"] and "width 16" in session["model"] and "tiny-bert" in session["model"]
    assert f"n={N}" in session["dataset"] and "toy" in session["dataset"]
    assert "(captured)" in session["capture"]
    again = ok(actstore("capture", "--model", "tiny-bert", "--dataset", "toy", "--pooling", "mean", "-q",
                        server=session["server"]))
    assert session["run"] in again and "cache hit" in again


def test_runs_and_describe(session):
    runs = ok(actstore("runs", server=session["server"]))
    header, *rows = runs.strip().splitlines()
    assert header.split() == ["run", "model", "dataset", "site", "pooling", "dtype", "n", "layers", "width", "status"]
    (row,) = [r for r in rows if r.startswith(session["run"][:16])]
    assert row.split()[3:] == ["resid_post", "mean", "float16", str(N), "4", "16", "committed"]

    described = ok(actstore("describe", session["run"][:10], server=session["server"]))
    assert f"run      {session['run']}" in described
    assert "committed" in described and f"n={N}" in described and "width=16" in described
    assert "tiny-bert" in described and "toy" in described and "all values finite" in described
    assert "site     resid_post" in described and "per-layer statistics" in described


def test_capture_sites_and_dry_run(session):
    server = session["server"]
    args = ("capture", "--model", "tiny-bert", "--dataset", "toy", "--pooling", "mean", "--site",
            "resid_post,attn_out", "-q")
    planned = ok(actstore(*args, "--dry-run", server=server))
    assert f"run {session['run']}  resid_post  (stored: a cache hit)" in planned, planned
    assert "attn_out  (to capture)" in planned and f"{N} rows" in planned and "layers 0..3 x 16" in planned
    assert "raw for the 1 run(s) to capture" in planned and "about" in planned
    captured = ok(actstore(*args, server=server))
    keys = dict(re.findall(r"run ([0-9a-f]{64})  (\S+)", captured))
    assert set(keys.values()) == {"resid_post", "attn_out"} and session["run"] in keys
    (attn,) = [k for k, site in keys.items() if site == "attn_out"]
    assert attn in planned
    listed = ok(actstore("runs", "--site", "attn_out", server=server))
    assert attn[:16] in listed and session["run"][:16] not in listed
    described = ok(actstore("describe", attn, server=server))
    assert "site     attn_out (encoder.layer.*.attention.output.dense; layer 0 = embeddings)" in described
    matrix = ok(actstore("cka-matrix", session["run"], attn, "--dry-run", server=server))
    assert "8 x 8 CKA matrix over 2 run(s)" in matrix and "GFLOP" in matrix and "tile(s)" in matrix


def test_capture_help_names_the_sites_modules():
    out = ok(actstore("capture", "--help"))
    for text in ("blocks.{i}.hook_attn_out", "transformer.h.{i}.mlp", "model.layers.{i}.self_attn", "--dry-run"):
        assert text in out, text


def test_cka_prints_a_table_and_writes_a_plot(session, tmp_path, module_client):
    png = tmp_path / "cka.png"
    out = ok(actstore("cka", session["run"], "--plot", str(png), server=session["server"]))
    assert png.is_file() and png.stat().st_size > 1000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = out.splitlines()
    assert lines[0].replace(" ", "") == "||0|1|2|3|"
    table = [[float(v) for v in line.strip("| ").split(" | ")[1:]] for line in lines[2:6]]
    expected = module_client.cka(session["run"]).biased
    np.testing.assert_allclose(table, expected, atol=6e-4)  # printed with 3 digits
    assert "linear CKA (biased)" in out and f"plot written to {png}" in out


def test_cka_over_an_int8_run_prints_each_entrys_bound(session, module_client):
    """The bound table under the answer, in scientific notation (bounds are ~1e-4: a fixed 3 digits
    would print 0.000), the same numbers the client gets, and the note saying what they are."""
    out = ok(actstore("capture", "--model", "tiny-bert", "--dataset", "toy", "--pooling", "mean", "--dtype", "int8",
                      "-q", server=session["server"]))
    run = re.search(r"run ([0-9a-f]{16,})", out).group(1)
    out = ok(actstore("cka", run, server=session["server"]))
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("error bound of each entry"))
    printed = [line.strip("| ").split(" | ")[1:] for line in lines[at + 3:at + 7]]
    assert all(re.fullmatch(r"\d\.\de[-+]\d\d", value) for row in printed for value in row), printed
    expected = module_client.cka(run).bound_biased
    np.testing.assert_allclose(np.array(printed, dtype=float), expected, rtol=0.051, atol=1e-300)
    assert "note: error bound: every entry is within" in out


def test_cos_json(session):
    out = ok(actstore("cos", session["run"], "--json", server=session["server"]))
    answer = json.loads(out)
    matrix = np.array(answer["matrix"])
    assert matrix.shape == (4, 4) and answer["layers_a"] == answer["layers_b"] == [0, 1, 2, 3]
    np.testing.assert_allclose(np.diag(matrix), 1.0, atol=1e-3)
    assert answer["run_keys"] == [session["run"], session["run"]]
    assert "cosine" in answer["metric"]


def test_read_writes_an_npy(session, tmp_path, module_client):
    target = tmp_path / "layer1.npy"
    out = ok(actstore("read", session["run"], "--layer", "1", "--out", str(target), server=session["server"]))
    values = np.load(target)
    assert values.shape == (N, 16) and values.dtype == np.float16
    expected, _ = module_client.read_activations(session["run"], 1)
    np.testing.assert_array_equal(values, expected)
    assert f"({N}, 16)" in out and f"{N} sample ids" in out
    part = tmp_path / "part.npy"
    ok(actstore("read", session["run"], "--layer", "3", "--start", "2", "--stop", "5", "--out", str(part),
                server=session["server"]))
    np.testing.assert_array_equal(np.load(part), module_client.read_activations(session["run"], 3)[0][2:5])


@pytest.mark.parametrize(("args", "code"), [
    (["cka", "{run}", "--layers-a", "99"], "INVALID_ARGUMENT"),
    (["read", "{run}", "--layer", "1", "--start", "9", "--stop", "3", "--out", "x.npy"], "INVALID_ARGUMENT"),
    (["describe", "0123456789abcdef"], "NOT_FOUND"),
    (["capture", "--model", "no-such-model", "--dataset", "toy", "-q"], "NOT_FOUND"),
    (["read", "{run}", "--layer", "1", "--start", "0", "--stop", "0", "--out", "x.npy"], "INVALID_ARGUMENT"),
    (["--token", "ß€", "runs"], "INVALID_ARGUMENT"),
    (["--token", "abc\ndef", "runs"], "INVALID_ARGUMENT"),
])
def test_errors_exit_2_with_the_status_and_no_traceback(session, tmp_path, args, code):
    proc = actstore(*[a.format(run=session["run"]) for a in args], server=session["server"], cwd=tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.startswith(f"error ({code}): "), proc.stderr
    assert len(proc.stderr.strip()) > len(f"error ({code}): ") + 10
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not (tmp_path / "x.npy").exists()


def test_cancel_of_a_finished_job_says_there_is_nothing_to_cancel(session):
    listing = ok(actstore("jobs", "--status", "done", server=session["server"]))
    job = listing.splitlines()[1].split()[0]
    out = ok(actstore("cancel", job, server=session["server"]))
    assert out == f"job {job} already finished (done): nothing to cancel\n"


def test_a_relative_path_that_exists_here_is_sent_absolute(session, tmp_path, tiny_models, module_client):
    """The server resolves a path against its own working directory (here the repository), not the
    command's: the command sends a relative path that exists where it runs as an absolute one."""
    server = session["server"]
    (tmp_path / "here.csv").write_text("text\n" + "\n".join(session["texts"]) + "\n")
    assert "n=12" in ok(actstore("register-dataset", "here.csv", "--name", "relative", server=server, cwd=tmp_path))
    bert = tiny_models["bert"]
    assert "tiny-bert" in ok(actstore("register-model", bert.name, server=server, cwd=bert.parent))
    (tmp_path / "acts").mkdir()
    for layer in range(module_client.describe(session["run"]).num_layers + 1):
        np.save(tmp_path / "acts" / f"layer_{layer}.npy", module_client.read_activations(session["run"], layer)[0])
    assert re.search(r"run [0-9a-f]{16,}", ok(actstore("import", "acts", "--model", "tiny-bert", "--dataset",
                                                       "relative", "--pooling", "mean", "-q", server=server,
                                                       cwd=tmp_path)))
    missing = actstore("register-dataset", "not-here.csv", server=server, cwd=tmp_path)
    assert missing.returncode == 2 and "not-here.csv" in missing.stderr  # sent as written: the server's to find


def test_help_says_paths_are_resolved_on_the_server():
    for command in ("import", "register-dataset", "register-model"):
        out = " ".join(ok(actstore(command, "--help")).split())
        assert "a relative path that exists here is sent absolute; any other path is resolved on the server" in out


# ---- usage errors: argparse refuses a bad flag before anything connects -----------------------------
def usage_error(capsys, *args: str) -> str:
    """Run the CLI in-process; it must stop with argparse's usage error (exit 2, no traceback)."""
    from actstore.cli import main

    with pytest.raises(SystemExit) as stopped:
        main(list(args))
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "Traceback" not in err, err
    return err


def test_a_layer_list_takes_numbers_ranges_and_a_mix():
    from actstore.cli import build_parser

    args = build_parser().parse_args(["cka", "RUN", "--layers-a", "0,2-4, 6", "--layers-b", "3"])
    assert args.layers_a == [0, 2, 3, 4, 6] and args.layers_b == [3]
    assert build_parser().parse_args(["cka", "RUN"]).layers_a is None  # not given: every layer


@pytest.mark.parametrize("text", ["1,,3", "-1", "a", "1e30", "0x1", "1-", "-", "-3--1", "", "1.5"])
@pytest.mark.parametrize("command", [["cka", "RUN", "--layers-a"], ["knn", "RUN", "--layers-b"],
                                     ["entropy", "dataset-entropy", "RUN", "--layers"],
                                     ["outliers", "RUN", "--layers"]])
def test_a_bad_layer_list_is_a_usage_error_naming_the_flag(capsys, command, text):
    err = usage_error(capsys, *command[:-1], f"{command[-1]}={text}")
    assert f"argument {command[-1]}: " in err and "0,3,5" in err and "2-6" in err, err


@pytest.mark.parametrize("text", ["0-100000000000", "9223372036854775808", "3,100001"])
def test_a_layer_beyond_any_model_is_refused_without_building_the_range(capsys, text):
    err = usage_error(capsys, "cka", "RUN", "--layers-a", text)
    assert "argument --layers-a: " in err and "beyond any model (at most 100000)" in err, err


def test_a_reversed_range_is_refused_not_read_as_every_layer(capsys):
    err = usage_error(capsys, "cos", "RUN", "--layers-b", "0,5-2")
    assert "argument --layers-b: 5-2 is reversed: write 2-5" in err, err


@pytest.mark.parametrize(("args", "message"), [
    (["knn", "RUN", "-k", "0"], "argument -k: k 0 must be >= 1"),
    (["minibatch-cka", "RUN", "--batch-size", "0"], "argument --batch-size: batch_size 0 must be >= 4"),
    (["cka", "RUN", "--ci", "0"], "argument --ci: ci 0.0 must be in (0, 1)"),
    (["cka", "RUN", "--bootstrap-groups", "0"], "argument --bootstrap-groups: bootstrap_groups 0 must be in [2, 512]"),
    (["cka", "RUN", "--outlier-sigmas", "0"], "argument --outlier-sigmas: outlier_sigmas 0.0 must be > 0"),
    (["outliers", "RUN", "--top-k", "0"], "argument --top-k: top_k 0 must be >= 1"),
    (["entropy", "infonce", "RUN", "--temperature", "0"], "argument --temperature: temperature 0.0 must be > 0"),
    (["entropy", "dime", "RUN", "--permutations", "0"], "argument --permutations: permutations 0 must be >= 1"),
    (["similarity", "cka-kernel=(rbf-sigma={sigma})-hsic=gretton-score", "RUN", "--sigma-fraction", "0"],
     "argument --sigma-fraction: sigma_fraction 0.0 must be > 0"),
    (["stitch", "A", "1", "B", "2", "--test-fraction", "0"], "argument --test-fraction: test_fraction 0.0 must be in"),
    (["capture", "--model", "m", "--dataset", "d", "--max-len", "0"], "argument --max-len: max_len 0 must be >= 2"),
    (["register-dataset", "--builtin", "rotten-tomatoes", "--limit", "0"], "argument --limit: limit 0 must be >= 1"),
    (["demo", "--n", "0"], "argument --n: limit 0 must be >= 1"),
])
def test_a_zero_the_server_would_read_as_not_given_is_a_usage_error(capsys, args, message):
    assert message in usage_error(capsys, *args)


def test_alpha_zero_points_to_a_small_alpha_for_the_log_rank_limit(capsys):
    err = usage_error(capsys, "entropy", "dataset-entropy", "RUN", "--alpha", "0")
    assert "argument --alpha: alpha 0.0 must be > 0: for the log-rank limit (alpha -> 0) ask for a small alpha " \
           "such as 1e-6" in err, err


@pytest.mark.parametrize("args", [
    ["minibatch-cka", "RUN", "--batch-size", "9223372036854775808"],
    ["knn", "RUN", "-k", "9223372036854775808"],
    ["capture", "--model", "m", "--dataset", "d", "--max-len", "9223372036854775808"],
    ["register-dataset", "--builtin", "rotten-tomatoes", "--limit", "9223372036854775808"],
])
def test_an_int_too_large_for_the_request_is_invalid_argument_not_a_traceback(capsys, args):
    from actstore.cli import main

    assert main(["--address", "127.0.0.1:1", *args]) == 2  # refused before anything is sent
    err = capsys.readouterr().err
    assert err.startswith("error (INVALID_ARGUMENT): ") and "9223372036854775808 is out of range" in err, err


def test_read_into_a_folder_writes_a_named_file_and_prints_the_path_written(session, tmp_path, module_client):
    out = ok(actstore("read", session["run"][:12], "--layer", "2", "--out", str(tmp_path), server=session["server"]))
    target = tmp_path / f"{session['run'][:12]}-layer2.npy"
    assert f"to {target} " in out and list(tmp_path.iterdir()) == [target], out
    np.testing.assert_array_equal(np.load(target), module_client.read_activations(session["run"], 2)[0])
    out = ok(actstore("read", session["run"], "--layer", "2", "--out", str(tmp_path / "plain"),
                      server=session["server"]))
    assert f"to {tmp_path / 'plain.npy'} " in out and (tmp_path / "plain.npy").is_file()  # numpy adds .npy


def test_read_into_a_missing_folder_is_refused_before_reading(capsys, tmp_path):
    from actstore.cli import main

    target = tmp_path / "missing" / "x.npy"
    assert main(["--address", "127.0.0.1:1", "read", "RUN", "--layer", "1", "--out", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error (INVALID_ARGUMENT): --out {target}: the folder {target.parent} does not exist"), err


def test_cka_matrix_offers_only_the_measures_its_job_computes(capsys):
    from actstore import measures
    from actstore.cli import build_parser

    streamed = [m.identifier for m in measures.measures(measures.MOMENTS)]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["cka-matrix", "--help"])
    out = capsys.readouterr().out
    assert "{" + ",".join(streamed) + "}" in out, out
    assert {"nbs-score", "linear_regression-r2", "procrustes-distance=angular"} <= set(streamed)
    for refused in measures.measures(measures.ROWS):
        assert refused.identifier not in out, refused
    err = usage_error(capsys, "cka-matrix", "RUN", "--measure", "mutual_knn-topk={topk}")
    assert "argument --measure: invalid choice: 'mutual_knn-topk={topk}'" in err, err


def test_run_keys_upper_case_and_short_prefixes(session):
    server, run = session["server"], session["run"]
    assert f"run      {run}" in ok(actstore("describe", run[:10].upper(), server=server))
    proc = actstore("describe", run[:7], server=server)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"error (NOT_FOUND): run prefix '{run[:7]}' is too short: give at least 8 hex "
                                  "characters of the run key (it is the start of 1 run key(s))"), proc.stderr
    proc = actstore("runs", "--status", "bogus", server=server)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.startswith("error (INVALID_ARGUMENT): run status 'bogus' is not one of running, committed, "
                                  "failed"), proc.stderr


def test_a_reader_that_has_gone_ends_the_command_quietly(session):
    """`actstore cka RUN | head -3`: the pipe closes before the table is written."""
    address = ["--address", f"127.0.0.1:{session['server'].port}"]
    proc = subprocess.Popen([sys.executable, "-m", "actstore.cli", *address, "cka", session["run"]],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(), cwd=REPO)
    proc.stdout.close()  # the reader is gone before anything is written
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and err.decode() == "", err.decode()


def test_no_server_at_the_address_says_how_to_start_one(capsys):
    import socket

    from actstore.cli import main

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert main(["--address", f"127.0.0.1:{port}", "runs"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error (UNAVAILABLE): no actstore server answers (") and f"127.0.0.1:{port}" in err, err
    assert "start one with `actstore serve`, or check the address" in err and "--address or ACTSTORE_ADDRESS" in err


@pytest.mark.parametrize(("variable", "value", "says"), [
    ("ACTSTORE_GPU_WRITES", "bogus", "setting gpu_writes (ACTSTORE_GPU_WRITES): Input should be 'threads' or "
                                     "'ray-tasks' (given: 'bogus')"),
    ("ACTSTORE_SHARD_ROWS", "2", "setting shard_rows (ACTSTORE_SHARD_ROWS): Input should be greater than or "
                                 "equal to 4 (given: '2')"),
])
def test_a_bad_setting_in_the_environment_is_invalid_argument_naming_its_variable(tmp_path, variable, value, says):
    proc = actstore("serve", "--store", str(tmp_path / "store"), "--port", "0", env={variable: value})
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.startswith("error (INVALID_ARGUMENT): ") and says in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "store").exists()


def test_a_bad_setting_given_to_the_settings_names_every_one_refused():
    from actstore.config import Settings
    from actstore.errors import InvalidArgument

    with pytest.raises(InvalidArgument) as refused:
        Settings(port=70000, read_cache_gb=-1, no_such_setting=1)
    said = str(refused.value)
    for part in ("setting port (ACTSTORE_PORT): Input should be less than or equal to 65535 (given: 70000)",
                 "setting read_cache_gb (ACTSTORE_READ_CACHE_GB): Input should be greater than 0 (given: -1)",
                 "setting no_such_setting (ACTSTORE_NO_SUCH_SETTING): Extra inputs are not permitted"):
        assert part in said, said
