"""The cross-model CKA matrix job through gRPC: values against pairwise CKA queries and float64
numpy formulas, progress, cache, validation, and cancel-then-resume from stored partial results."""

from __future__ import annotations

import numpy as np
import pytest

from actstore.errors import InvalidArgument, NotFound
from tests.conftest import make_settings
from tests.factories import save_tiny_model, sentences
from tests.formulas import cka_numpy, debiased_numpy


def layers_of(client, run: str) -> list[np.ndarray]:
    info = client.describe(run)
    return [client.read_activations(run, layer)[0].astype(np.float64) for layer in range(info.num_layers + 1)]


def numpy_matrices(client, runs: list[str]) -> tuple[np.ndarray, np.ndarray]:
    blocks = [x for run in runs for x in layers_of(client, run)]
    biased = np.array([[cka_numpy(a, b) for b in blocks] for a in blocks])
    debiased = np.array([[debiased_numpy(a, b) for b in blocks] for a in blocks])
    return biased, debiased


TEXTS = sentences(64, seed=5)
MODELS = ("bert", "gpt2", "llama")


@pytest.fixture(scope="module")
def client(module_client):
    return module_client


@pytest.fixture(scope="module")
def runs(client, tiny_models) -> list[str]:
    for name in MODELS:
        client.register_model(tiny_models[name], name=name)
    client.register_dataset(texts=TEXTS, name="same")
    jobs = [client.submit_capture(name, "same", pooling="mean") for name in MODELS]
    return [client.wait(job.job_id).target for job in jobs]


@pytest.fixture(scope="module")
def matrix(client, runs):
    return client.cka_matrix(runs)


def test_matrix_equals_pairwise_cka_block_by_block(client, runs, matrix):
    sizes = [client.describe(run).num_layers + 1 for run in runs]
    total = sum(sizes)
    assert matrix.biased.shape == matrix.debiased.shape == (total, total)
    assert matrix.runs == runs and matrix.provenance.run_keys == runs
    assert matrix.block_run.tolist() == [r for r, size in enumerate(sizes) for _ in range(size)]
    assert matrix.block_layer.tolist() == [layer for size in sizes for layer in range(size)]
    for i, run_i in enumerate(runs):
        for j, run_j in enumerate(runs):
            if j < i:
                continue
            pairwise = client.cka(run_i, run_j)
            np.testing.assert_allclose(matrix.block(i, j), pairwise.biased, rtol=0, atol=1e-9)
            np.testing.assert_allclose(matrix.block(i, j, debiased=True), pairwise.debiased, rtol=0, atol=1e-9)
            np.testing.assert_allclose(matrix.block(j, i), pairwise.biased.T, rtol=0, atol=1e-9)
    np.testing.assert_allclose(np.diag(matrix.biased), 1.0, atol=1e-12)
    np.testing.assert_allclose(np.diag(matrix.debiased), 1.0, atol=1e-12)
    np.testing.assert_allclose(matrix.biased, matrix.biased.T, atol=1e-12)


@pytest.mark.parametrize("a,b", [(0, 1), (1, 2)])
def test_blocks_equal_numpy_formulas(client, runs, matrix, a, b):
    xs, ys = layers_of(client, runs[a]), layers_of(client, runs[b])
    np.testing.assert_allclose(matrix.block(a, b), [[cka_numpy(x, y) for y in ys] for x in xs], rtol=0, atol=1e-9)
    np.testing.assert_allclose(matrix.block(a, b, debiased=True), [[debiased_numpy(x, y) for y in ys] for x in xs],
                               rtol=0, atol=1e-9)


def test_job_reports_progress_in_tasks(client, runs, matrix):
    job = client.submit_cka_matrix(runs, refresh=True)
    assert not job.cache_hit and job.kind == "cka-matrix"
    events = list(client.watch(job.job_id))
    assert events[-1].status == "done", events[-1]
    progress = [e for e in events if e.total]
    assert progress and all(e.unit == "tasks" for e in progress)
    total = progress[-1].total
    assert total > 1 and all(e.total == total for e in progress)
    dones = [e.done for e in progress]
    assert dones == sorted(dones), f"done went backwards: {dones}"
    assert dones[-1] == total
    assert len(set(dones)) >= 2, f"no intermediate progress was reported: {dones}"
    again = client.cka_matrix(runs)  # the recomputed result replaced the stored one
    assert again.provenance.cached and again.provenance.seconds != matrix.provenance.seconds
    np.testing.assert_allclose(again.biased, matrix.biased, rtol=0, atol=1e-12)
    np.testing.assert_allclose(again.debiased, matrix.debiased, rtol=0, atol=1e-12)


def test_repeated_request_is_a_cache_hit(client, runs, matrix):
    job = client.submit_cka_matrix(runs)
    assert job.cache_hit and job.status == "done"
    stored = client.result(job.target)
    assert stored.provenance.cached and stored.provenance.run_keys == runs
    again = client.cka_matrix(runs)
    assert again.provenance.cached
    assert again.provenance.result_key == matrix.provenance.result_key
    np.testing.assert_array_equal(again.biased, stored.arrays["biased"])
    np.testing.assert_allclose(again.biased, matrix.biased, rtol=0, atol=1e-12)
    # another order of the same runs is another matrix (its blocks are permuted), not this one
    reordered = client.cka_matrix(runs[::-1])
    assert reordered.provenance.result_key != matrix.provenance.result_key
    np.testing.assert_allclose(reordered.block(0, 2), matrix.block(2, 0), rtol=0, atol=1e-9)


def test_runs_with_other_samples_are_refused(client, runs):
    client.register_dataset(texts=TEXTS, sample_ids=[f"other-{i}" for i in range(len(TEXTS))], name="renamed")
    client.register_dataset(texts=TEXTS[:-1], name="shorter")
    renamed = client.capture("bert", "renamed", pooling="mean").run_key
    shorter = client.capture("gpt2", "shorter", pooling="mean").run_key
    with pytest.raises(InvalidArgument, match=r"position 0.*'row:0'.*'other-0'"):
        client.submit_cka_matrix([runs[0], runs[1], renamed])
    with pytest.raises(InvalidArgument, match=r"differ in length: 64 .* 63"):
        client.cka_matrix([runs[2], shorter])
    with pytest.raises(InvalidArgument, match="listed twice"):
        client.submit_cka_matrix([runs[0], runs[0]])
    with pytest.raises(NotFound):
        client.submit_cka_matrix([runs[0], "ffffffffffff"])


# ---- cancel and resume --------------------------------------------------------------------------
def slow_matrix_server(tmp_path, samples: int, limit: int):
    """Small shards (4 rows), one map-task slot and a tiny accumulator limit, so the matrix of two
    4-layer runs takes many small tasks, each reading its shards one by one: slow enough to cancel
    halfway (the limit counts the tasks' arrays only: no worker process's own growth fits a few kB).
    Both runs are captures of one tiny model (mean and last-token pooling) with weights of
    its own, so this server starts one capture replica of its own."""
    from actstore.client import Client
    from actstore.server.app import start_server

    model = save_tiny_model("bert", tmp_path / "bert", seed=7)
    server = start_server(make_settings(tmp_path / "store", shard_rows=4, metric_tasks=1,
                                        max_accumulator_bytes=limit, metric_worker_bytes=0))
    try:
        with Client(f"127.0.0.1:{server.port}") as c:
            c.register_model(model, name="bert")
            c.register_dataset(texts=sentences(samples, seed=21), name="many")
            jobs = [c.submit_capture("bert", "many", pooling=pooling) for pooling in ("mean", "last")]
            yield c, [c.wait(job.job_id).target for job in jobs], tmp_path / "store"
    finally:
        server.stop()


@pytest.fixture
def slow_server(tmp_path, ray_cluster):
    """Feature space (n = 160 against 8 blocks of 16): a 36 kB limit allows only one pair of
    16-wide blocks per tile (25.6 kB at the peak of its finalize plus the 9.3 kB state of the one
    running map task; two pairs need 138 kB), so the job is 36 tiles of 4 map tasks."""
    yield from slow_matrix_server(tmp_path, 160, 36_000)


@pytest.fixture
def slow_gram_server(tmp_path, ray_cluster):
    """Gram space (n = 64 against 8 blocks of 16): a 16 kB limit holds the reducer's 9.2 kB and
    one tile task of one-shard panels (6.7 kB of float16 rows and products; two-shard panels need
    8.2 kB), so the job is 4 map tasks for the means and the 136 tiles of 16 panels."""
    yield from slow_matrix_server(tmp_path, 64, 16_000)


@pytest.mark.parametrize("setup,space", [("slow_server", "feature"), ("slow_gram_server", "gram")])
def test_cancel_then_resume_from_partial_results(request, setup, space):
    c, runs, store = request.getfixturevalue(setup)
    job = c.submit_cka_matrix(runs)
    cancelled_at = None
    events = []
    for event in c.watch(job.job_id):
        events.append(event)
        if cancelled_at is None and event.total and event.total // 3 <= event.done < event.total:
            c.cancel(job.job_id)
            cancelled_at = event.done
    final = events[-1]
    seen = [(e.status, e.done, e.total) for e in events]
    if final.status == "done":
        pytest.fail(f"the CKA matrix job finished ({final.done}/{final.total} tasks) before the cancel landed: "
                    f"the setup is not slow enough to test resuming (events: {seen})")
    assert cancelled_at is not None, f"the job ended without reaching a third of its tasks: {seen}"
    assert final.status == "cancelled", final
    assert final.total > final.done >= cancelled_at > 0
    partials = store / "partials" / job.target
    assert partials.is_dir() and any(partials.iterdir()), f"no partial results were stored for the resume: {seen}"
    with pytest.raises(NotFound):
        c.result(job.target)

    resumed = c.submit_cka_matrix(runs)
    assert resumed.job_id != job.job_id and resumed.target == job.target and not resumed.cache_hit
    events = list(c.watch(resumed.job_id))
    assert events[-1].status == "done", events[-1]
    first = next(e for e in events if e.total)
    assert "resuming" in first.message or first.done > 0, (
        f"the resumed job started from scratch: first event done={first.done} message={first.message!r}")
    assert first.done >= final.done, (first.done, final.done)
    assert events[-1].done == events[-1].total == final.total
    assert not partials.exists(), "partial results are left behind after the job finished"

    result = c.cka_matrix(runs)
    assert result.provenance.cached and result.notes[0].startswith(f"{space} space"), result.notes
    biased, debiased = numpy_matrices(c, runs)
    np.testing.assert_allclose(result.biased, biased, rtol=0, atol=1e-9)
    np.testing.assert_allclose(result.debiased, debiased, rtol=0, atol=1e-9)


# ---- a second store on the same Ray cluster -----------------------------------------------------
def test_second_server_on_the_cluster_builds_its_own_matrix(client, runs, tiny_models, tmp_path):
    """Two actstore servers (two stores) sharing one Ray cluster, capturing the same model for
    their own cross-model jobs: the second one's capture must not collide with the first one's
    warm capture replica of that model."""
    from actstore.client import Client
    from actstore.server.app import start_server

    client.register_dataset(texts=TEXTS[:20], name="warm")
    client.capture("bert", "warm", pooling="mean")  # the module server now holds a warm bert replica
    other = start_server(make_settings(tmp_path / "other-store"))
    try:
        with Client(f"127.0.0.1:{other.port}") as c:
            c.register_model(tiny_models["bert"], name="bert")
            c.register_dataset(texts=TEXTS, name="same")
            run = c.capture("bert", "same", pooling="mean").run_key
            assert run == runs[0]  # same model, data and options: the same run key in another store
            mine = c.cka_matrix([run])
            np.testing.assert_allclose(mine.biased, client.cka(runs[0]).biased, rtol=0, atol=1e-9)
    finally:
        other.stop()
