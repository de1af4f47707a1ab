"""`actstore import` end to end: activations written by the tests in each format (npy and
safetensors arrays, vLLM extract_hidden_states files, a SAELens cached-activations dataset) are
imported through a real server as runs of a registered tiny model on a registered dataset; the
queries on them equal an independent float64 CKA of the raw arrays, bad sources are clear
INVALID_ARGUMENTs, and a flipped byte in an imported shard is DATA_LOSS."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from actstore.errors import DataLoss, InvalidArgument, PermissionDenied
from actstore.server.app import start_server
from actstore.server.auth import create_token
from tests.conftest import make_settings
from tests.factories import sentences
from tests.formulas import cka_numpy
from tests.server.test_verify import flip_chunk

N, WIDTH, STATES = 20, 16, 4  # the tiny gpt2: 3 blocks (layers 0..3), 16 wide; shards of 8 rows
IDS = [f"s-{i:02d}" for i in range(N)]


def layered(rng: np.random.Generator, rows: int, dtype=np.float32) -> list[np.ndarray]:
    """L+1 arrays (rows, WIDTH) that drift from layer to layer (so CKA is neither 0 nor 1)."""
    x = rng.normal(size=(rows, WIDTH))
    out = []
    for _ in range(STATES):
        out.append(x.astype(dtype))
        x = np.tanh(x @ rng.normal(size=(WIDTH, WIDTH)) / 4) + 0.3 * rng.normal(size=(rows, WIDTH))
    return out


def bf16(values: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.asarray(values, np.float32)).bfloat16().float().numpy()


def cka_matrix(layers: list[np.ndarray]) -> np.ndarray:
    return np.array([[cka_numpy(a, b) for b in layers] for a in layers])


@pytest.fixture(scope="module")
def setup(module_client, tiny_models):
    model = module_client.register_model(tiny_models["gpt2"], name="tiny-gpt2")
    module_client.register_dataset(texts=sentences(N, seed=11), sample_ids=IDS, name="toy")
    assert (model.num_layers, model.hidden_size) == (STATES - 1, WIDTH)
    return module_client


def write_vllm(folder, rng, counts) -> list[np.ndarray]:
    """One <sample id>.safetensors per sample as vLLM's ExampleHiddenStatesConnector writes it:
    hidden_states (tokens, layers, width), token_ids (tokens,), and its .lock file."""
    folder.mkdir()
    per_sample = []
    for sid, count in zip(IDS, counts):
        hidden = np.stack(layered(rng, count), axis=1)
        save_file({"hidden_states": torch.from_numpy(hidden).to(torch.bfloat16),
                   "token_ids": torch.arange(count, dtype=torch.int64) + 5}, str(folder / f"{sid}.safetensors"))
        (folder / f"{sid}.safetensors.lock").write_text("")
        per_sample.append(bf16(hidden))
    return per_sample


def write_saelens(folder, rng, context: int) -> list[np.ndarray]:
    """A SAELens cached-activations dataset: one row per context, one Array2D column per hook."""
    layers = layered(rng, N * context)
    hooks = ["blocks.0.hook_resid_pre"] + [f"blocks.{i}.hook_resid_post" for i in range(STATES - 1)]
    features = datasets.Features({**{h: datasets.Array2D(shape=(context, WIDTH), dtype="float32") for h in hooks},
                                  "token_ids": datasets.Sequence(datasets.Value("int32"), length=context)})
    columns = {h: a.reshape(N, context, WIDTH) for h, a in zip(hooks, layers)}
    columns["token_ids"] = np.arange(N * context, dtype=np.int32).reshape(N, context) % 50
    datasets.Dataset.from_dict(columns, features=features).save_to_disk(str(folder))
    return layers


def npy_folder(path, layers, ids=None, name="layer_{k}.npy"):
    """The arrays layout: one .npy per layer (and the rows' sample ids, if given)."""
    path.mkdir()
    for k, a in enumerate(layers):
        np.save(path / name.format(k=k), a)
    if ids is not None:
        (path / "sample_ids.json").write_text(json.dumps(ids))
    return path


def test_npy_folder_imports_and_cka_equals_the_raw_arrays(setup, tmp_path):
    client = setup
    layers = layered(np.random.default_rng(0), N)
    folder = npy_folder(tmp_path / "npy", layers, IDS, name="layer_{k:02d}.npy")
    result = client.import_activations(folder, model="tiny-gpt2", dataset="toy", pooling="mean")
    run = client.describe(result.run_key)
    assert (run.status, run.n, run.num_layers, run.width, run.dtype, run.pooling) == \
        ("committed", N, STATES - 1, WIDTH, "float32", "mean")
    assert np.allclose(client.cka(result.run_key).biased, cka_matrix(layers), atol=1e-10)
    values, ids = client.read_activations(result.run_key, 2)
    assert ids == IDS and np.array_equal(values, layers[2])
    again = client.import_activations(folder, model="tiny-gpt2", dataset="toy", pooling="mean")
    assert again.cache_hit and again.run_key == result.run_key
    # an import never shares a key with a capture of the same model, dataset and pooling
    assert client.capture("tiny-gpt2", "toy", pooling="mean", dtype="float32").run_key != result.run_key


def test_a_captured_run_exported_and_imported_answers_every_query_alike(setup, tmp_path):
    client = setup
    captured = client.capture("tiny-gpt2", "toy", pooling="last", dtype="float32").run_key
    exported = [client.read_activations(captured, k)[0] for k in range(STATES)]
    folder = npy_folder(tmp_path / "exported", exported, IDS)
    imported = client.import_activations(folder, model="tiny-gpt2", dataset="toy", pooling="last").run_key
    assert imported != captured
    assert np.allclose(np.diag(client.cka(imported, captured).biased), 1.0, atol=1e-12)
    assert np.allclose(client.cos(imported).mean, client.cos(captured).mean, atol=1e-12)
    assert np.allclose(client.residual_norm(imported).mean, client.residual_norm(captured).mean, atol=1e-12)
    assert np.allclose(client.entropy("dataset_entropy", imported).values, client.entropy("dataset_entropy",
                                                                                          captured).values)


def test_safetensors_layouts_and_storage_dtypes(setup, tmp_path):
    client = setup
    layers = layered(np.random.default_rng(1), N, np.float64)
    single = tmp_path / "acts.safetensors"
    save_file({f"layer.{k}": torch.from_numpy(a) for k, a in enumerate(layers)}, str(single))
    per_layer = tmp_path / "per-layer"
    per_layer.mkdir()
    for k, a in enumerate(layers):
        save_file({"activations": torch.from_numpy(a).half()}, str(per_layer / f"layer_{k}.safetensors"))
    one = client.import_activations(single, model="tiny-gpt2", dataset="toy", pooling="last")
    assert client.describe(one.run_key).dtype == "float32"  # float64 is kept as float32
    assert np.allclose(client.cka(one.run_key).biased, cka_matrix([a.astype(np.float32) for a in layers]),
                       atol=1e-9)
    half = client.import_activations(per_layer, model="tiny-gpt2", dataset="toy", format="arrays", pooling="last")
    assert client.describe(half.run_key).dtype == "float16" and half.run_key != one.run_key
    assert np.allclose(client.cka(half.run_key).biased, cka_matrix([a.astype(np.float16) for a in layers]),
                       atol=1e-9)
    rounded = client.import_activations(single, model="tiny-gpt2", dataset="toy", pooling="last", dtype="bfloat16")
    values, _ = client.read_activations(rounded.run_key, 1)
    assert np.array_equal(values, bf16(layers[1]))


def test_vllm_files_pool_or_keep_every_token(setup, tmp_path):
    client = setup
    rng = np.random.default_rng(2)
    counts = rng.integers(1, 6, size=N)
    per_sample = write_vllm(tmp_path / "vllm", rng, counts)
    for pooling, pick in (("mean", lambda s: s.astype(np.float64).mean(axis=0)), ("last", lambda s: s[-1]),
                          ("cls", lambda s: s[0])):
        result = client.import_activations(tmp_path / "vllm", model="tiny-gpt2", dataset="toy", pooling=pooling)
        # stored as the source's bfloat16: a mean is rounded to it
        expected = [bf16(np.stack([pick(s)[k] for s in per_sample])) for k in range(STATES)]
        assert client.describe(result.run_key).dtype == "bfloat16"
        assert np.allclose(client.cka(result.run_key).biased, cka_matrix(expected), atol=1e-9), pooling
    tokens = client.import_activations(tmp_path / "vllm", model="tiny-gpt2", dataset="toy", pooling="tokens",
                                       dtype="float32")
    run = client.describe(tokens.run_key)
    assert (run.pooling, run.rows) == ("tokens", int(counts.sum()))
    rows = [np.concatenate([s[:, k] for s in per_sample]) for k in range(STATES)]
    assert np.array_equal(client.read_activations(tokens.run_key, 3)[0], rows[3])
    assert np.allclose(client.cka(tokens.run_key).biased, cka_matrix(rows), atol=1e-8)


def test_saelens_dataset_imports(setup, tmp_path):
    client = setup
    context = 3
    layers = write_saelens(tmp_path / "saelens", np.random.default_rng(3), context)
    result = client.import_activations(tmp_path / "saelens", model="tiny-gpt2", dataset="toy", pooling="last")
    expected = [a.reshape(N, context, WIDTH)[:, -1] for a in layers]
    assert np.allclose(client.cka(result.run_key).biased, cka_matrix(expected), atol=1e-10)
    tokens = client.import_activations(tmp_path / "saelens", model="tiny-gpt2", dataset="toy", pooling="tokens")
    assert client.describe(tokens.run_key).rows == N * context
    assert np.array_equal(client.read_activations(tokens.run_key, 0)[0], layers[0])


def test_a_flipped_byte_in_an_imported_shard_is_data_loss(setup, module_server, tmp_path):
    client = setup
    layers = layered(np.random.default_rng(4), N)
    folder = npy_folder(tmp_path / "npy", layers)
    run = client.import_activations(folder, model="tiny-gpt2", dataset="toy", pooling="cls").run_key
    flip_chunk(module_server, run, shard=1, layer=2)
    with pytest.raises(DataLoss, match=r"shard 1 layer 2"):
        client.cka(run)
    # a repair drops the damaged shard; the same import again rewrites it
    assert client.verify([run], repair=True).runs[0].damaged_shards == [1]
    again = client.import_activations(folder, model="tiny-gpt2", dataset="toy", pooling="cls")
    assert again.run_key == run and not again.cache_hit and again.job.done == 3
    assert np.allclose(client.cka(run, refresh=True).biased, cka_matrix(layers), atol=1e-10)


def test_the_docs_show_every_format_and_the_tests_examples():
    text = (Path(__file__).resolve().parents[2] / "docs" / "import.md").read_text()
    for needed in ("## Format `arrays`", "## Format `vllm`", "## Format `saelens`", "npy_folder", "write_vllm",
                   "write_saelens", "sample_ids.json", "layer.<k>", "hidden_states", "token_ids",
                   "blocks.<i>.hook_resid_pre", "eagle_aux_hidden_state_layer_ids", '"source"'):
        assert needed in text, needed


def test_nan_is_counted_as_a_capture_counts_it(setup, tmp_path):
    client = setup
    layers = layered(np.random.default_rng(5), N)
    layers[1][3, 4] = np.nan
    save_file({f"layer.{k}": torch.from_numpy(a) for k, a in enumerate(layers)}, str(tmp_path / "nan.safetensors"))
    run = client.import_activations(tmp_path / "nan.safetensors", model="tiny-gpt2", dataset="toy", pooling="cls")
    health = {h.layer: h.nan_count for h in client.describe(run.run_key).health}
    assert health == {0: 0, 1: 1, 2: 0, 3: 0}


def test_bad_sources_are_invalid_argument(setup, tmp_path):
    client = setup
    rng = np.random.default_rng(6)
    good = layered(rng, N)
    wide = [*good[:3], rng.normal(size=(N, WIDTH + 2)).astype(np.float32)]
    cases = {
        "sample ids differ from the dataset's at row 0": npy_folder(tmp_path / "order", good, IDS[::-1]),
        "holds 19 samples but the dataset has 20": npy_folder(tmp_path / "short", [a[:-1] for a in good]),
        "mixed widths: layer 0 is 16 wide, layer 3 is 18": npy_folder(tmp_path / "wide", wide),
        "layer 2 has shape": npy_folder(tmp_path / "3d", [*good[:2], good[2][:, :, None], good[3]]),
        "holds int64 values: activations must be floats": npy_folder(
            tmp_path / "ints", [*good[:3], np.ones((N, WIDTH), dtype=np.int64)]),
        "holds <U1 values|holds str": npy_folder(tmp_path / "strings", [*good[:3], np.full((N, WIDTH), "x")]),
        "layer 2 is missing": npy_folder(tmp_path / "gap", [good[0], good[1]]),
        "holds layers 0..2, but model 'tiny-gpt2' has layers 0..3": npy_folder(tmp_path / "few", good[:3]),
        "is 8 wide, but model 'tiny-gpt2' is 16 wide": npy_folder(tmp_path / "narrow", [a[:, :8] for a in good]),
        "not every token": npy_folder(tmp_path / "pooled", good),
    }
    (tmp_path / "gap" / "layer_3.npy").write_bytes((tmp_path / "gap" / "layer_1.npy").read_bytes())
    for message, path in cases.items():
        with pytest.raises(InvalidArgument, match=message):
            client.import_activations(path, model="tiny-gpt2", dataset="toy",
                                      pooling="tokens" if "token" in message else "mean")
    write_vllm(tmp_path / "vllm", rng, [2] * N)
    (tmp_path / "vllm" / f"{IDS[4]}.safetensors").rename(tmp_path / "vllm" / "stranger.safetensors")
    with pytest.raises(InvalidArgument, match="sample 's-04' has no file s-04.safetensors"):
        client.import_activations(tmp_path / "vllm", model="tiny-gpt2", dataset="toy")
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken!" + b"\x00" * 40)
    with pytest.raises(InvalidArgument, match="cannot read .* as safetensors"):
        client.import_activations(corrupt, model="tiny-gpt2", dataset="toy")
    mlp = datasets.Features({"blocks.0.hook_mlp_out": datasets.Array2D(shape=(2, WIDTH), dtype="float32")})
    datasets.Dataset.from_dict({"blocks.0.hook_mlp_out": np.zeros((N, 2, WIDTH), np.float32)},
                               features=mlp).save_to_disk(str(tmp_path / "sae-mlp"))
    with pytest.raises(InvalidArgument, match="'blocks.0.hook_mlp_out' is not the residual stream"):
        client.import_activations(tmp_path / "sae-mlp", model="tiny-gpt2", dataset="toy")
    with pytest.raises(InvalidArgument, match="format 'parquet' is not one of arrays, vllm, saelens"):
        client.import_activations(tmp_path / "order", model="tiny-gpt2", dataset="toy", format="parquet")


def test_imports_from_server_paths_follow_the_register_path_rule(tmp_path, ray_cluster, tiny_models):
    running = start_server(make_settings(tmp_path / "store", auth=True))
    try:
        from actstore.client import Client

        catalog = running.service.catalog
        folder = npy_folder(tmp_path / "acts", layered(np.random.default_rng(7), N))
        address = f"127.0.0.1:{running.port}"
        with Client(address, token=create_token(catalog, "ada", "admin")) as admin:
            admin.register_model(tiny_models["gpt2"], name="tiny-gpt2")
            admin.register_dataset(texts=sentences(N, seed=11), sample_ids=IDS, name="toy")
            assert admin.import_activations(folder, model="tiny-gpt2", dataset="toy", pooling="mean").run_key
            bad = npy_folder(tmp_path / "secret-layout", [np.full((N, WIDTH), "hunter2")] * STATES)
            with pytest.raises(InvalidArgument) as info:
                admin.import_activations(bad, model="tiny-gpt2", dataset="toy")
            assert "is not a usable activations source" in str(info.value) and "hunter2" not in str(info.value)
        with Client(address, token=create_token(catalog, "walt", "writer")) as writer:
            with pytest.raises(PermissionDenied, match="SubmitImport from a path on the server needs the admin"):
                writer.import_activations(folder, model="tiny-gpt2", dataset="toy")
    finally:
        running.stop()


def test_the_cli_imports_and_says_what_it_did(setup, module_server, tmp_path):
    from tests.test_cli import actstore, ok

    folder = npy_folder(tmp_path / "cli", layered(np.random.default_rng(8), N))
    first = ok(actstore("import", str(folder), "--model", "tiny-gpt2", "--dataset", "toy", "--pooling", "last", "-q",
                        server=module_server))
    assert first.startswith("run ") and "(imported)" in first
    assert "(cache hit: already stored)" in ok(actstore("import", str(folder), "--model", "tiny-gpt2", "--dataset",
                                                        "toy", "--pooling", "last", "-q", server=module_server))
    refused = actstore("import", str(folder), "--model", "tiny-gpt2", "--dataset", "toy", "--pooling", "tokens",
                       server=module_server)
    assert refused.returncode == 2 and "error (INVALID_ARGUMENT)" in refused.stderr and "Traceback" not in \
        refused.stderr
    assert "extract_hidden_states" in ok(actstore("import", "--help"))
