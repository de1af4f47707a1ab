"""The whole service on a flaky object store: the loopback S3 server behind a fault-injecting proxy
(tests/s3_faults.py: seeded 503 SlowDown, connection resets before the request's body is read, halfway
through the answer and after the server did the request, and delays). register-model, a capture, CKA,
a matrix job, `verify`, a deletion and `gc` all complete and give what a server on the same S3 server
without the proxy gives, bit for bit; the retries are counted (the server's totals and the jobs' last
events). A store that stops answering fails the call UNAVAILABLE naming the store and what was tried,
and a resubmission, once it answers again, completes."""

from __future__ import annotations

import os
import uuid
from contextlib import contextmanager

import boto3
import pytest

from actstore.client import Client
from actstore.errors import Unavailable
from actstore.server.app import start_server
from tests.conftest import make_settings
from tests.factories import sentences
from tests.s3_faults import FaultProxy

pytestmark = pytest.mark.long  # two servers on S3: started first (tests/conftest.py)

RATES = {"503": 0.04, "reset-request": 0.03, "reset-response": 0.03, "reset-after": 0.03, "delay": 0.03}
# a test's budget: many tries, short waits (the defaults suit a real bucket: 10 tries in 2 minutes)
RETRY = {"store_retry_attempts": 12, "store_retry_seconds": 60.0, "store_backoff_seconds": 0.02,
         "store_backoff_max_seconds": 0.2}


def _bucket(endpoint: str) -> str:
    name = f"faults-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=name)
    return f"s3://{name}/team"


@contextmanager
def _server(endpoint: str, bucket: str, data_dir, **settings):
    """A server whose store is reached at `endpoint` (its handle keeps the AWS variables it starts with)."""
    saved = os.environ["AWS_ENDPOINT_URL"]
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    try:
        running = start_server(make_settings(bucket, server_dir=str(data_dir), **{**RETRY, **settings}))
    finally:
        os.environ["AWS_ENDPOINT_URL"] = saved
    try:
        with Client(f"127.0.0.1:{running.port}") as client:
            yield running, client
    finally:
        running.stop()


def _exercise(client: Client, tiny_models) -> dict:
    """What an operator does, and what it gives: every stored byte read back and every answer."""
    client.register_model(tiny_models["bert"], name="bert")
    client.register_model(tiny_models["bert24"], name="bert24")
    client.register_dataset(texts=sentences(40), labels=[i % 3 for i in range(40)], name="toy")
    job = client.submit_capture("bert", "toy", pooling="mean")
    events = list(client.watch(job.job_id))
    assert events[-1].status == "done", events[-1].error
    a = events[-1].target
    b = client.capture("bert24", "toy", pooling="mean").run_key
    doomed = client.capture("bert", "toy", pooling="cls").run_key
    cka = client.cka(a, b)
    matrix = client.cka_matrix([a, b])
    verify = client.submit_verify([a, b])
    verified = list(client.watch(verify.job_id))[-1]
    report = client.verify_report(verify.job_id)
    client.delete_run(doomed)
    gc = client.collect_garbage(older_than="0s", apply=True)
    layers = {run: [client.read_activations(run, layer)[0] for layer in range(4)] for run in (a, b)}
    return {"runs": (a, b), "layers": layers, "cka": cka, "matrix": matrix, "report": report, "gc": gc,
            "messages": [events[-1].message, verified.message]}


def test_the_service_on_a_flaky_store_gives_what_a_clean_one_does(s3_server, tiny_models, tmp_path, ray_cluster):
    with FaultProxy(s3_server, seed=35, rates=RATES) as proxy:
        with _server(proxy.endpoint, _bucket(s3_server), tmp_path / "flaky") as (running, client):
            flaky = _exercise(client, tiny_models)
            counted = running.service.store_faults()
    injected = sum(proxy.injected.values())
    assert all(proxy.injected[kind] for kind in RATES), proxy.injected  # every kind of fault was met
    with _server(s3_server, _bucket(s3_server), tmp_path / "clean") as (running, client):
        clean = _exercise(client, tiny_models)
        assert running.service.store_faults() == {"retried": 0, "gave_up": 0}
    # a fault but a delay fails a try (several may fail the same one: the ranges of one read, the
    # parts of one upload; and a reset can take a pooled connection's next request with it); each
    # try failed is one retry counted, and none was given up
    faults = injected - proxy.injected["delay"]
    assert counted["gave_up"] == 0 and counted["retried"] >= faults // 2, (counted, proxy.injected)
    assert any("object-store call(s) retried while it ran" in message for message in flaky["messages"]), flaky
    assert not any(clean["messages"])
    assert flaky["runs"] == clean["runs"]  # the same content, the same keys
    for run in clean["runs"]:
        for mine, theirs in zip(flaky["layers"][run], clean["layers"][run]):
            assert mine.dtype == theirs.dtype and mine.tobytes() == theirs.tobytes()
    assert flaky["cka"].biased.tobytes() == clean["cka"].biased.tobytes()
    assert flaky["matrix"].biased.tobytes() == clean["matrix"].biased.tobytes()
    assert not flaky["report"].damaged and len(flaky["report"].runs) == 2
    def removed(report) -> list:  # a verify report is a result of its own job: its key differs
        return sorted((i.kind, i.name if "verify" not in i.reason else "verify") for i in report.items)

    assert removed(flaky["gc"]) == removed(clean["gc"]) and len(flaky["gc"].items) == 3


def test_a_store_that_stops_answering_fails_unavailable_naming_it_and_a_resubmission_completes(
        s3_server, tiny_models, tmp_path, ray_cluster):
    with FaultProxy(s3_server, seed=1) as proxy:
        bucket = _bucket(s3_server)
        with _server(proxy.endpoint, bucket, tmp_path / "outage", store_retry_attempts=3,
                     store_retry_seconds=5.0) as (running, client):
            client.register_model(tiny_models["bert"], name="bert")
            client.register_dataset(texts=sentences(24), name="few")
            proxy.outage = True
            with pytest.raises(Unavailable) as failed:  # when the run is created, or by its job
                client.wait(client.submit_capture("bert", "few", pooling="mean").job_id)
            message = str(failed.value)
            assert bucket in message and "3 tries" in message and "503" in message, message
            assert running.service.store_faults()["gave_up"] >= 1
            proxy.outage = False
            run = client.capture("bert", "few", pooling="mean").run_key
            assert client.describe(run).status == "committed"
            assert not client.verify([run]).damaged
