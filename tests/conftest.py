"""Shared fixtures: one real local Ray cluster per test session, real servers on loopback with
real DuckDB and Zarr under tmp paths, and tiny models built from transformers configs."""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Ray starts its worker processes at niceness 15, so they yield to GCS and the raylet. The suite's
# pytest processes run at 0 on the same two cores: a busy neighbour left a session's Ray workers
# ~3% of a core, and a capture or a model load of a few seconds took minutes (servers that did not
# answer or stop in time, seen as flaky timeouts). Every Ray process of a test session (the
# clusters started here, and the servers and nodes started as subprocesses, which inherit this)
# competes on equal terms instead.
os.environ.setdefault("RAY_worker_niceness", "0")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from actstore.workers.cluster import QUIET_LOCAL_CLUSTER_ENV  # noqa: E402
from tests.factories import save_tiny_model  # noqa: E402

# What `ensure_ray` gives the local cluster it starts, given here too to the clusters the tests start
# themselves (ray.cluster_utils nodes, scripts run as subprocesses), which inherit this environment.
for _name, _value in QUIET_LOCAL_CLUSTER_ENV.items():
    os.environ.setdefault(_name, _value)


def pytest_collection_modifyitems(config, items):
    """The files marked `long` (minutes of servers, clusters or venvs each) first, the rest in
    collection order: `make test` hands whole files to its processes in this order
    (`--dist loadfile --no-loadscope-reorder`), so a long file never starts last and leaves the
    others idle while it runs. A test that uses the session's Ray cluster (through any fixture) is
    marked `ray`, so `make test-quick` (-m "not slow and not long and not ray") runs none of them."""
    for item in items:
        if "ray_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)
    items.sort(key=lambda item: item.get_closest_marker("long") is None)  # stable: order kept within


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    from actstore.workers.cluster import ensure_ray

    ensure_ray()
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """Saved HF folders: bert (16 wide), bert24 (24 wide), gpt2, llama, vit."""
    root = tmp_path_factory.mktemp("tiny-models")
    folders = {name: save_tiny_model(name, root / name) for name in ("bert", "gpt2", "llama", "vit")}
    folders["bert24"] = save_tiny_model("bert", root / "bert24", hidden_size=24, seed=1)
    return folders


def make_settings(store: Path, **overrides):
    from actstore.config import Settings

    return Settings(**{"store": str(store), "port": 0, "shard_rows": 8, "capture_batch_size": 8,
                       "resume_on_start": False, **overrides})


def serving(store: Path, **overrides):
    """A real server of `store` on loopback (`make_settings` with ``overrides``), stopped after."""
    from actstore.server.app import start_server

    running = start_server(make_settings(store, **overrides))
    yield running
    running.stop()


def _connect(server):
    from actstore.client import Client

    with Client(f"127.0.0.1:{server.port}") as c:
        yield c


@pytest.fixture
def server(tmp_path, ray_cluster):
    yield from serving(tmp_path / "store")


@pytest.fixture
def client(server):
    yield from _connect(server)


@pytest.fixture(scope="module")
def module_server(tmp_path_factory, ray_cluster):
    """One server for a whole test module, for read-only query tests over shared runs."""
    yield from serving(tmp_path_factory.mktemp("store"))


@pytest.fixture(scope="module")
def module_client(module_server):
    yield from _connect(module_server)


@pytest.fixture(scope="session")
def s3_server():
    """A real S3-protocol server process on loopback (moto's server mode, as zarr-python, s3fs and
    obstore test against), with the AWS variables a user would set pointing at it."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(endpoint + "/moto-api/", timeout=1)
            break
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                raise RuntimeError("moto's S3 server did not start") from None
            time.sleep(0.2)
    variables = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_REGION": "us-east-1"}
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    yield endpoint
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    process.terminate()
    process.wait(timeout=10)


@pytest.fixture
def s3_bucket(s3_server, request):
    """A fresh, empty bucket on the loopback S3 server; its s3:// URL with a prefix."""
    import uuid

    import boto3

    name = f"test-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket=name)
    return f"s3://{name}/actstore"
