"""The cluster's count of object-store retries and calls given up, for one server.

Object-store calls are made in the server and in its Ray workers (capture writers, map tasks,
imports), each retrying by the store's policy (`store.backends.retries`). Every process tells `FaultTally`
(the policy's observer, carried by the store handle) of each retry and give-up, and the tally keeps
the server's totals in one small named actor, started by the first retry anywhere (none is started
while nothing is retried). The server reads the totals for its jobs (the retries while a job ran,
in its last event and the log) and for `ActStoreService.store_faults`.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field

import ray

log = logging.getLogger(__name__)

NAMESPACE = "actstore-store-faults"  # a detached actor is found by name in a namespace of its own
_ACTORS: dict[str, object] = {}  # this process's handle of each tally's actor
_LOCK = threading.Lock()


@ray.remote(num_cpus=0, max_restarts=0)
class _Counts:
    def __init__(self) -> None:
        self.counts: Counter = Counter()

    def add(self, event: str) -> None:
        self.counts[event] += 1

    def totals(self) -> dict[str, int]:
        return dict(self.counts)


@dataclass(frozen=True)
class FaultTally:
    """The observer of a server's store handle: picklable, called in any process of its cluster."""

    name: str = field(default_factory=lambda: f"actstore-store-faults-{uuid.uuid4().hex[:12]}")

    def __call__(self, event: str, store: str) -> None:
        if not ray.is_initialized():  # the server's first check of its store, before it joins Ray
            return
        with _LOCK:
            actor = _ACTORS.get(self.name)
            if actor is None:
                # detached: it outlives the process that first retried (a worker Ray may end);
                # the server ends it when it stops (`stop`)
                actor = _ACTORS[self.name] = _Counts.options(name=self.name, namespace=NAMESPACE, get_if_exists=True,
                                                             lifetime="detached").remote()
        actor.add.remote(event)

    def totals(self) -> dict[str, int]:
        """Retries and calls given up so far, in every process of the cluster."""
        counts = {"retried": 0, "gave_up": 0}
        try:
            counts.update(ray.get(ray.get_actor(self.name, namespace=NAMESPACE).totals.remote(), timeout=10))
        except ValueError:  # nothing was retried yet: no actor
            pass
        except Exception as exc:  # a count is never worth failing what asks for it
            log.warning("the object-store retry counts were not read: %s", exc)
        return counts

    def stop(self) -> None:
        try:
            ray.kill(ray.get_actor(self.name, namespace=NAMESPACE))
        except ValueError:
            pass
        except Exception as exc:
            log.info("the object-store retry tally was not stopped: %s", exc)
        with _LOCK:
            _ACTORS.pop(self.name, None)
