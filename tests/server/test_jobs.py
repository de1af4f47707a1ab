"""The job manager: joining a live job, a request right after a cancel, and every job ending whatever its
bookkeeping meets (a full catalog disk, an error in a callback, a step that never returns)."""

from __future__ import annotations

import threading
import time

import pytest

from actstore.errors import ResourceExhausted, Unavailable
from actstore.server.jobs import JobManager
from actstore.store.catalog import Catalog
from tests.small_disk import small_disk


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


def test_a_full_catalog_disk_fails_the_job_it_meets_frees_its_slot_and_a_resubmission_starts_afresh(tmp_path):
    """Before, the catalog write that raised (a job's record, its progress, its end) left the job
    thread or the submission with the slot and the target taken: the job stayed `running` at 0/0,
    and every identical submission joined it until the server restarted."""
    with small_disk(tmp_path / "disk", 16) as disk:
        catalog = Catalog(disk.path / "catalog.duckdb")
        manager = JobManager(catalog, max_running=1, finished_kept=100, progress_seconds=0)
        try:
            catalog.execute("CHECKPOINT")  # no write-ahead log: its last page's slack would take a small write
            disk.fill()
            with pytest.raises(ResourceExhausted, match=r"no space left on the disk of .*catalog\.duckdb.*free"):
                manager.start("capture", "run-a", {}, lambda state: None)
            assert manager.live_for("run-a") is None  # slot and target free

            disk.free()
            filled = threading.Event()

            def work(state):
                state.progress(0, 2, "shards")
                catalog.execute("CHECKPOINT")
                disk.fill()
                filled.set()
                state.progress(1, 2, "shards")  # the catalog cannot record it

            state, joined = manager.start("capture", "run-a", {}, work)
            assert not joined and state.wait_finished(30)
            snap = state.snapshot
            assert (snap.status, snap.error_code) == ("failed", "RESOURCE_EXHAUSTED"), snap
            assert "catalog.duckdb" in snap.error and "Traceback" not in snap.error
            assert manager.live_for("run-a") is None
            assert catalog.jobs.get(snap.job_id).status == "running"  # what it could not write stays unwritten

            disk.free()
            again, joined = manager.start("capture", "run-a", {}, lambda s: s.progress(2, 2, "shards"))
            assert not joined and again.wait_finished(30) and again.snapshot.status == "done"
            assert catalog.jobs.get(again.snapshot.job_id).status == "done"
            assert catalog.rows("SELECT count(*) FROM jobs")[0][0] == 2  # reads served all along
        finally:
            disk.free()
            manager.shutdown()
            catalog.close()


def test_an_error_in_a_callback_or_the_work_ends_the_job_as_internal(jobs):
    def work(state):
        raise KeyError("a bug in a callback")

    state, _ = jobs.start("cka-matrix", "result-a", {}, work)
    assert state.wait_finished(10)
    snap = state.snapshot
    assert (snap.status, snap.error_code) == ("failed", "INTERNAL") and "a bug in a callback" in snap.error
    assert jobs.live_for("result-a") is None


def test_the_watchdog_ends_a_job_without_progress_and_a_resubmission_starts_afresh(tmp_path):
    catalog = Catalog(tmp_path / "catalog.duckdb")
    manager = JobManager(catalog, max_running=1, finished_kept=100, stall_seconds=0.5)
    release = threading.Event()
    try:
        def stuck(state):
            state.progress(1, 4, "shards")
            release.wait(60)  # a task that never returns
            state.progress(2, 4, "shards")

        state, _ = manager.start("capture", "run-s", {}, stuck)
        assert state.wait_finished(10)
        snap = state.snapshot
        assert (snap.status, snap.error_code) == ("failed", "DEADLINE_EXCEEDED"), snap
        assert "no progress for 0.5 s" in snap.error and "at 1 of 4 shards" in snap.error
        assert catalog.jobs.get(snap.job_id).status == "failed"
        again, joined = manager.start("capture", "run-s", {}, lambda s: s.progress(4, 4, "shards"))
        assert not joined and again.wait_finished(10) and again.snapshot.status == "done"
        release.set()  # the stuck thread wakes, finds its job ended, and changes nothing
        time.sleep(0.3)
        assert state.snapshot.status == "failed" and catalog.jobs.get(snap.job_id).status == "failed"
    finally:
        release.set()
        manager.shutdown()
        catalog.close()
