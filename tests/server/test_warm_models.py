"""ACTSTORE_WARM_MODELS: a registered model's capture replicas start with the server and stay warm
past the idle time that releases the others; a name that is not registered is logged, not fatal."""

from __future__ import annotations

import logging
import time

from actstore.client import Client
from actstore.server.app import start_server
from tests.conftest import make_settings
from tests.factories import sentences


def _pooled(server) -> set[str]:
    pool = server.service.capture_pool
    with pool._lock:
        return set(pool._pool)


def test_warm_models_start_with_the_server_and_outlive_the_idle_time(tmp_path, ray_cluster, tiny_models, caplog):
    store = tmp_path / "store"
    first = start_server(make_settings(store))
    try:
        with Client(f"127.0.0.1:{first.port}") as c:
            warm = c.register_model(tiny_models["bert"], name="bert").digest
            other = c.register_model(tiny_models["gpt2"], name="gpt2").digest
            c.register_dataset(texts=sentences(8), name="toy")
    finally:
        first.stop()

    with caplog.at_level(logging.WARNING, logger="actstore.server.service"):
        server = start_server(make_settings(store, warm_models=["bert", "no-such-model"], actor_idle_seconds=1.0))
    try:
        deadline = time.monotonic() + 120
        while warm not in _pooled(server) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert warm in _pooled(server), "the warm model's replicas did not start"
        with Client(f"127.0.0.1:{server.port}") as c:
            c.capture("gpt2", "toy", pooling="mean")  # another model's replicas, released when idle
            c.capture("bert", "toy", pooling="mean")
        used = time.monotonic()
        # the reaper wakes every second here (idle 1 s): the other model's replicas go, and the warm
        # one's are still there once they have idled three times the idle time
        deadline = used + 60
        while other in _pooled(server) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(max(0.0, used + 3 - time.monotonic()))
        assert _pooled(server) == {warm}, (other[:12], _pooled(server))
    finally:
        server.stop()
    assert any("'no-such-model' is not warmed" in record.getMessage() for record in caplog.records)
