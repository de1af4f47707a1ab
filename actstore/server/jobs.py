"""Long-running work with progress: capture jobs and metric jobs.

A job runs in a thread of the server process (which owns the catalog) and drives Ray tasks. Its
progress is published to any number of watchers, and mirrored in the catalog's `jobs` table so
`ListJobs` and a restarted server see it: its status at every change, its progress (done/total)
at most once per `job_progress_seconds` (and whenever its total changes), so a server that dies
leaves the progress its job had reached. At most one live job exists per target (run key or
result key): an identical request joins it.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from cachetools import LRUCache

from actstore.errors import ActStoreError, Cancelled, ResourceExhausted, Unavailable
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
        self._cond = threading.Condition()
        self._record = record  # keeps progress where a restarted server finds it
        self.cancel_requested = threading.Event()

    @property
    def snapshot(self) -> JobSnapshot:
        with self._cond:
            return self._snapshot

    def publish(self, **changes) -> None:
        with self._cond:
            self._snapshot = replace(self._snapshot, **changes)
            self._version += 1
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


def _runs(request: dict) -> dict:
    """A capture request's run keys and sites, for its snapshot."""
    if not isinstance(request, dict):
        return {}
    return {"run_keys": tuple(request.get("run_keys") or ()), "sites": tuple(request.get("sites") or ())}


class JobManager:
    def __init__(self, catalog: Catalog, max_running: int, finished_kept: int, progress_seconds: float = 1.0,
                 max_per_principal: int | None = None) -> None:
        self.catalog = catalog
        self.max_running = max_running
        self.progress_seconds = progress_seconds
        self.max_per_principal = max_per_principal  # for named principals (auth on); None: no such limit
        self._lock = threading.Lock()
        self._live: dict[str, JobState] = {}  # queued or running
        # finished jobs keep their full status (error code, cache hit) for a while; older ones are
        # read back from the catalog
        self._finished: LRUCache[str, JobState] = LRUCache(finished_kept)
        self._by_target: dict[str, str] = {}
        self._threads: set[threading.Thread] = set()
        self._stopping = False

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
        if resumed:
            self.catalog.jobs.update(job_id, status="queued")
        else:
            self.catalog.jobs.add(JobRecord(job_id, kind, target, "queued", request, 0, 0, None, principal))
        thread = threading.Thread(target=self._run, args=(state, work), name=f"job-{job_id}", daemon=True)
        with self._lock:
            self._threads.add(thread)
        thread.start()
        return state, False

    def record_finished(self, kind: str, target: str, request: dict, *, principal: str | None = None,
                        cache_hit: bool = True) -> JobSnapshot:
        """A job that had nothing to do (a cache hit): recorded so it can be watched like any other."""
        job_id = uuid.uuid4().hex[:16]
        self.catalog.jobs.add(JobRecord(job_id, kind, target, "done", request, 1, 1, None, principal))
        return JobSnapshot(job_id=job_id, kind=kind, target=target, status="done", done=1, total=1,
                           unit="run", cache_hit=cache_hit, message="served from the store", principal=principal,
                           **_runs(request))

    def _run(self, state: JobState, work: Work) -> None:
        job_id = state.snapshot.job_id
        self.catalog.jobs.update(job_id, status="running")
        state.publish(status="running")
        try:
            work(state)
        except Cancelled as exc:
            status = "interrupted" if self._stopping else "cancelled"
            self._finish(state, status=status, error=str(exc), error_code=exc.code)
        except ActStoreError as exc:
            self._finish(state, status="failed", error=str(exc), error_code=exc.code)
        except Exception as exc:  # a bug: report it as INTERNAL, keep the server alive
            log.exception("job %s failed", job_id)
            self._finish(state, status="failed", error=f"internal error: {exc!r}", error_code="INTERNAL")
        else:
            snap = state.snapshot
            self._finish(state, status="done", done=snap.total, error="", error_code="")

    def _finish(self, state: JobState, **changes) -> None:
        snap = state.snapshot
        self.catalog.jobs.update(snap.job_id, status=changes["status"], done=changes.get("done", snap.done),
                                total=snap.total, error=changes.get("error") or None)
        with self._lock:
            for target in [t for t, job in self._by_target.items() if job == snap.job_id]:
                self._by_target.pop(target)
            self._finished[snap.job_id] = self._live.pop(snap.job_id)
            self._threads.discard(threading.current_thread())
        state.publish(**changes)

    def _state(self, job_id: str) -> JobState | None:
        with self._lock:
            return self._live.get(job_id) or self._finished.get(job_id)

    def cancel(self, job_id: str) -> JobSnapshot:
        """Ask a queued or running job to stop; a finished one is left as it is (its snapshot says so)."""
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
        for state in states:
            state.cancel_requested.set()
        for thread in threads:
            thread.join(timeout)
