"""Per-principal limits with auth on: requests per second and running jobs, each refused as
RESOURCE_EXHAUSTED with the limit and when to retry; the single-user mode (no auth) has neither."""

from __future__ import annotations

import threading
import time

import pytest

from actstore.client import Client
from actstore.config import Settings
from actstore.errors import ResourceExhausted
from actstore.server.app import start_server
from actstore.server.auth import create_token
from actstore.server.jobs import JobManager
from actstore.server.limits import MAX_BUCKETS, RequestLimiter
from actstore.store.catalog import Catalog
from tests.conftest import make_settings


@pytest.fixture(autouse=True)
def _no_ambient_token(monkeypatch):
    monkeypatch.delenv("ACTSTORE_TOKEN", raising=False)


@pytest.fixture
def limited_server(tmp_path, ray_cluster):
    running = start_server(make_settings(tmp_path / "store", auth=True, principal_requests_per_second=2,
                                         principal_request_burst=3))
    yield running
    running.stop()


def test_request_rate_per_principal(limited_server):
    catalog = limited_server.service.catalog
    address = f"127.0.0.1:{limited_server.port}"
    with Client(address, create_token(catalog, "ann", "reader")) as ann, \
            Client(address, create_token(catalog, "bob", "reader")) as bob:
        for _ in range(3):  # the burst
            ann.models()
        with pytest.raises(ResourceExhausted) as info:
            ann.models()
        message = str(info.value)
        assert "ann" in message and "2 requests per second" in message and "retry in" in message, message
        bob.models()  # another principal has its own bucket
        time.sleep(0.6)  # 2 per second: one more token after 0.5 s
        ann.models()


def test_no_rate_limit_without_auth(tmp_path, ray_cluster):
    running = start_server(make_settings(tmp_path / "store", principal_requests_per_second=1,
                                         principal_request_burst=1))
    try:
        with Client(f"127.0.0.1:{running.port}") as c:
            for _ in range(10):
                c.models()
    finally:
        running.stop()


def test_defaults_leave_room_for_a_busy_single_user():
    settings = Settings()
    assert settings.principal_requests_per_second >= 100 and settings.principal_request_burst >= 100
    assert settings.principal_max_running_jobs >= 4


def test_running_jobs_per_principal(tmp_path):
    catalog = Catalog(tmp_path / "catalog.duckdb")
    jobs = JobManager(catalog, max_running=16, finished_kept=100, max_per_principal=2)
    release = threading.Event()

    def work(state):
        release.wait(30)

    try:
        for target in ("a1", "a2"):
            jobs.start("capture", target, {}, work, principal="ann")
        with pytest.raises(ResourceExhausted) as info:
            jobs.start("capture", "a3", {}, work, principal="ann")
        message = str(info.value)
        assert "ann has 2 jobs running" in message and "limit per principal is 2" in message, message
        assert "retry when one of them finishes" in message
        # joining a live job is not a new one; other principals and the no-auth mode are not counted
        assert jobs.start("capture", "a1", {}, work, principal="ann")[1] is True
        jobs.start("capture", "b1", {}, work, principal="bob")
        for target in ("n1", "n2", "n3"):
            jobs.start("capture", target, {}, work, principal=None)
        release.set()
        deadline = time.monotonic() + 30
        while jobs.live_for("a1") or jobs.live_for("a2"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        jobs.start("capture", "a3", {}, work, principal="ann")  # room again
    finally:
        release.set()
        jobs.shutdown()
        catalog.close()


def test_the_server_applies_the_job_limit_setting(tmp_path, ray_cluster):
    running = start_server(make_settings(tmp_path / "store", auth=True, principal_max_running_jobs=3))
    try:
        assert running.service.jobs.max_per_principal == 3
    finally:
        running.stop()


def test_rate_buckets_stay_bounded():
    limiter = RequestLimiter(rate=1000.0, burst=2)
    for i in range(3 * MAX_BUCKETS):
        limiter.admit(f"principal-{i}")
        if i % MAX_BUCKETS == MAX_BUCKETS - 1:
            time.sleep(0.01)  # every bucket so far refills (2 tokens at 1000/s take 2 ms)
    assert len(limiter._buckets) <= MAX_BUCKETS + 1
    with pytest.raises(ResourceExhausted):  # a bucket still in use keeps its count
        slow = RequestLimiter(rate=0.001, burst=1)
        slow.admit("ann")
        slow.admit("ann")
