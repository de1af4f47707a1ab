"""One windowed dispatcher for Ray work: capture shards and matrix-job map tasks.

A bounded window of tasks is in flight at a time, so cancelling means submitting no more (a
``ray.cancel`` racing a finishing task can crash the driver), a warm replica is free again soon,
and the results of the tasks already running are still collected before the caller stops.

A task lost with its worker (its replica or node died) can be submitted again, a bounded number of
times (``retries``): a task writes whole, idempotent results and its result is collected once, so
a retry costs only time. An error the task raised itself is never retried.

A query's tasks belong to the gRPC call that asked for it: ``call_active`` is the call's own
``is_active`` (the interceptor sets it for each call; it turns false when the deadline passed or
the client cancelled), and ``gather`` cancels the outstanding tasks then instead of waiting for an
answer nobody reads. Polling it costs nothing per call, where a completion callback per call would
add work to gRPC's one polling thread on every cached answer.
"""

from __future__ import annotations

import contextvars
import logging
import re
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable
from typing import Any

import ray

from actstore.errors import ActStoreError, Cancelled
from actstore.workers import cluster

log = logging.getLogger(__name__)

WAIT_SECONDS = 0.5
# how long an interrupted task may take to stop before its worker is ended (`cancel`)
CANCEL_GRACE_SECONDS = 10.0

# Ray's errors for a task whose worker went away (an actor died, restarting or unplaceable, its
# node died, its process crashed, its result lost with its node): not an error of the task's own
LOST_WORKER = (ray.exceptions.RayActorError, ray.exceptions.ActorUnschedulableError, ray.exceptions.NodeDiedError,
               ray.exceptions.WorkerCrashedError, ray.exceptions.ObjectLostError)

call_active: contextvars.ContextVar[Callable[[], bool] | None] = contextvars.ContextVar("call_active", default=None)


def gather(refs):
    """``ray.get`` of a ref or a list of them, with two differences. Our errors from inside a task
    are raised as themselves (a DataLoss names the damaged chunk, without Ray's traceback around
    it). And if the gRPC call this thread serves ends first, the tasks not yet finished are
    cancelled (a running one is interrupted) and ``Cancelled`` is raised."""
    active = call_active.get()
    pending = [refs] if isinstance(refs, ray.ObjectRef) else list(refs)
    while active is not None and pending:
        if not active():
            cancel(pending)
            raise Cancelled(f"the call ended before its answer (deadline passed or cancelled): {len(pending)} "
                            "task(s) were cancelled; ask again with a longer timeout")
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=WAIT_SECONDS)
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as exc:
        cause = cluster.unwrap(exc)
        if isinstance(cause, ActStoreError):
            raise cause from None
        raise


def cancel(refs: list[ray.ObjectRef]) -> None:
    """Cancel tasks nobody waits for any more: interrupt them now (a task stops at its next Python
    line and its worker stays), and a thread of its own checks that they did stop: one still
    running `CANCEL_GRACE_SECONDS` later (an interrupt lost in Ray, or a C call that never returns
    to Python) is force-cancelled, which ends its worker process; otherwise it would hold its CPU
    until it ended on its own, minutes after its call."""
    for ref in refs:
        ray.cancel(ref)
    threading.Thread(target=_force_if_still_running, args=(refs,), name="cancel-check", daemon=True).start()


def _force_if_still_running(refs: list[ray.ObjectRef]) -> None:
    try:
        done, running = ray.wait(refs, num_returns=len(refs), timeout=CANCEL_GRACE_SECONDS,
                                 fetch_local=False)
    except Exception as exc:  # Ray shut down meanwhile (the server stopped): nothing is left to end
        log.info("no check of %d cancelled task(s): %s", len(refs), brief(exc))
        return
    log.info("cancelled %d task(s): %d stopped, %d still running after %.0f s", len(refs), len(done),
             len(running), CANCEL_GRACE_SECONDS)
    for ref in running:
        try:
            ray.cancel(ref, force=True)
        except ValueError:  # an actor's task: force cannot end it without the actor; it stops when it returns
            log.warning("a cancelled actor task (%s) is still running after %.0f s", ref.hex(), CANCEL_GRACE_SECONDS)
        else:
            log.warning("a cancelled task (%s) was still running after %.0f s: its worker was ended", ref.hex(),
                        CANCEL_GRACE_SECONDS)


# what our own code raises when it is wrong (a call with the wrong types, a missing attribute, a
# broken invariant), never what the data, the store, the network or a lost worker cause
BUG_ERRORS = (TypeError, AttributeError, NameError, AssertionError, NotImplementedError)


class WorkerBug(RuntimeError):
    """A task failed on a bug (ours, or a library's): the job or call fails INTERNAL, not UNAVAILABLE,
    which would tell the user to retry."""


def get_or_raise(ref: ray.ObjectRef, otherwise: Callable[[BaseException], ActStoreError], *,
                 bugs_internal: bool = False):
    """ray.get, re-raising our errors from inside the task as themselves and anything else as
    `otherwise(cause)` (a task that died, a store or library error), with the message the user
    needs. With ``bugs_internal`` (tasks over inputs already checked: a capture's shards, a
    training run), a bug inside the task (`BUG_ERRORS`) is a `WorkerBug` (INTERNAL) instead; a
    task that opens what a user hands in (a model folder, an activations file) leaves it off, as
    a malformed input can raise the same errors inside a library."""
    try:
        return gather([ref])[0]
    except Cancelled:
        raise
    except Exception as exc:
        cause = cluster.unwrap(exc)
        if isinstance(cause, ActStoreError):
            raise cause from None
        if bugs_internal and isinstance(exc, ray.exceptions.RayTaskError) and isinstance(cause, BUG_ERRORS):
            log.error("a task failed on a bug: %s", exc)  # with the task's traceback, for the report
            raise WorkerBug(f"a worker task failed on an unexpected error ({type(cause).__name__}: {brief(cause)}): "
                            "a bug in actstore or a library it calls, not worth retrying; the server log has "
                            "the traceback: please report it") from None
        error = otherwise(brief(cause))
        log.warning("%s (%s)", error, exc)  # the message keeps the last line; the log, Ray's whole report
        raise error from None


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def brief(exc: BaseException) -> RuntimeError:
    """An error's last line without Ray's traceback and colours: what a status message may say."""
    lines = [line.strip() for line in _ANSI.sub("", str(exc)).splitlines() if line.strip()]
    return RuntimeError(lines[-1][:500] if lines else type(exc).__name__)


def worker_lost(ref: ray.ObjectRef) -> bool:
    """Whether a finished task failed because its worker went away (`LOST_WORKER`), rather than
    with an error it raised itself (a RayTaskError, whatever its cause)."""
    try:
        ray.get(ref)
    except Exception as exc:
        return isinstance(exc, LOST_WORKER) and not isinstance(exc, ray.exceptions.RayTaskError)
    return False


def run_windowed(
    items: Iterable[Any],
    submit: Callable[[Any], ray.ObjectRef],
    width: int,
    collect: Callable[[Any, ray.ObjectRef], None],
    cancelled: threading.Event,
    tick: Callable[[], None] | None = None,
    retries: int = 0,
    ordered: bool = False,
) -> bool:
    """Submit ``submit(item)`` for every item with at most ``width`` in flight; ``collect(item,
    ref)`` each as it finishes. ``tick`` runs about every ``WAIT_SECONDS`` while tasks are in
    flight. Returns True when every item was collected, False when ``cancelled`` was set (after
    collecting what was in flight).

    ``ordered``: ``collect`` sees the items in their order, whatever order their tasks finish in
    (a reduction that merges as it collects then adds the same numbers in the same order on any
    cluster and in any run: the same bits), and at most ``width`` items are submitted and not yet
    collected (a finished task waits in Ray's object store for those before it).

    When ``collect`` raises for a task whose worker was lost (`worker_lost`), the item is
    submitted again, up to ``retries`` times (then the error stands): ``submit`` sees an item a
    second time only then, and should send it elsewhere."""
    if ordered:
        return _run_in_order(deque(items), submit, width, collect, cancelled, tick, retries)
    queue = deque(items)
    pending: dict[ray.ObjectRef, Any] = {}
    tries: Counter = Counter()

    def settle(ref: ray.ObjectRef) -> None:
        item = pending.pop(ref)
        try:
            collect(item, ref)
        except Exception:
            if tries[item] >= retries or not worker_lost(ref):
                raise
            tries[item] += 1
            log.warning("a task of %r was lost with its worker; submitting it again (%d of %d)", item, tries[item],
                        retries)
            queue.appendleft(item)

    while queue or pending:
        while queue and len(pending) < width:
            item = queue.popleft()
            pending[submit(item)] = item
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=WAIT_SECONDS)
        if cancelled.is_set():
            ready, _ = ray.wait(list(pending), num_returns=len(pending))
            for ref in ready:
                settle(ref)
            return False
        for ref in ready:
            settle(ref)
        if tick is not None:
            tick()
    return True


def _run_in_order(queue: deque, submit, width: int, collect, cancelled: threading.Event, tick, retries: int) -> bool:
    """`run_windowed` with ``ordered``: the submitted items in their order, collected from the head."""
    window: deque[list] = deque()  # [item, ref], in item order
    tries: Counter = Counter()

    def collect_head() -> bool:
        """Collect the first item; False when it was submitted again (its worker was lost)."""
        item, ref = window.popleft()
        try:
            collect(item, ref)
        except Exception:
            if tries[item] >= retries or not worker_lost(ref):
                raise
            tries[item] += 1
            log.warning("a task of %r was lost with its worker; submitting it again (%d of %d)", item, tries[item],
                        retries)
            window.appendleft([item, submit(item)])
            return False
        return True

    while queue or window:
        while queue and len(window) < width:
            item = queue.popleft()
            window.append([item, submit(item)])
        ray.wait([window[0][1]], num_returns=1, timeout=WAIT_SECONDS)
        if cancelled.is_set():
            ray.wait([ref for _, ref in window], num_returns=len(window))
            while window and collect_head():
                pass
            return False
        while window and ray.wait([window[0][1]], timeout=0)[0]:
            if not collect_head():
                break
        if tick is not None:
            tick()
    return True


def fold_in_order(items: list, submit: Callable[[Any], ray.ObjectRef], width: int, fold: Callable[[Any], None]) -> None:
    """``fold(result)`` of ``submit(item)`` for every item, in the items' order, at most ``width``
    tasks submitted and not yet folded (so at most that many results are held at once): a
    reduction over the same items adds the same numbers in the same order whichever task finishes
    first. The results come through `gather`: our errors as themselves, and when the gRPC call
    this thread serves ends, the tasks outstanding are cancelled and ``Cancelled`` raised.

    When one result raises (a damaged chunk is DataLoss), the others in flight are left to finish
    and dropped, not cancelled: at most ``width`` tasks' work, where ``ray.cancel`` of a task
    finishing at that moment aborts the driver (Ray 2.60, "Check failed: it !=
    submissible_tasks_.end() Tried to complete task that was not pending"; ray-project/ray#54798
    fixed the retry side of that race only), and the driver is this server."""
    window: deque[ray.ObjectRef] = deque()
    queue = deque(items)
    while queue or window:
        while queue and len(window) < width:
            window.append(submit(queue.popleft()))
        fold(gather(window[0]))
        window.popleft()
