"""Issue 10, item 2 and 3: input never gives INTERNAL, every request's work is bounded, a call that
ends stops its work, and an INTERNAL status names a correlation id instead of the exception.
Each case goes over a raw gRPC channel to a real server (the client would refuse some values first)."""

from __future__ import annotations

import logging
import math
import threading
import time
from types import SimpleNamespace

import grpc
import numpy as np
import pytest
import ray

from actstore import measures
from actstore._proto.actstore.v1 import actstore_pb2 as pb
from actstore._proto.actstore.v1 import actstore_pb2_grpc as rpc
from actstore.client import Client
from actstore.server.app import start_server
from tests.conftest import make_settings
from tests.factories import sentences

N = 24
INVALID, EXHAUSTED = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED
E, S = pb.EntropyRequest, pb.SimilarityRequest
# 16 COS pairs (4 x 4 layers) hold 16 x 4005 x 8 B = 513 kB per accumulator: over 1 MB with the merge's copy
# one pair (32 kB per task) is far below it
LIMIT_BYTES = 1_000_000
SLOW_PERMUTATIONS = 10**7  # DiME permutations that take minutes on this run


@pytest.fixture(scope="module")
def v(tmp_path_factory, ray_cluster, tiny_models):
    root = tmp_path_factory.mktemp("validation")
    server = start_server(make_settings(root / "store", max_accumulator_bytes=LIMIT_BYTES,
                                        max_dime_permutations=10 * SLOW_PERMUTATIONS, max_augment_views=8))
    client = Client(f"127.0.0.1:{server.port}")
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        client.register_model(tiny_models["bert"], name="bert")
        client.register_model(tiny_models["gpt2"], name="gpt2")
        texts = sentences(N, seed=3)
        client.register_dataset(texts=texts, name="toy")
        client.register_dataset(texts=texts[:12], name="aug", augment_views=2)
        jobs = {"pooled": client.submit_capture("bert", "toy", pooling="mean"),
                "aug": client.submit_capture("bert", "aug", pooling="mean"),
                "tokens": client.submit_capture("gpt2", "toy", pooling="tokens")}
        runs = {name: client.wait(job.job_id).target for name, job in jobs.items()}
        yield SimpleNamespace(server=server, client=client, root=root, catalog=rpc.CatalogStub(channel),
                              query=rpc.QueryStub(channel), **runs)
    finally:
        channel.close()
        client.close()
        server.stop()


def status_of(call) -> tuple[grpc.StatusCode, str]:
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def expect(v, code: grpc.StatusCode, call, *fragments: str) -> str:
    got, details = status_of(lambda: call(v))
    assert got == code, f"expected {code.name}, got {got.name}: {details}"
    for fragment in fragments:
        assert fragment in details, details
    assert "Traceback" not in details and "Error(" not in details, details
    return details


def register_texts(**fields):
    return lambda v: v.catalog.RegisterDataset(pb.RegisterDatasetRequest(**fields), timeout=30)


# ---- registration -----------------------------------------------------------------------------------
def test_a_label_above_int32_in_a_text_list_is_invalid(v):
    expect(v, INVALID, register_texts(texts=pb.TextList(texts=["a b", "c d"], labels=[2**40, 1])),
           "1099511627776", "below 2147483647")


def test_a_label_above_int32_in_an_npz_is_invalid(v):
    path = v.root / "big-labels.npz"
    np.savez(path, texts=np.array(["a b", "c d"]), labels=np.array([1, 2**31 - 1]))
    expect(v, INVALID, register_texts(path=str(path)), "2147483647")


def test_a_300_character_file_name_is_invalid(v):
    expect(v, INVALID, register_texts(path=str(v.root / ("x" * 300 + ".csv"))), "too long")
    expect(v, INVALID, lambda v: v.catalog.RegisterModel(pb.RegisterModelRequest(path="/tmp/" + "y" * 300)),
           "too long")


def test_a_deeply_nested_json_file_is_invalid(v):
    for name, text in (("deep.json", "[" * 100_000 + "]" * 100_000),
                       ("deep.jsonl", '{"text": ' + "[" * 100_000 + "]" * 100_000 + "}\n")):
        (v.root / name).write_text(text)
        expect(v, INVALID, register_texts(path=str(v.root / name)), "nested too deeply")


@pytest.mark.parametrize("which", ["dataset", "model"])
def test_a_nul_byte_in_a_path_is_invalid(v, which):
    path = str(v.root / "a\x00b.csv")
    call = register_texts(path=path) if which == "dataset" else (
        lambda v: v.catalog.RegisterModel(pb.RegisterModelRequest(path=path)))
    expect(v, INVALID, call, "NUL byte")


@pytest.mark.parametrize("which", ["dataset", "model"])
def test_a_path_of_an_unknown_users_home_is_invalid(v, which):
    path = "~no-such-user-here/data.csv"
    call = register_texts(path=path) if which == "dataset" else (
        lambda v: v.catalog.RegisterModel(pb.RegisterModelRequest(path=path)))
    expect(v, INVALID, call, "give an absolute path")


def test_a_builtin_under_an_alias_that_another_model_holds_is_already_exists(v):
    bert = v.client.models()[0] if v.client.models()[0].aliases[0] == "bert" else v.client.models()[1]
    details = expect(v, grpc.StatusCode.ALREADY_EXISTS, lambda v: v.catalog.RegisterModel(
        pb.RegisterModelRequest(builtin="minilm-l6", name="bert")), "'bert'", bert.digest[:12], "minilm-l6")
    assert "--name" in details


def test_augment_views_are_capped_by_the_setting(v):
    expect(v, EXHAUSTED, register_texts(texts=pb.TextList(texts=["a b c", "c d e"]), augment_views=10**6),
           "augment_views 1000000", "ACTSTORE_MAX_AUGMENT_VIEWS")


# ---- query options ------------------------------------------------------------------------------
OPTION_CASES = {
    "alpha-nan": (E.DATASET_ENTROPY, "pooled", {"alpha": math.nan}, "alpha"),
    "alpha-inf": (E.DATASET_ENTROPY, "pooled", {"alpha": math.inf}, "alpha"),
    "alpha-negative": (E.DATASET_ENTROPY, "pooled", {"alpha": -1.0}, "alpha"),
    "lidar-alpha-nan": (E.LIDAR, "aug", {"alpha": math.nan}, "alpha"),
    "permutations-negative": (E.DIME, "aug", {"permutations": -1}, "permutations"),
    "seed-negative": (E.DIME, "aug", {"seed": -1}, "seed"),
    "temperature-nan": (E.INFONCE, "aug", {"temperature": math.nan}, "temperature"),
    "temperature-inf": (E.INFONCE, "aug", {"temperature": math.inf}, "temperature"),
}


@pytest.mark.parametrize("case", list(OPTION_CASES))
def test_entropy_options_out_of_range_are_invalid(v, case):
    metric, run, fields, name = OPTION_CASES[case]
    expect(v, INVALID, lambda v: v.query.Entropy(E(metric=metric, run=getattr(v, run), layers=[1], **fields),
                                                 timeout=30), name)


def test_a_negative_stitch_seed_is_invalid_not_unavailable(v):
    expect(v, INVALID, lambda v: v.query.Stitch(pb.StitchRequest(run_a=v.tokens, layer_a=1, run_b=v.tokens,
                                                                 layer_b=1, seed=-1), timeout=60), "seed -1")


def test_stitching_into_a_model_without_a_head_is_a_failed_precondition_before_any_task(v):
    tokens = v.client.wait(v.client.submit_capture("bert", "toy", pooling="tokens").job_id).target
    expect(v, grpc.StatusCode.FAILED_PRECONDITION,
           lambda v: v.query.Stitch(pb.StitchRequest(run_a=tokens, layer_a=1, run_b=tokens, layer_b=2), timeout=60),
           "(BertModel) has no head", "task loss")


@pytest.mark.parametrize("metric", [S.CKA, S.COS, S.MUTUAL_KNN, "matrix"])
def test_a_pooled_run_against_a_token_run_says_which_is_which(v, metric):
    tokens = v.client.wait(v.client.submit_capture("bert", "toy", pooling="tokens").job_id).target
    call = ((lambda v: v.query.SubmitCKAMatrix(pb.CKAMatrixRequest(runs=[v.pooled, tokens]), timeout=30))
            if metric == "matrix" else
            (lambda v: v.query.Similarity(S(metric=metric, run_a=tokens, run_b=v.pooled, layers_a=[1]), timeout=30)))
    details = expect(v, INVALID, call, f"run {v.pooled[:12]} is pooled 'mean'", f"run {tokens[:12]} is per token",
                     "--pooling mean", "--pooling tokens")
    assert "tokenised identically" not in details


def test_deleting_a_run_whose_capture_runs_is_a_failed_precondition(v):
    release = threading.Event()
    job, _ = v.server.service.jobs.start("capture", v.pooled, {}, lambda state: release.wait(60))
    try:
        expect(v, grpc.StatusCode.FAILED_PRECONDITION,
               lambda v: v.catalog.DeleteRun(pb.DeleteRunRequest(run=v.pooled), timeout=30),
               f"has a running capture job {job.snapshot.job_id}: cancel it first")
    finally:
        release.set()
    while v.server.service.jobs.live_for(v.pooled) is not None:
        time.sleep(0.05)
    assert v.client.describe(v.pooled).status == "committed"


def test_dime_permutations_are_capped_by_the_setting(v):
    expect(v, EXHAUSTED, lambda v: v.query.Entropy(E(metric=E.DIME, run=v.aug, layers=[1],
                                                     permutations=10**9), timeout=30),
           "permutations 1000000000", "ACTSTORE_MAX_DIME_PERMUTATIONS")


# ---- too few samples ---------------------------------------------------------------------------------
FAILED = grpc.StatusCode.FAILED_PRECONDITION


@pytest.fixture(scope="module")
def few(v):
    """Runs too small for some metrics: bert mean runs of 1, 2 and 3 texts, 3 texts of one label,
    1 text in 2 augmented views, and a gpt2 token run whose prompts are one token each."""
    texts = sentences(3, seed=4)
    datasets = {f"n{n}": {"texts": texts[:n]} for n in (1, 2, 3)}
    datasets["one_class"] = {"texts": texts, "labels": [1, 1, 1]}
    datasets["one_group"] = {"texts": texts[:1], "augment_views": 2}
    for name, fields in datasets.items():
        v.client.register_dataset(name=f"few-{name}", **fields)
    v.client.register_dataset(texts=["dog", "red"], name="few-short")
    jobs = {name: v.client.submit_capture("bert", f"few-{name}", pooling="mean") for name in datasets}
    jobs["short"] = v.client.submit_capture("gpt2", "few-short", pooling="tokens")
    return SimpleNamespace(**{name: v.client.wait(job.job_id).target for name, job in jobs.items()})


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("measure", [m.identifier for m in measures.measures()])  # every registered one
def test_a_measure_of_fewer_than_4_samples_is_invalid_not_internal(v, few, n, measure):
    expect(v, INVALID, lambda v: v.query.Similarity(S(metric=S.MEASURE, run_a=getattr(few, f"n{n}"), measure=measure,
                                                      layers_a=[1]), timeout=30),
           f"needs n >= 4 samples, the runs hold {n}")


def test_minibatch_cka_of_fewer_samples_than_a_batch_says_so(v, few):
    expect(v, INVALID, lambda v: v.query.Similarity(S(metric=S.MINIBATCH_CKA, run_a=few.n3, batch_size=4,
                                                      layers_a=[1]), timeout=30),
           "minibatch CKA needs batches of at least 4 samples and the runs hold 3", "use cka")


@pytest.mark.parametrize("normalization", ["logN", "maxEntropy"])
def test_an_entropy_normalization_by_log_1_is_a_failed_precondition(v, few, normalization):
    expect(v, FAILED, lambda v: v.query.Entropy(E(metric=E.DATASET_ENTROPY, run=few.n1, layers=[1],
                                                  normalization=normalization), timeout=30),
           f"normalization {normalization} divides by log", "n=1", "--normalization raw")
    assert v.client.entropy("dataset_entropy", few.n2, layers=[1], normalization=normalization).values[0] >= 0


@pytest.mark.parametrize(("metric", "preset", "needs"), [
    (E.PROMPT_ENTROPY, "", "1 prompt(s) of 2 or more tokens"),
    (E.CURVATURE, "", "1 prompt(s) of 3 or more tokens"),
    (E.DATASET_ENTROPY, "skean2025", "2 prompt(s) of 2 or more tokens"),
    (E.PROMPT_ENTROPY, "skean2025", "1 prompt(s) of 2 or more tokens"),
    (E.CURVATURE, "skean2025", "1 prompt(s) of 2 or more tokens"),
])
def test_a_prompt_metric_without_long_enough_prompts_is_a_failed_precondition(v, few, metric, preset, needs):
    expect(v, FAILED, lambda v: v.query.Entropy(E(metric=metric, run=few.short, layers=[1], preset=preset),
                                                timeout=30), f"needs at least {needs}", "has 0 of its 2")


def test_lidar_of_one_group_and_nc1_of_one_class_are_failed_preconditions(v, few):
    expect(v, FAILED, lambda v: v.query.Entropy(E(metric=E.LIDAR, run=few.one_group, layers=[1]), timeout=30),
           "lidar needs at least 2 groups", "has 1")
    expect(v, FAILED, lambda v: v.query.NeuralCollapse(pb.NeuralCollapseRequest(run=few.one_class, layers=[1]),
                                                       timeout=30), "NC1 needs at least 2 classes", "hold 1")


# ---- work a request implies ---------------------------------------------------------------------------
def test_cos_histograms_over_the_memory_limit_are_resource_exhausted(v):
    details = expect(v, EXHAUSTED, lambda v: v.query.Similarity(S(metric=S.COS, run_a=v.pooled), timeout=30),
                     "COS histograms of 16 layer pairs", "ACTSTORE_MAX_ACCUMULATOR_BYTES")
    assert " KiB" in details or " MiB" in details
    one = v.query.Similarity(S(metric=S.COS, run_a=v.pooled, layers_a=[1], layers_b=[2]), timeout=60)
    assert list(one.arrays["mean"].shape) == [1, 1]


@pytest.mark.parametrize("field", ["layers_a", "layers_b"])
def test_repeated_layer_indices_are_refused_at_once(v, field):
    started = time.perf_counter()
    expect(v, INVALID, lambda v: v.query.Similarity(S(metric=S.CKA, run_a=v.pooled, **{field: [1] * 8000}),
                                                    timeout=30), "layer 1 is listed twice")
    assert time.perf_counter() - started < 5
    expect(v, INVALID, lambda v: v.query.ResidualNorm(pb.ResidualNormRequest(run=v.pooled, layers=[0, 2, 0]),
                                                      timeout=30), "layer 0 is listed twice")


def test_an_expired_deadline_cancels_the_querys_ray_tasks(v, caplog):
    """A DiME query that would run for minutes, asked with a 3 s deadline: after the deadline the
    server cancels its Ray task, so the CPU it held is free again well before the query would have
    ended. The check reads the cluster's free CPUs, so it starts from an idle cluster (work of
    earlier tests still settling took a CPU during the wait and failed it twice in full runs)."""
    total = ray.cluster_resources().get("CPU", 0)
    _wait_for(lambda: ray.available_resources().get("CPU", 0) >= total, 120)
    assert ray.available_resources().get("CPU", 0) >= total, "the cluster was not idle before the query"
    with caplog.at_level(logging.INFO, logger="actstore.server.dispatch"):
        code, _ = status_of(lambda: v.query.Entropy(E(metric=E.DIME, run=v.aug, layers=[1],
                                                      permutations=SLOW_PERMUTATIONS), timeout=3))
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED
        _wait_for(lambda: ray.available_resources().get("CPU", 0) >= total, 60)
    assert ray.available_resources().get("CPU", 0) >= total, f"a CPU is still held; the server log: {caplog.text}"
    # and the server answers the next query
    assert v.client.describe(v.aug).status == "committed"


def _wait_for(condition, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.2)


# ---- results and messages -----------------------------------------------------------------------------
class _Context:
    """What `_abort` needs of a grpc.ServicerContext: abort raises, as gRPC's does."""

    def abort(self, code, details):
        self.code, self.details = code, details
        raise grpc.RpcError(details)


def test_a_constant_layer_is_named_as_the_cause_of_cka_nan(v):
    """cls pooling's layer 0 is the [CLS] embedding at position 0, the same vector for every sample:
    its CKA is 0/0 in both matrices, and the note says so for the biased one too."""
    cls = v.client.wait(v.client.submit_capture("bert", "toy", pooling="cls").job_id).target
    both = v.client.cka(cls, v.pooled, layers_a=[0, 1], layers_b=[0, 2])
    nan = np.isnan(both.biased)
    assert nan[0].all() and not nan[1].any() and np.isnan(both.debiased[0]).all()
    named = f"run {cls[:12]} layer 0 is constant over the {N} samples (zero variance), so CKA with it is undefined"
    assert any(named in note for note in both.notes), both.notes
    assert not any("HSIC_u(K,K)" in note for note in both.notes), both.notes
    matrix = v.client.cka_matrix([cls])
    assert np.isnan(matrix.biased[0]).all() and any(named in note for note in matrix.notes), matrix.notes


def test_an_internal_error_names_a_correlation_id_and_the_log_keeps_the_traceback(caplog):
    from actstore.server.interceptors import _abort

    context = _Context()
    try:
        raise KeyError("secret-internal-state")
    except KeyError as exc:
        with caplog.at_level(logging.ERROR, logger="actstore.server.interceptors"), pytest.raises(grpc.RpcError):
            _abort(context, exc, "Similarity")
    assert context.code == grpc.StatusCode.INTERNAL
    assert "secret-internal-state" not in context.details and "KeyError" not in context.details
    assert "report it with the server log" in context.details
    incident = context.details.split(", id ")[1].split(":")[0]
    assert len(incident) == 12
    (record,) = [r for r in caplog.records if incident in r.getMessage()]
    assert record.exc_info and "secret-internal-state" in caplog.text
