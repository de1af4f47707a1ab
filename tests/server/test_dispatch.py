"""The windowed dispatcher with real Ray actors: a task lost with its worker is submitted again
(a bounded number of times), an error the task raised itself never is; a cancelled task that
keeps running has its worker ended."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest
import ray

from actstore.errors import InvalidArgument, Unavailable
from actstore.server import dispatch
from actstore.server.dispatch import WorkerBug, gather, get_or_raise, run_windowed


@ray.remote(num_cpus=0)
class Counter:
    def __init__(self) -> None:
        self.calls = 0

    def run(self, item: int, fail: bool = False) -> int:
        self.calls += 1
        if fail:
            raise InvalidArgument(f"item {item} is bad")
        return item * 10

    def count(self) -> int:
        return self.calls


def _dead_and_alive() -> tuple:
    dead, alive = Counter.remote(), Counter.remote()
    ray.get([dead.count.remote(), alive.count.remote()])
    ray.kill(dead, no_restart=True)
    # ray.kill returns before the actor is gone: a call sent right after it can still run (seen under load)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            ray.get(dead.count.remote(), timeout=30)
        except ray.exceptions.RayActorError:
            return dead, alive
        time.sleep(0.1)
    raise AssertionError("the killed actor still answers after 60 s")


def test_a_task_lost_with_its_worker_goes_elsewhere_and_is_collected_once(ray_cluster):
    dead, alive = _dead_and_alive()
    sent: list[int] = []

    def submit(item: int):  # first to the dead worker, then (sent again: it was lost) to the live one
        worker = alive if item in sent else dead
        sent.append(item)
        return worker.run.remote(item)

    collected: list[tuple[int, int]] = []
    assert run_windowed(range(4), submit, 2, lambda item, ref: collected.append((item, gather(ref))),
                        threading.Event(), retries=1)
    assert sorted(collected) == [(0, 0), (1, 10), (2, 20), (3, 30)]
    assert sorted(sent) == [0, 0, 1, 1, 2, 2, 3, 3] and ray.get(alive.count.remote()) == 4


def test_retries_are_bounded_and_the_loss_is_raised(ray_cluster):
    dead, _ = _dead_and_alive()
    sent: list[int] = []

    def submit(item: int):
        sent.append(item)
        return dead.run.remote(item)

    with pytest.raises(ray.exceptions.ActorDiedError):
        run_windowed([7], submit, 1, lambda item, ref: gather(ref), threading.Event(), retries=2)
    assert sent == [7, 7, 7]


def test_an_error_the_task_raised_itself_is_not_retried(ray_cluster):
    worker = Counter.remote()
    with pytest.raises(InvalidArgument, match="item 3 is bad"):
        run_windowed([3], lambda item: worker.run.remote(item, fail=True), 1, lambda item, ref: gather(ref),
                     threading.Event(), retries=3)
    assert ray.get(worker.count.remote()) == 1


@ray.remote(num_cpus=0)
def _raises(kind: str) -> None:
    if kind == "bug":
        len(None)  # TypeError: a mistake in our code
    raise ValueError("the store answered 503 three times")


def test_a_bug_inside_a_task_is_internal_and_anything_else_is_what_the_caller_says(ray_cluster):
    """A bug (TypeError, AttributeError, ...) in a task over checked inputs must not travel as
    UNAVAILABLE ("retry"): it is a `WorkerBug`, which the service reports as INTERNAL; other
    failures, and any failure of a task that opens a user's input, take the caller's error."""
    def unavailable(cause):
        return Unavailable(f"the task failed: {cause}")

    with pytest.raises(WorkerBug) as bug:
        get_or_raise(_raises.remote("bug"), unavailable, bugs_internal=True)
    message = str(bug.value)
    assert "TypeError: object of type 'NoneType' has no len()" in message and "report it" in message
    assert "Traceback" not in message and "\n" not in message
    with pytest.raises(Unavailable, match="the task failed: .*503 three times"):
        get_or_raise(_raises.remote("store"), unavailable, bugs_internal=True)
    with pytest.raises(Unavailable, match="the task failed: .*has no len"):  # a user's model or file
        get_or_raise(_raises.remote("bug"), unavailable)


@ray.remote(num_cpus=1, max_retries=0)
def _deaf_to_interrupts(seconds: float, started: str) -> str:
    """A task that swallows Ray's cancel interrupt (as one stuck in a C call never sees it); it
    creates the file `started` once it runs."""
    Path(started).touch()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            time.sleep(0.05)
        except KeyboardInterrupt:
            pass
    return "ran to the end"


def test_a_cancelled_task_that_keeps_running_has_its_worker_ended(ray_cluster, monkeypatch, caplog, tmp_path):
    """`cancel` interrupts; a task still running after the grace period is force-cancelled, so its
    CPU is free in seconds, not when the task would have ended (120 s here)."""
    monkeypatch.setattr(dispatch, "CANCEL_GRACE_SECONDS", 1.0)
    started = tmp_path / "started"
    ref = _deaf_to_interrupts.remote(120.0, str(started))
    deadline = time.monotonic() + 60  # running, not queued: a task cancelled before it runs simply never runs
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started.exists(), "the task did not start within 60 s"
    with caplog.at_level(logging.INFO, logger="actstore.server.dispatch"):
        dispatch.cancel([ref])
        ready, _ = ray.wait([ref], timeout=30, fetch_local=False)
    assert ready, "the cancelled task still runs 30 s later"
    with pytest.raises((ray.exceptions.WorkerCrashedError, ray.exceptions.TaskCancelledError)):
        ray.get(ref)
    assert "was still running after 1 s: its worker was ended" in caplog.text
