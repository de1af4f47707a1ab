"""Long-running work with progress: capture jobs and metric jobs.

A job runs in a thread of the server process (which owns the catalog) and drives Ray tasks. Its
progress is published to any number of watchers, and mirrored in the catalog's `jobs` table so
`ListJobs` and a restarted server see it: its status at every change, its progress (done/total)
at most once per `job_progress_seconds` (and whenever its total changes), so a server that dies
leaves the progress its job had reached. At most one live job exists per target (run key or
result key): an identical request joins it.

Every job ends, whatever its bookkeeping hits: an error of the work, of a catalog write (a full
disk is RESOURCE_EXHAUSTED naming it), of a callback, is the job's error, and the job is published
finished and its slot freed even when the catalog cannot record that (`_finish`), so a
resubmission starts afresh. A watchdog ends a running job that has published nothing for
`stall_seconds` (DEADLINE_EXCEEDED), and its thread is told to stop. A job's last event says how
many object-store calls were retried while it ran (`faults`).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from cachetools import LRUCache

from actstore.errors import ActStoreError, Cancelled, DeadlineExceeded, ResourceExhausted, Unavailable
from actstore.server import auth
from actstore.store import disk
from actstore.store.catalog import Catalog, JobRecord

log = logging.getLogger(__name__)

# "interrupted": the server stopped under the job; the next start resumes it.
TERMINAL = ("done", "failed", "cancelled", "interrupted")
# how long a request waits for a cancelled job of its target to stop (its tasks in flight settle)
CANCEL_SETTLE_SECONDS = 60.0


@dataclass(frozen=True)
class JobSnapshot:
    job_id: str
    kind: str
    target: str
    status: str
    done: int = 0
    total: int = 0
    unit: str = ""
    error: str = ""
    error_code: str = ""
    message: str = ""
    cache_hit: bool = False
    joined: bool = False
    principal: str | None = None  # who submitted it (None without auth)
    run_keys: tuple[str, ...] = ()  # a capture: the run of each of its `sites`
    sites: tuple[str, ...] = ()

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL


class JobState:
    """The live side of one job: the latest snapshot and a condition to wait for the next."""

    def __init__(self, snapshot: JobSnapshot, record: Callable[[int, int], None] | None = None) -> None:
        self._snapshot = snapshot
        self._version = 0
        self.changed_at = time.monotonic()  # the last publish: what the watchdog reads
        self._cond = threading.Condition()
        self._record = record  # keeps progress where a restarted server finds it
        self.cancel_requested = threading.Event()

    @property
    def snapshot(self) -> JobSnapshot:
        with self._cond:
            return self._snapshot

    def publish(self, **changes) -> None:
        with self._cond:
            if self._snapshot.finished:  # ended already (by the watchdog): a late thread changes nothing
                return
            self._snapshot = replace(self._snapshot, **changes)
            self._version += 1
            self.changed_at = time.monotonic()
            self._cond.notify_all()

    def progress(self, done: int, total: int, unit: str, message: str = "") -> None:
        if self.cancel_requested.is_set():
            raise Cancelled(f"job {self._snapshot.job_id} was cancelled")
        if self._record is not None:
            self._record(done, total)
        self.publish(status="running", done=done, total=total, unit=unit, message=message)

    def wait_finished(self, timeout: float) -> bool:
        """Wait until the job has finished, at most ``timeout`` seconds; whether it has."""
        with self._cond:
            return self._cond.wait_for(lambda: self._snapshot.finished, timeout)

    def follow(self, poll_seconds: float = 1.0) -> Iterator[JobSnapshot]:
        """The current snapshot, then each change, until a terminal one (intermediate changes
        may be coalesced: a watcher always sees the latest state)."""
        seen = -1
        while True:
            with self._cond:
                while self._version == seen:
                    self._cond.wait(poll_seconds)
                seen = self._version
                snapshot = self._snapshot
            yield snapshot
            if snapshot.finished:
                return


Work = Callable[[JobState], None]


class _ProgressRecorder:
    """Writes a job's progress to the catalog, at most once per `seconds` unless its total changes."""

    def __init__(self, catalog: Catalog, job_id: str, seconds: float) -> None:
        self.catalog, self.job_id, self.seconds = catalog, job_id, seconds
        self._written_at = -float("inf")
        self._total: int | None = None

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if total != self._total or now - self._written_at >= self.seconds:
            self.catalog.jobs.update(self.job_id, done=done, total=total)
            self._written_at, self._total = now, total


def failure(exc: BaseException, catalog: Catalog, what: str) -> ActStoreError:
    """Our error for ``exc``, raised by ``what`` of a job: as it is when it is ours; a full disk as
    RESOURCE_EXHAUSTED naming it (the catalog's, unless the error names another path); else a bug
    (INTERNAL), with the traceback logged."""
    if isinstance(exc, ActStoreError):
        return exc
    if disk.full(exc):
        return disk.no_space(exc, None, None, what, fallback=catalog.path)
    log.error("%s failed on an unexpected error", what, exc_info=exc)
    error = ActStoreError(f"internal error in {what}: {exc!r}; the server log has the traceback: please report it")
    error.code = "INTERNAL"
    return error


def _runs(request: dict) -> dict:
    """A capture request's run keys and sites, for its snapshot."""
    if not isinstance(request, dict):
        return {}
    return {"run_keys": tuple(request.get("run_keys") or ()), "sites": tuple(request.get("sites") or ())}


class JobManager:
    def __init__(self, catalog: Catalog, max_running: int, finished_kept: int, progress_seconds: float = 1.0,
                 max_per_principal: int | None = None, stall_seconds: float = 0.0,
                 faults: Callable[[], dict[str, int]] | None = None) -> None:
        self.catalog = catalog
        self.max_running = max_running
        self.progress_seconds = progress_seconds
        self.max_per_principal = max_per_principal  # for named principals (auth on); None: no such limit
        self.stall_seconds = stall_seconds  # 0: no watchdog
        self._faults = faults  # the cluster's object-store retries so far (`workers.store_faults`)
        self._lock = threading.Lock()
        self._live: dict[str, JobState] = {}  # queued or running
        # finished jobs keep their full status (error code, cache hit) for a while; older ones are
        # read back from the catalog
        self._finished: LRUCache[str, JobState] = LRUCache(finished_kept)
        self._by_target: dict[str, str] = {}
        self._threads: set[threading.Thread] = set()
        self._stopping = False
        self._stopped = threading.Event()
        if stall_seconds > 0:
            threading.Thread(target=self._watch, name="job-watchdog", daemon=True).start()

    def live_for(self, target: str) -> JobState | None:
        with self._lock:
            job_id = self._by_target.get(target)
            return self._live.get(job_id) if job_id else None

    def await_cancelled(self, target: str, timeout: float = CANCEL_SETTLE_SECONDS) -> None:
        """Wait for the live job of `target` to stop if it is being cancelled: a request submitted
        just after a cancel starts a job of its own (resuming what the cancelled one stored)
        instead of joining one about to end CANCELLED. UNAVAILABLE if it is still stopping after
        ``timeout`` seconds."""
        state = self.live_for(target)
        if state is None or not state.cancel_requested.is_set():
            return
        if not state.wait_finished(timeout):
            raise Unavailable(f"job {state.snapshot.job_id} for the same target is still stopping after its cancel "
                              f"({timeout:.0f} s): submit again in a minute (`actstore watch "
                              f"{state.snapshot.job_id}` shows when it has stopped)")

    def start(self, kind: str, target: str, request: dict, work: Work, *, principal: str | None = None,
              job_id: str | None = None, also: tuple[str, ...] = ()) -> tuple[JobState, bool]:
        """Start `work` for `target` (and the targets `also`, which requests for them join), or join
        the live job for it (one being cancelled is waited for, `await_cancelled`, and not joined).
        Returns (state, joined)."""
        for each in (target, *also):
            self.await_cancelled(each)
        with self._lock:
            existing = self._by_target.get(target)
            if existing:
                return self._live[existing], True
            live = [s.snapshot for s in self._live.values()]  # queued or running
            if len(live) >= self.max_running:
                raise ResourceExhausted(
                    f"{len(live)} jobs are running, the limit is {self.max_running} "
                    "(ACTSTORE_MAX_RUNNING_JOBS): wait for one to finish or cancel one"
                )
            resumed = job_id is not None  # a resumed job was admitted before the restart
            mine = sum(1 for s in live if s.principal == principal)
            if principal is not None and not resumed and self.max_per_principal is not None \
                    and mine >= self.max_per_principal:
                raise ResourceExhausted(
                    f"{principal} has {mine} jobs running, the limit per principal is {self.max_per_principal} "
                    "(ACTSTORE_PRINCIPAL_MAX_RUNNING_JOBS): retry when one of them finishes (watch it with "
                    "`actstore watch JOB`), or cancel one"
                )
            job_id = job_id or uuid.uuid4().hex[:16]
            # a resumed job starts from the progress its last server recorded
            record = self.catalog.jobs.get(job_id) if resumed else None
            done, total = (record.done or 0, record.total or 0) if record else (0, 0)
            state = JobState(JobSnapshot(job_id=job_id, kind=kind, target=target, status="queued", done=done,
                                         total=total, principal=principal, **_runs(request)),
                             _ProgressRecorder(self.catalog, job_id, self.progress_seconds))
            self._live[job_id] = state
            for each in (target, *also):
                self._by_target[each] = job_id
        try:
            if resumed:
                self.catalog.jobs.update(job_id, status="queued")
            else:
                self.catalog.jobs.add(JobRecord(job_id, kind, target, "queued", request, 0, 0, None, principal))
        except Exception as exc:  # not recorded: not started, and its slot and target are free again
            with self._lock:
                self._live.pop(job_id, None)
                for each in [t for t, job in self._by_target.items() if job == job_id]:
                    self._by_target.pop(each)
            raise failure(exc, self.catalog, f"the catalog's record of a new {kind} job") from None
        thread = threading.Thread(target=self._run, args=(state, work), name=f"job-{job_id}", daemon=True)
        with self._lock:
            self._threads.add(thread)
        thread.start()
        return state, False

    def record_finished(self, kind: str, target: str, request: dict, *, principal: str | None = None,
                        cache_hit: bool = True) -> JobSnapshot:
        """A job that had nothing to do (a cache hit): recorded so it can be watched like any other."""
        job_id = uuid.uuid4().hex[:16]
        snapshot = JobSnapshot(job_id=job_id, kind=kind, target=target, status="done", done=1, total=1, unit="run",
                               cache_hit=cache_hit, message="served from the store", principal=principal,
                               **_runs(request))
        try:
            self.catalog.jobs.add(JobRecord(job_id, kind, target, "done", request, 1, 1, None, principal))
        except Exception as exc:  # bookkeeping only: the answer stands, kept in memory to be watched
            log.error("the catalog did not record job %s (%s, served from the store): %s", job_id, kind,
                      failure(exc, self.catalog, "a job's record"))
            with self._lock:
                self._finished[job_id] = JobState(snapshot)
        return snapshot

    def _run(self, state: JobState, work: Work) -> None:
        job_id = state.snapshot.job_id
        before = self._fault_counts()
        try:
            self.catalog.jobs.update(job_id, status="running")
            state.publish(status="running")
            work(state)
        except Cancelled as exc:
            status = "interrupted" if self._stopping else "cancelled"
            changes = {"status": status, "error": str(exc), "error_code": exc.code}
        except Exception as exc:  # whatever it is, the job ends with it (a bug: INTERNAL)
            error = failure(exc, self.catalog, f"job {job_id} ({state.snapshot.kind})")
            changes = {"status": "failed", "error": str(error), "error_code": error.code}
        else:
            changes = {"status": "done", "done": state.snapshot.total, "error": "", "error_code": ""}
        try:
            self._finish(state, before=before, **changes)
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def _fault_counts(self) -> dict[str, int] | None:
        if self._faults is None:
            return None
        try:
            return self._faults()
        except Exception as exc:  # a count is never worth a job
            log.warning("object-store retry counts unread: %s", exc)
            return None

    def _finish(self, state: JobState, before: dict[str, int] | None = None, **changes) -> None:
        """Record the job's end in the catalog, then free its slot and publish it, whatever the
        catalog does: a job the catalog cannot record ends all the same, failed with that cause."""
        snap = state.snapshot
        if snap.finished:  # the watchdog ended it; this is its thread, done at last
            return
        after = self._fault_counts() if before is not None else None
        if after is not None:
            retried, gave_up = (after.get(k, 0) - before.get(k, 0) for k in ("retried", "gave_up"))
            if retried or gave_up:
                changes["message"] = (f"{retried} object-store call(s) retried while it ran"
                                      + (f", {gave_up} given up" if gave_up else ""))
                log.warning("job %s (%s): %s", snap.job_id, snap.kind, changes["message"])
        try:
            self.catalog.jobs.update(snap.job_id, status=changes["status"], done=changes.get("done", snap.done),
                                    total=snap.total, error=changes.get("error") or None)
        except Exception as exc:
            error = failure(exc, self.catalog, f"the catalog's record of the end of job {snap.job_id}")
            log.error("job %s ended %s, but the catalog did not record it: %s", snap.job_id, changes["status"], error)
            if changes["status"] == "done":  # what the catalog says of it now is wrong: said so
                changes.update(status="failed", error=f"the job finished, but its end was not recorded: {error}",
                               error_code=error.code)
        finally:
            with self._lock:
                for target in [t for t, job in self._by_target.items() if job == snap.job_id]:
                    self._by_target.pop(target)
                if snap.job_id in self._live:
                    self._finished[snap.job_id] = self._live.pop(snap.job_id)
            state.publish(**changes)

    def _watch(self) -> None:
        """End every running job that has published nothing for `stall_seconds`."""
        period = max(0.2, min(5.0, self.stall_seconds / 4))
        while not self._stopped.wait(period):
            now = time.monotonic()
            with self._lock:
                stalled = [s for s in self._live.values() if now - s.changed_at > self.stall_seconds]
            for state in stalled:
                snap = state.snapshot
                state.cancel_requested.set()  # its thread stops at its next step, if it ever takes one
                error = DeadlineExceeded(
                    f"job {snap.job_id} ({snap.kind}) made no progress for {self.stall_seconds:g} s "
                    f"(ACTSTORE_JOB_STALL_SECONDS) at {snap.done} of {snap.total} {snap.unit}: it was ended (a lost "
                    "worker or a store that stopped answering; the server log says more). Submit it again: what "
                    "was stored is kept")
                log.error("%s", error)
                self._finish(state, status="failed", error=str(error), error_code=error.code)

    def _state(self, job_id: str) -> JobState | None:
        with self._lock:
            return self._live.get(job_id) or self._finished.get(job_id)

    def cancel(self, job_id: str, principal: str | None = None, role: str | None = None) -> JobSnapshot:
        """Ask a queued or running job to stop; a finished one is left as it is (its snapshot says so).
        With auth (a `principal` and `role`), only its submitter or an admin may."""
        if principal is not None and role is not None:
            auth.check_owner(principal, role, self.snapshot(job_id).principal, f"job {job_id}")
        with self._lock:
            state = self._live.get(job_id)
        if state is None:
            return self.snapshot(job_id)
        state.cancel_requested.set()
        return state.snapshot

    def snapshot(self, job_id: str) -> JobSnapshot:
        state = self._state(job_id)
        if state is not None:
            return state.snapshot
        record = self.catalog.jobs.get(job_id)
        status = record.status if record.status in TERMINAL else "interrupted"  # its server died
        return JobSnapshot(job_id=record.job_id, kind=record.kind, target=record.target, status=status,
                           done=record.done, total=record.total, error=record.error or "",
                           principal=record.principal, **_runs(record.request))

    def follow(self, job_id: str) -> Iterator[JobSnapshot]:
        state = self._state(job_id)
        if state is None:
            yield self.snapshot(job_id)
            return
        yield from state.follow()

    def list(self, status: str | None = None) -> list[JobSnapshot]:
        return [self.snapshot(r.job_id) for r in self.catalog.jobs.all(status or None)]

    def shutdown(self, timeout: float = 10.0) -> None:
        with self._lock:
            states = list(self._live.values())
            threads = list(self._threads)
        self._stopping = True
        self._stopped.set()
        for state in states:
            state.cancel_requested.set()
        for thread in threads:
            thread.join(timeout)
