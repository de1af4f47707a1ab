"""The one `TokenLayouts` process of this process's Ray job, which every server's capture pool asks
for token-level layouts (`CapturePool.token_rows`): the next server of the process (a notebook's
reopened client, the next test's server) lays out its runs without starting one (~2.5 CPU-s)."""

from __future__ import annotations

import logging
import threading
import time

import ray

from actstore.store.handle import StoreHandle
from actstore.workers.layouts import TokenLayouts

log = logging.getLogger(__name__)


class SharedLayouts:
    """The one `TokenLayouts` process of this process's Ray job, which every pool of the process asks
    (started on first use, and again if it was lost). It ends once it has answered and idled the
    asking pools' `actor_idle_seconds`: a live pool's reaper ends it, and the last pool to stop
    leaves a timer that does."""

    lock = threading.Lock()
    actor = None
    job: str | None = None  # the Ray job the handle is of: a new cluster's job has none of the old one's actors
    asked: tuple[float, ray.ObjectRef | None] | None = None  # when it was last asked, and the answer until it came

    @staticmethod
    def name() -> str:
        # actor names are global to the Ray cluster: another process (another job) has its own
        return f"token-layouts-{ray.get_runtime_context().get_job_id()}"

    @classmethod
    def rows(cls, store: StoreHandle, model_path: str, dataset_path: str, max_len: int,
             spans: bool) -> ray.ObjectRef:
        with cls.lock:
            name, job = cls.name(), ray.get_runtime_context().get_job_id()
            # the class keeps the handle: Ray ends an actor once no handle to it is left
            if cls.actor is None or cls.job != job or name not in ray.util.list_named_actors():  # lost for good
                cls.actor = ray.remote(TokenLayouts).options(
                    name=name, num_cpus=0, max_restarts=2, max_task_retries=2).remote()
                cls.job = job
            ref = cls.actor.rows.remote(store, model_path, dataset_path, max_len, spans)
            cls.asked = (time.monotonic(), ref)
            return ref

    @classmethod
    def end_if_idle(cls, idle_seconds: float) -> None:
        """End the process once it has answered and idled ``idle_seconds``, as replicas are."""
        with cls.lock:
            if cls.actor is None or cls.asked is None:
                return
            if not ray.is_initialized() or cls.job != ray.get_runtime_context().get_job_id():
                cls.actor = cls.asked = cls.job = None  # its cluster is gone, and the process with it
                return
            asked, ref = cls.asked
            if ref is not None:
                if not ray.wait([ref], timeout=0)[0]:
                    return  # still tokenising
                cls.asked = (asked, None)  # the answer's object can go once its caller has it
            if time.monotonic() - asked >= idle_seconds:
                ray.kill(cls.actor)
                cls.actor = cls.asked = cls.job = None

    @classmethod
    def end_when_idle(cls, idle_seconds: float) -> None:
        """What the last pool to stop leaves: a timer that ends the process if no pool asked it meanwhile."""
        with cls.lock:
            if cls.asked is None:
                return
            wait = max(0.0, cls.asked[0] + idle_seconds - time.monotonic())
        timer = threading.Timer(wait, cls._end_if_still_idle, (idle_seconds,))
        timer.daemon = True
        timer.start()

    @classmethod
    def _end_if_still_idle(cls, idle_seconds: float) -> None:
        try:
            cls.end_if_idle(idle_seconds)
        except Exception:  # noqa: BLE001 (a timer's thread: Ray shut down meanwhile, nothing to end)
            log.debug("the idle TokenLayouts process was not ended", exc_info=True)
