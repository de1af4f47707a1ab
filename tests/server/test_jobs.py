"""The job manager: joining a live job, and a request right after a cancel."""

from __future__ import annotations

import threading

import pytest

from actstore.errors import Unavailable
from actstore.server.jobs import JobManager
from actstore.store.catalog import Catalog


@pytest.fixture
def jobs(tmp_path):
    catalog = Catalog(tmp_path / "catalog.duckdb")
    manager = JobManager(catalog, max_running=8, finished_kept=100)
    yield manager
    manager.shutdown()
    catalog.close()


def test_a_request_joins_a_live_job_but_not_a_cancelled_one(jobs):
    stop = threading.Event()
    settle = threading.Event()

    def work(state):
        stop.wait(30)
        settle.wait(30)  # a cancelled job's tasks in flight settle before it ends

    first, joined = jobs.start("capture", "run-a", {}, work)
    assert not joined
    assert jobs.start("capture", "run-a", {}, work) == (first, True)
    jobs.cancel(first.snapshot.job_id)
    stop.set()
    threading.Timer(0.5, settle.set).start()
    second, joined = jobs.start("capture", "run-a", {}, lambda state: None)  # waits for the first to end
    assert not joined and second is not first
    assert first.snapshot.status == "done"  # its work returned (it ignored the cancel): it finished


def test_a_cancelled_job_that_does_not_stop_is_unavailable_not_joined(jobs):
    release = threading.Event()
    state, _ = jobs.start("capture", "run-b", {}, lambda state: release.wait(30))
    jobs.cancel(state.snapshot.job_id)
    try:
        with pytest.raises(Unavailable, match=f"job {state.snapshot.job_id} .* still stopping after its cancel"):
            jobs.await_cancelled("run-b", timeout=0.2)
    finally:
        release.set()
    assert state.wait_finished(10)
    jobs.await_cancelled("run-b", timeout=0.2)  # nothing live any more: returns at once


def test_cancelling_a_finished_job_leaves_it_as_it_is(jobs):
    state, _ = jobs.start("capture", "run-c", {}, lambda state: None)
    assert state.wait_finished(10)
    assert jobs.cancel(state.snapshot.job_id).status == "done"
    assert not state.cancel_requested.is_set()
