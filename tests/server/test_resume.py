"""A server killed mid-capture: the next start finishes the run, computing only missing shards."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import numpy as np
import pytest

from actstore.client import Client
from actstore.server.app import start_server
from tests.conftest import make_settings
from tests.factories import sentences

pytestmark = pytest.mark.long  # minutes of servers, clusters or venvs: started first (tests/conftest.py)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(store, port, ray_address, server_dir=None) -> subprocess.Popen:
    env = {**os.environ, "RAY_ADDRESS": ray_address, "ACTSTORE_SHARD_ROWS": "8",
           "ACTSTORE_CAPTURE_BATCH_SIZE": "8"}
    if server_dir is not None:
        env["ACTSTORE_SERVER_DIR"] = str(server_dir)
    proc = subprocess.Popen([sys.executable, "-m", "actstore.cli", "serve", "--store", str(store),
                             "--port", str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline().decode()
        if "actstore serving on" in line:
            # keep reading what it prints: a full pipe would block the server (seen as a server that
            # did not stop on SIGTERM within minutes, on a loaded machine that made it log more)
            proc.drain = threading.Thread(target=proc.stdout.read, name="server-output", daemon=True)
            proc.drain.start()
            return proc
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {line}{proc.stdout.read().decode()}")
    raise AssertionError("server did not start within 60 s")


def _stop(proc: subprocess.Popen, sig: int) -> None:
    proc.send_signal(sig)
    proc.wait(180)  # a graceful stop of an S3-backed server took over 60 s with the suite's 3 processes
    proc.drain.join(30)  # the output ends with the process
    proc.stdout.close()


@pytest.fixture(params=["local", "s3"])
def store_url(request, tmp_path):
    """The store a killed server resumes on: a local directory, or a bucket on the loopback S3
    server (the catalog then lives in a server directory of its own)."""
    if request.param == "local":
        return tmp_path / "store", None
    return request.getfixturevalue("s3_bucket"), tmp_path / "server"


def _registered(store, server_dir, tiny_models, texts: list[str]) -> None:
    """bert and `texts` (as 'big') registered on `store` by a server in this process (whose Ray
    workers have the model's imports loaded), stopped again: a server started next opens the store."""
    with _in_process(store, server_dir) as client:
        client.register_model(tiny_models["bert"], name="bert")
        client.register_dataset(texts=texts, name="big")


@contextmanager
def _in_process(store, server_dir, **overrides):
    """A client of a server in this process on `store` (its catalog in `server_dir` when given)."""
    if server_dir is not None:
        overrides["server_dir"] = str(server_dir)
    running = start_server(make_settings(store, **overrides))
    try:
        with Client(f"127.0.0.1:{running.port}") as client:
            yield client
    finally:
        running.stop()


def test_killed_server_resumes_capture_on_restart(store_url, ray_cluster, tiny_models):
    """A server process SIGKILLed with a capture's first shards stored; the next server started on
    the store (here in this process) resumes the same job and computes only the missing shards."""
    (store, server_dir), port = store_url, _free_port()
    _registered(store, server_dir, tiny_models, sentences(400, seed=9))
    server = _serve(store, port, ray_cluster, server_dir)
    try:
        with Client(f"127.0.0.1:{port}") as client:
            job = client.submit_capture("bert", "big")
            for state in client.watch(job.job_id):
                if state.done >= 3:
                    break
    finally:
        _stop(server, signal.SIGKILL)

    with _in_process(store, server_dir, resume_on_start=True) as client:
        partial = client.describe(job.target)
        assert partial.status in ("running", "committed")
        states = list(client.watch(job.job_id))  # the same job id, resumed by the new server
        assert states[-1].status == "done"
        resumed_from = [s.message for s in states if s.message.startswith("resuming")]
        assert resumed_from, f"no resume message in {[s.message for s in states]}"
        stored_before = int(resumed_from[0].split()[1])
        assert 3 <= stored_before < 50, "the shards stored before the kill are not recomputed"
        run = client.describe(job.target)
        assert (run.status, run.recorded_shards, run.num_shards) == ("committed", 50, 50)
        values, ids = client.read_activations(job.target, 2)
        assert values.shape == (400, 16) and len(set(ids)) == 400 and np.isfinite(values).all()


@pytest.mark.slow
def test_a_server_killed_at_random_moments_leaves_a_store_that_finishes_byte_identical(tmp_path, ray_cluster,
                                                                                      tiny_models):
    """Several trials: a capture is submitted, the server is SIGKILLed after a random delay (during
    start-up, shard writes, the commit or after it); each restart must open the store, and the last
    one finishes the run. Every layer then equals a clean capture of the same request, byte for byte."""
    import random

    texts = sentences(240, seed=21)
    rng = random.Random(7)
    store, port = tmp_path / "store", _free_port()
    job_id = None
    for trial in range(5):
        server = _serve(store, port, ray_cluster)
        try:
            with Client(f"127.0.0.1:{port}") as client:
                if trial == 0:
                    client.register_model(tiny_models["bert"], name="bert")
                    client.register_dataset(texts=texts, name="texts")
                    job_id = client.submit_capture("bert", "texts", pooling="mean").job_id
                else:  # the store opened: every run is committed or resumable, never half-recorded
                    for run in client.runs():
                        assert run.status in ("running", "committed"), run
                        assert 0 <= run.recorded_shards <= run.num_shards
            time.sleep(rng.uniform(0.2, 4.0))
        finally:
            _stop(server, signal.SIGKILL)

    server = _serve(store, port, ray_cluster)
    try:
        with Client(f"127.0.0.1:{port}") as client:
            assert client.wait(job_id).status == "done"
            run = client.describe(client.job(job_id).target)
            assert (run.status, run.recorded_shards) == ("committed", run.num_shards)
            killed = [client.read_activations(run.run_key, layer) for layer in range(run.num_layers + 1)]
    finally:
        _stop(server, signal.SIGTERM)

    clean_store, clean_port = tmp_path / "clean", _free_port()
    server = _serve(clean_store, clean_port, ray_cluster)
    try:
        with Client(f"127.0.0.1:{clean_port}") as client:
            client.register_model(tiny_models["bert"], name="bert")
            client.register_dataset(texts=texts, name="texts")
            clean_run = client.capture("bert", "texts", pooling="mean").run_key
            assert clean_run == run.run_key  # same identity: same model, data and options
            for layer, (values, ids) in enumerate(killed):
                clean_values, clean_ids = client.read_activations(clean_run, layer)
                assert ids == clean_ids
                assert values.tobytes() == clean_values.tobytes(), f"layer {layer} differs"
    finally:
        _stop(server, signal.SIGTERM)
