"""The gRPC surface as any client sees it: health checking, reflection, a precise status code for
every malformed request (over a raw channel, not our client), and chunked activation reads."""

from __future__ import annotations

import json
from types import SimpleNamespace

import grpc
import numpy as np
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from actstore._proto.actstore.v1 import actstore_pb2 as pb
from actstore._proto.actstore.v1 import actstore_pb2_grpc as rpc
from actstore.client import Client
from actstore.server.app import start_server
from tests.conftest import make_settings
from tests.factories import sentences

N = 40
CHUNK_BYTES = 256  # 8 rows of a 16-wide float16 layer, 4 of float32: forces several messages
OUR_SERVICES = {"actstore.v1.Catalog", "actstore.v1.Capture", "actstore.v1.Query"}


@pytest.fixture(scope="module")
def surface(tmp_path_factory, ray_cluster, tiny_models):
    root = tmp_path_factory.mktemp("surface")
    server = start_server(make_settings(root / "store", read_chunk_bytes=CHUNK_BYTES))
    client = Client(f"127.0.0.1:{server.port}")
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        client.register_model(tiny_models["bert"], name="bert")
        client.register_dataset(texts=sentences(N, seed=5), labels=[i % 3 for i in range(N)], name="toy")
        run = client.capture("bert", "toy", pooling="mean").run_key
        not_a_model = root / "not-a-model"
        not_a_model.mkdir()
        (not_a_model / "config.json").write_text("{this is not json")
        yield SimpleNamespace(server=server, client=client, channel=channel, run=run, root=root,
                              not_a_model=not_a_model, catalog=rpc.CatalogStub(channel),
                              capture=rpc.CaptureStub(channel), query=rpc.QueryStub(channel))
    finally:
        channel.close()
        client.close()
        server.stop()


def status_of(call) -> tuple[grpc.StatusCode, str]:
    try:
        response = call()
        if hasattr(response, "__next__"):
            list(response)  # a server stream reports its status while it is read
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


# ---- health and reflection ----------------------------------------------------------------------
def test_health_serving_for_the_server_and_each_service(surface):
    stub = health_pb2_grpc.HealthStub(surface.channel)
    for service in ["", "actstore.v1.Query", "actstore.v1.Catalog", "actstore.v1.Capture"]:
        answer = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING, service
    code, _ = status_of(lambda: stub.Check(health_pb2.HealthCheckRequest(service="actstore.v1.Nope"), timeout=5))
    assert code == grpc.StatusCode.NOT_FOUND


def _reflect(channel, request: reflection_pb2.ServerReflectionRequest) -> reflection_pb2.ServerReflectionResponse:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    (answer,) = list(stub.ServerReflectionInfo(iter([request]), timeout=5))
    return answer


def test_reflection_lists_and_describes_our_services(surface):
    answer = _reflect(surface.channel, reflection_pb2.ServerReflectionRequest(list_services=""))
    names = {s.name for s in answer.list_services_response.service}
    assert OUR_SERVICES <= names
    assert "grpc.health.v1.Health" in names

    # a generic tool (grpcurl) can fetch the schema of a service by its name
    answer = _reflect(surface.channel, reflection_pb2.ServerReflectionRequest(
        file_containing_symbol="actstore.v1.Query"))
    files = [descriptor_pb2.FileDescriptorProto.FromString(raw)
             for raw in answer.file_descriptor_response.file_descriptor_proto]
    ours = next(f for f in files if f.package == "actstore.v1")
    methods = {s.name: {m.name for m in s.method} for s in ours.service}
    assert {"Similarity", "ReadActivations"} <= methods["Query"]
    assert {"RegisterModel", "RegisterDataset", "DescribeRun", "DeleteRun"} <= methods["Catalog"]
    assert {"SubmitCapture", "WatchJob", "CancelJob"} <= methods["Capture"]


# ---- malformed requests -------------------------------------------------------------------------
INVALID, NOT_FOUND = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND

MALFORMED = {
    # Query
    "similarity-metric-unspecified": (INVALID, lambda s: s.query.Similarity(pb.SimilarityRequest(run_a=s.run))),
    "similarity-metric-undefined-enum-value": (
        INVALID, lambda s: s.query.Similarity(pb.SimilarityRequest(metric=7, run_a=s.run))),
    "similarity-layer-out-of-range": (INVALID, lambda s: s.query.Similarity(
        pb.SimilarityRequest(metric=pb.SimilarityRequest.CKA, run_a=s.run, layers_a=[99]))),
    "similarity-negative-layer": (INVALID, lambda s: s.query.Similarity(
        pb.SimilarityRequest(metric=pb.SimilarityRequest.CKA, run_a=s.run, layers_b=[-1]))),
    "similarity-bad-center": (INVALID, lambda s: s.query.Similarity(
        pb.SimilarityRequest(metric=pb.SimilarityRequest.COS, run_a=s.run, center="median"))),
    "similarity-unknown-run": (NOT_FOUND, lambda s: s.query.Similarity(
        pb.SimilarityRequest(metric=pb.SimilarityRequest.CKA, run_a=s.run, run_b="ffffffffffffffff"))),
    "read-start-after-stop": (INVALID, lambda s: s.query.ReadActivations(
        pb.ReadActivationsRequest(run=s.run, layer=1, start=5, stop=2))),
    "read-negative-start": (INVALID, lambda s: s.query.ReadActivations(
        pb.ReadActivationsRequest(run=s.run, layer=1, start=-3))),
    "read-stop-past-end": (INVALID, lambda s: s.query.ReadActivations(
        pb.ReadActivationsRequest(run=s.run, layer=1, stop=N + 1))),
    "read-layer-out-of-range": (INVALID, lambda s: s.query.ReadActivations(
        pb.ReadActivationsRequest(run=s.run, layer=4))),
    "read-unknown-run": (NOT_FOUND, lambda s: s.query.ReadActivations(
        pb.ReadActivationsRequest(run="0123456789abcdef", layer=0))),
    # Catalog
    "describe-unknown-run": (NOT_FOUND, lambda s: s.catalog.DescribeRun(pb.DescribeRunRequest(run="0123456789abcdef"))),
    "describe-short-prefix": (NOT_FOUND, lambda s: s.catalog.DescribeRun(pb.DescribeRunRequest(run=s.run[:4]))),
    "describe-like-wildcard-percent": (
        NOT_FOUND, lambda s: s.catalog.DescribeRun(pb.DescribeRunRequest(run="%%%%%%%%"))),
    "describe-like-wildcard-underscore": (
        NOT_FOUND, lambda s: s.catalog.DescribeRun(pb.DescribeRunRequest(run="________"))),
    "delete-unknown-run": (NOT_FOUND, lambda s: s.catalog.DeleteRun(pb.DeleteRunRequest(run="0123456789abcdef"))),
    "list-runs-unknown-model": (NOT_FOUND, lambda s: s.catalog.ListRuns(pb.ListRunsRequest(model="no-such-model"))),
    "register-dataset-no-source": (INVALID, lambda s: s.catalog.RegisterDataset(pb.RegisterDatasetRequest())),
    "register-dataset-empty-texts": (INVALID, lambda s: s.catalog.RegisterDataset(
        pb.RegisterDatasetRequest(texts=pb.TextList()))),
    "register-dataset-label-count": (INVALID, lambda s: s.catalog.RegisterDataset(
        pb.RegisterDatasetRequest(texts=pb.TextList(texts=["the cat", "a dog"], labels=[1])))),
    "register-dataset-duplicate-ids": (INVALID, lambda s: s.catalog.RegisterDataset(
        pb.RegisterDatasetRequest(texts=pb.TextList(texts=["the cat", "a dog"], sample_ids=["x", "x"])))),
    "register-dataset-bad-augmentation": (INVALID, lambda s: s.catalog.RegisterDataset(pb.RegisterDatasetRequest(
        texts=pb.TextList(texts=["the cat sat", "a dog ran"]), augment_views=2, augment_method="shuffle"))),
    "register-dataset-missing-file": (NOT_FOUND, lambda s: s.catalog.RegisterDataset(
        pb.RegisterDatasetRequest(path="/nonexistent/data.csv"))),
    "register-dataset-unknown-builtin": (NOT_FOUND, lambda s: s.catalog.RegisterDataset(
        pb.RegisterDatasetRequest(builtin="no-such-dataset"))),
    "register-model-no-source": (INVALID, lambda s: s.catalog.RegisterModel(pb.RegisterModelRequest())),
    "register-model-not-a-model": (INVALID, lambda s: s.catalog.RegisterModel(
        pb.RegisterModelRequest(path=str(s.not_a_model)))),
    "register-model-missing-folder": (NOT_FOUND, lambda s: s.catalog.RegisterModel(
        pb.RegisterModelRequest(path="/nonexistent/model"))),
    "register-model-unknown-builtin": (NOT_FOUND, lambda s: s.catalog.RegisterModel(
        pb.RegisterModelRequest(builtin="no-such-model"))),
    # Capture
    "capture-unknown-model": (NOT_FOUND, lambda s: s.capture.SubmitCapture(
        pb.CaptureRequest(model="no-such-model", dataset="toy"))),
    "capture-unknown-dataset": (NOT_FOUND, lambda s: s.capture.SubmitCapture(
        pb.CaptureRequest(model="bert", dataset="no-such-dataset"))),
    "capture-bad-pooling": (INVALID, lambda s: s.capture.SubmitCapture(
        pb.CaptureRequest(model="bert", dataset="toy", pooling="max"))),
    "capture-bad-dtype": (INVALID, lambda s: s.capture.SubmitCapture(
        pb.CaptureRequest(model="bert", dataset="toy", dtype="int4"))),
    "capture-negative-max-len": (INVALID, lambda s: s.capture.SubmitCapture(
        pb.CaptureRequest(model="bert", dataset="toy", max_len=-5))),
    "get-unknown-job": (NOT_FOUND, lambda s: s.capture.GetJob(pb.GetJobRequest(job_id="no-such-job"))),
    "cancel-unknown-job": (NOT_FOUND, lambda s: s.capture.CancelJob(pb.CancelJobRequest(job_id="no-such-job"))),
    "watch-unknown-job": (NOT_FOUND, lambda s: s.capture.WatchJob(pb.WatchJobRequest(job_id="no-such-job"))),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_request_gets_a_specific_status(surface, case):
    expected, call = MALFORMED[case]
    code, details = status_of(lambda: call(surface))
    assert code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), f"{case}: {code.name}: {details}"
    assert code == expected, f"{case}: expected {expected.name}, got {code.name} {details!r}"
    assert len(details) > 10, f"{case}: the status carries no explanation"


UNDECODABLE = {
    "random bytes": bytes(range(256)) * 4,
    "truncated field": b"\x0a\x40abc",  # field 1, length 64, 3 bytes follow
    "invalid utf-8": b"\x0a\x02\xff\xfe",  # field 1 (a string) holding invalid UTF-8
    "overlong varint": b"\x10" + b"\xff" * 11,
}


# field 1 of DescribeRun and ReadActivations is the run (a string); of Similarity the metric (a varint)
UNDECODABLE_CALLS = [(path, payload) for path in ("/actstore.v1.Catalog/DescribeRun",
                                                  "/actstore.v1.Query/ReadActivations")
                     for payload in UNDECODABLE] + [("/actstore.v1.Query/Similarity", payload)
                                                    for payload in UNDECODABLE if payload != "invalid utf-8"]


@pytest.mark.parametrize(("path", "payload"), UNDECODABLE_CALLS)
def test_undecodable_request_bytes_are_invalid_argument(surface, path, payload):
    call = (surface.channel.unary_stream if path.endswith("ReadActivations") else surface.channel.unary_unary)(
        path, request_serializer=lambda raw: raw, response_deserializer=lambda raw: raw)
    code, details = status_of(lambda: call(UNDECODABLE[payload], timeout=30))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert "could not be parsed" in details and "Traceback" not in details


def test_server_still_answers_after_the_errors(surface):
    stub = health_pb2_grpc.HealthStub(surface.channel)
    assert stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status == \
        health_pb2.HealthCheckResponse.SERVING
    assert {m.aliases[0] for m in surface.catalog.ListModels(pb.ListModelsRequest(), timeout=10).models} >= {"bert"}
    run = surface.catalog.DescribeRun(pb.DescribeRunRequest(run=surface.run[:10]), timeout=10)
    assert (run.run_key, run.status, run.n) == (surface.run, "committed", N)
    answer = surface.query.Similarity(pb.SimilarityRequest(metric=pb.SimilarityRequest.CKA, run_a=surface.run,
                                                           layers_a=[1], layers_b=[1]), timeout=60)
    assert answer.arrays["biased"].shape == [1, 1]


# ---- chunked reads ------------------------------------------------------------------------------
def _decode(message: pb.NDArray) -> np.ndarray:
    """Independent of actstore.wire: little-endian C-order bytes."""
    dtype = np.dtype(message.dtype).newbyteorder("<")
    return np.frombuffer(message.data, dtype=dtype).reshape(tuple(message.shape))


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_large_read_arrives_in_bounded_messages_and_reassembles(surface, dtype):
    run = surface.client.capture("bert", "toy", pooling="mean", dtype=dtype).run_key
    layer = 2
    chunks = list(surface.query.ReadActivations(pb.ReadActivationsRequest(run=run, layer=layer), timeout=60))
    assert len(chunks) >= 3, f"{len(chunks)} message(s) for {N} rows with read_chunk_bytes={CHUNK_BYTES}"
    parts = [_decode(c.values) for c in chunks]
    assert all(p.dtype == np.dtype(dtype) and p.ndim == 2 and p.shape[1] == 16 for p in parts)
    assert all(p.nbytes <= CHUNK_BYTES for p in parts), [p.nbytes for p in parts]
    offsets = np.cumsum([0] + [len(p) for p in parts])
    assert [c.start for c in chunks] == offsets[:-1].tolist()  # contiguous, in order
    assert [len(c.sample_ids) for c in chunks] == [len(p) for p in parts]

    whole = np.concatenate(parts)
    ids = [i for c in chunks for i in c.sample_ids]
    one_go = surface.server.service.arrays.read_layers(run, [layer], 0, N)[0]  # the stored array itself
    assert whole.shape == (N, 16)
    np.testing.assert_array_equal(whole, one_go)
    assert ids == surface.server.service.arrays.sample_ids(run) and len(set(ids)) == N

    # the client reassembles the same; a sub-range is the same slice, also split across messages
    values, client_ids = surface.client.read_activations(run, layer)
    np.testing.assert_array_equal(values, whole)
    assert client_ids == ids
    sub = list(surface.query.ReadActivations(pb.ReadActivationsRequest(run=run, layer=layer, start=5, stop=23)))
    assert len(sub) >= 2 and sub[0].start == 5
    np.testing.assert_array_equal(np.concatenate([_decode(c.values) for c in sub]), whole[5:23])
    assert [i for c in sub for i in c.sample_ids] == ids[5:23]


# ---- explicit zeros -----------------------------------------------------------------------------
# The numeric options whose 0 is no valid value are `optional` fields: a raw caller's explicit 0 is
# refused with the option's own message (as the CLI and the client refuse it), and an unset field
# still means the default (proto3 alone cannot tell them apart: 0 came back as the default).
def _stats(s, **fields):
    from actstore._proto.actstore.v1 import diagnostics_pb2 as dpb
    from actstore._proto.actstore.v1 import diagnostics_pb2_grpc as drpc

    features = {"outlier_sigmas": fields.pop("outlier_sigmas")} if "outlier_sigmas" in fields else {}
    query = pb.SimilarityRequest(metric=pb.SimilarityRequest.CKA, run_a=s.run)
    return drpc.DiagnosticsStub(s.channel).SimilarityStats(dpb.SimilarityStatsRequest(
        query=query, bootstrap=20, features=dpb.FeatureOptions(**features), **fields))


def _outliers(s, **fields):
    from actstore._proto.actstore.v1 import diagnostics_pb2 as dpb
    from actstore._proto.actstore.v1 import diagnostics_pb2_grpc as drpc

    return drpc.DiagnosticsStub(s.channel).Outliers(dpb.OutliersRequest(run=s.run, **fields))


def _measure(s, measure, **fields):
    return s.query.Similarity(pb.SimilarityRequest(metric=pb.SimilarityRequest.MEASURE, run_a=s.run,
                                                   measure=measure, **fields))


def _entropy(s, metric, **fields):
    return s.query.Entropy(pb.EntropyRequest(metric=pb.EntropyRequest.Metric.Value(metric), run=s.run, **fields))


EXPLICIT_ZERO = {
    "capture max_len": lambda s: s.capture.SubmitCapture(pb.CaptureRequest(model="bert", dataset="toy", max_len=0)),
    "register-dataset limit": lambda s: s.catalog.RegisterDataset(
        pb.RegisterDatasetRequest(builtin="rotten-tomatoes", limit=0)),
    "mutual_knn k": lambda s: s.query.Similarity(
        pb.SimilarityRequest(metric=pb.SimilarityRequest.MUTUAL_KNN, run_a=s.run, k=0)),
    "minibatch_cka batch_size": lambda s: s.query.Similarity(
        pb.SimilarityRequest(metric=pb.SimilarityRequest.MINIBATCH_CKA, run_a=s.run, batch_size=0)),
    "measure sigma_fraction": lambda s: _measure(s, "cka-kernel=(rbf-sigma={sigma})-hsic=gretton-score",
                                                 sigma_fraction=0),
    "measure k": lambda s: _measure(s, "mutual_knn-topk={topk}", k=0),
    "entropy alpha": lambda s: _entropy(s, "DATASET_ENTROPY", alpha=0),
    "dime permutations": lambda s: _entropy(s, "DIME", permutations=0),
    "infonce temperature": lambda s: _entropy(s, "INFONCE", temperature=0),
    "stitch test_fraction": lambda s: s.query.Stitch(pb.StitchRequest(run_a=s.run, run_b=s.run, test_fraction=0)),
    "train steps": lambda s: s.capture.SubmitTrain(pb.TrainRequest(recipe="minilm-rt", method="standard", steps=0)),
    "gc max_bytes": lambda s: rpc.HousekeepingStub(s.channel).CollectGarbage(pb.CollectGarbageRequest(max_bytes=0)),
    "cka-stats ci": lambda s: _stats(s, ci=0),
    "cka-stats bootstrap_groups": lambda s: _stats(s, bootstrap_method="grouped", bootstrap_groups=0),
    "cka-stats outlier_sigmas": lambda s: _stats(s, outlier_sigmas=0),
    "outliers top_k": lambda s: _outliers(s, top_k=0),
    "outliers outlier_sigmas": lambda s: _outliers(s, outlier_sigmas=0),
}


@pytest.mark.parametrize("case", list(EXPLICIT_ZERO))
def test_an_explicit_zero_is_refused_not_read_as_the_default(surface, case):
    code, details = status_of(lambda: EXPLICIT_ZERO[case](surface))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, f"{case}: {code.name} {details!r}"
    assert case.split()[-1] in details, details  # the message names the option


def test_an_explicit_zero_sql_limit_is_refused(surface):
    from actstore._proto.actstore.v1 import readers_pb2, readers_pb2_grpc

    sql = readers_pb2_grpc.ReadersStub(surface.channel).Sql
    code, details = status_of(lambda: sql(readers_pb2.SqlRequest(query="SELECT 1", limit=0)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "limit" in details, (code, details)
    assert sql(readers_pb2.SqlRequest(query="SELECT 1")).columns  # unset: the server's limit


def test_an_unset_option_still_means_its_default(surface):
    answer = surface.query.Similarity(pb.SimilarityRequest(metric=pb.SimilarityRequest.MUTUAL_KNN, run_a=surface.run,
                                                           layers_a=[1], layers_b=[2]))
    assert json.loads(answer.provenance.options_json)["k"] == 10
