"""Property: no request, valid or not, ever gets INTERNAL or UNKNOWN, and the server still answers.

Hypothesis generates requests for every RPC of the four services (field values in and out of
range, NaN and infinities, huge ints, odd text, random bytes instead of a message) and sends them
over a raw gRPC channel to a real server. A quick sample runs by default; the slow variant sends
more than 10,000.
"""

from __future__ import annotations

from types import SimpleNamespace

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actstore._proto.actstore.v1 import actstore_pb2 as pb
from actstore._proto.actstore.v1 import readers_pb2
from actstore.client import Client
from actstore.server.app import start_server
from tests.conftest import make_settings
from tests.factories import sentences

N = 16
RESERVED = {"bert", "toy", "aug"}  # aliases the generated requests must not re-point
INT64 = st.integers(-(2**63), 2**63 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)
SMALL = st.integers(-3, 12)
FLOATS = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, 0.1, 0.5, 1.0, 2.0])
TEXT = st.text(max_size=40)


@pytest.fixture(scope="module")
def world(tmp_path_factory, ray_cluster, tiny_models):
    root = tmp_path_factory.mktemp("properties")
    server = start_server(make_settings(root / "store", max_dime_permutations=50, max_augment_views=4))
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        with Client(f"127.0.0.1:{server.port}") as client:
            client.register_model(tiny_models["bert"], name="bert")
            texts = sentences(N, seed=9)
            client.register_dataset(texts=texts, labels=[i % 2 for i in range(N)], name="toy")
            client.register_dataset(texts=texts[:8], name="aug", augment_views=2)
            pooled = client.capture("bert", "toy", pooling="mean").run_key
            aug = client.capture("bert", "aug", pooling="mean").run_key
            yield SimpleNamespace(channel=channel, runs=[pooled, aug], root=root)
    finally:
        channel.close()
        server.stop()


def requests(world) -> st.SearchStrategy[tuple[str, bytes]]:
    """(method path, serialized request) for every RPC, or random bytes for any of them."""
    runs = st.sampled_from(world.runs) | TEXT | st.sampled_from([r[:8] for r in world.runs])
    layers = st.lists(SMALL, max_size=6) | st.lists(INT32, max_size=3)
    alias = TEXT.filter(lambda s: s not in RESERVED)
    path = st.sampled_from([str(world.root / "missing.csv"), "/", "/etc", "\x00", "a" * 300]) | TEXT
    texts = st.builds(pb.TextList, texts=st.lists(TEXT, max_size=4), labels=st.lists(INT64, max_size=4),
                      sample_ids=st.lists(TEXT, max_size=4), label_names=st.lists(TEXT, max_size=3))
    # a delete or a capture must not touch the runs the other requests read
    sites = st.lists(TEXT | st.sampled_from(["attn_out", "mlp_out", "*", "encoder.layer.*", "encoder.layer.*.output",
                                             "encoder.layer.*.intermediate.dense", ",", "resid_post,*"]), max_size=3)
    not_a_run = TEXT.filter(lambda s: not any(r.startswith(s) for r in world.runs))
    messages = {
        "Catalog/ListModels": st.just(pb.ListModelsRequest()),
        "Catalog/ListDatasets": st.just(pb.ListDatasetsRequest()),
        "Catalog/ListRuns": st.builds(pb.ListRunsRequest, model=TEXT | st.just("bert"), dataset=TEXT, status=TEXT,
                                      site=TEXT),
        "Catalog/DescribeRun": st.builds(pb.DescribeRunRequest, run=runs),
        "Catalog/RegisterModel": st.builds(pb.RegisterModelRequest, path=path, name=alias)
        | st.builds(pb.RegisterModelRequest, builtin=TEXT, name=alias),
        "Catalog/RegisterDataset": st.builds(pb.RegisterDatasetRequest, texts=texts, name=alias, limit=INT64,
                                             seed=INT64, augment_views=INT32 | SMALL, augment_method=TEXT)
        | st.builds(pb.RegisterDatasetRequest, path=path, name=alias, text_column=TEXT, label_column=TEXT)
        | st.builds(pb.RegisterDatasetRequest, builtin=TEXT, split=TEXT, limit=INT64),
        "Catalog/DeleteRun": st.builds(pb.DeleteRunRequest, run=not_a_run),
        "Capture/SubmitCapture": st.builds(pb.CaptureRequest, model=st.just("bert") | TEXT, dataset=not_a_run,
                                           pooling=TEXT, dtype=TEXT, max_len=INT32, sites=sites),
        "Planning/PlanCapture": st.builds(pb.CaptureRequest, model=st.just("bert") | TEXT,
                                          dataset=st.just("toy") | TEXT, pooling=TEXT | st.just("mean"), dtype=TEXT,
                                          max_len=INT32, sites=sites),
        "Planning/PlanCKAMatrix": st.builds(pb.CKAMatrixRequest, runs=st.lists(runs, max_size=3)),
        "Capture/WatchJob": st.builds(pb.WatchJobRequest, job_id=TEXT),
        "Capture/CancelJob": st.builds(pb.CancelJobRequest, job_id=TEXT),
        "Capture/GetJob": st.builds(pb.GetJobRequest, job_id=TEXT),
        "Capture/SubmitTrain": st.builds(pb.TrainRequest, recipe=TEXT, method=TEXT, seed=INT64, steps=INT64),
        "Capture/ListJobs": st.builds(pb.ListJobsRequest, status=TEXT),
        "Query/Similarity": st.builds(pb.SimilarityRequest, metric=st.integers(-1, 6), run_a=runs,
                                      run_b=st.just("") | runs, layers_a=layers, layers_b=layers, center=TEXT,
                                      batch_size=INT32 | SMALL, remainder=TEXT, k=INT32 | SMALL),
        "Query/Entropy": st.builds(pb.EntropyRequest, metric=st.integers(-1, 9), run=runs, layers=layers,
                                   alpha=FLOATS, normalization=TEXT, convention=TEXT, permutations=INT32 | SMALL,
                                   seed=INT64, temperature=FLOATS),
        "Query/ResidualNorm": st.builds(pb.ResidualNormRequest, run=runs, layers=layers),
        "Query/Stitch": st.builds(pb.StitchRequest, run_a=runs, layer_a=SMALL, run_b=runs, layer_b=SMALL,
                                  test_fraction=FLOATS, seed=INT64),
        "Query/SubmitCKAMatrix": st.builds(pb.CKAMatrixRequest, runs=st.lists(runs, max_size=3)),
        "Query/Lens": st.builds(pb.LensRequest, run=runs, epsilon=FLOATS, taus=st.lists(FLOATS, max_size=4),
                                heads=TEXT),
        "Query/NeuralCollapse": st.builds(pb.NeuralCollapseRequest, run=runs, layers=layers, rcond=FLOATS),
        "Query/GetResult": st.builds(pb.GetResultRequest, result_key=TEXT),
        "Query/ReadActivations": st.builds(pb.ReadActivationsRequest, run=runs, layer=SMALL, start=INT64 | SMALL,
                                           stop=INT64 | SMALL),
        "Readers/ReadBatches": st.builds(readers_pb2.BatchesRequest, run=runs, layers=layers, batch_size=INT32 | SMALL,
                                         shuffle=st.booleans(), seed=INT64, epoch=INT64 | SMALL, rank=INT32 | SMALL,
                                         world_size=INT32 | SMALL, buffer_shards=INT32 | SMALL,
                                         drop_last=st.booleans()),
        "Readers/LocateRun": st.builds(readers_pb2.LocateRunRequest, run=runs),
        "Readers/Sql": st.builds(readers_pb2.SqlRequest, query=TEXT | st.sampled_from(
            ["SELECT * FROM runs", "SELECT ?", "SELECT $1", "DROP TABLE runs", "SELECT * FROM '/etc/passwd'"]),
            limit=INT64 | SMALL),
    }
    typed = st.one_of(*[message.map(lambda m, name=name: (name, m.SerializeToString()))
                        for name, message in messages.items()])
    raw = st.tuples(st.sampled_from(list(messages)), st.binary(max_size=64))
    return typed | raw


STREAMS = {"Capture/WatchJob", "Query/ReadActivations", "Readers/ReadBatches"}


def send(world, method: str, payload: bytes) -> tuple[grpc.StatusCode, str]:
    make = world.channel.unary_stream if method in STREAMS else world.channel.unary_unary
    call = make(f"/actstore.v1.{method}", request_serializer=lambda raw: raw, response_deserializer=lambda raw: raw)
    try:
        answer = call(payload, timeout=60)
        if method in STREAMS:
            list(answer)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def check_property(world, request: tuple[str, bytes]) -> None:
    method, payload = request
    code, details = send(world, method, payload)
    assert code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), (method, payload, details)
    assert "Traceback" not in details


def assert_alive(world) -> None:
    health = health_pb2_grpc.HealthStub(world.channel)
    assert health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status == \
        health_pb2.HealthCheckResponse.SERVING
    code, _ = send(world, "Catalog/ListModels", b"")
    assert code == grpc.StatusCode.OK


def _run(world, examples: int) -> None:
    @settings(max_examples=examples, deadline=None, database=None, derandomize=examples < 1000,
              suppress_health_check=list(HealthCheck))
    @given(request=requests(world))
    def prop(request):
        check_property(world, request)

    prop()
    assert_alive(world)


def test_no_request_gets_internal_and_the_server_lives_quick_sample(world):
    _run(world, 1000)


@pytest.mark.slow
def test_no_request_gets_internal_and_the_server_lives_10000(world):
    _run(world, 10_000)
