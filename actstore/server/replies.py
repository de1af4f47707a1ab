"""Replies to repeated cached queries, kept built.

A cached query's own work is small (about 13 us in-process: the options resolved and checked,
the runs looked up, the result key hashed, the reply built), but a server answering thousands of
them a second does it under one interpreter lock that gRPC's own threads also need. So the reply
to a request that was answered from the cache is kept, by the RPC method and the request's bytes,
and a repeat of those bytes is answered with it after two checks that cost a dictionary lookup
each (`QueryEngine.current_generation` when the reply is kept, `QueryEngine.is_current` when it
is reused):

  * the query state's generation is unchanged: no run was deleted or repaired and no result was
    collected since (each of those forgets what the planners remember and starts a generation);
  * the result cache still holds the very result the reply was built from (a refresh replaces it;
    the cache's size bound evicts it).

Otherwise the request is planned as usual. Only answers that came from the cache are kept (a
fresh computation's reply says "computed", which its repeat would not be), only small ones (at
most SMALL_ANSWER_BYTES of arrays: a large answer's bytes dominate its reply anyway), and at most
`entries` of them, so the bound is `entries` x SMALL_ANSWER_BYTES. Authentication, roles and rate
limits run before any servicer method, so a kept reply skips none of them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

from cachetools import LRUCache

from actstore._proto.actstore.v1 import actstore_pb2 as pb
from actstore.server.results import MetricResult
from actstore.server.run_names import RunNames
from actstore.wire import to_ndarray

SMALL_ANSWER_BYTES = 64 * 1024


def result_proto(r: MetricResult, names: RunNames | None = None) -> pb.QueryResult:
    """The reply of an answer; `names` name its runs (`run_names.RunNames`)."""
    p = r.provenance
    run_names = [pb.RunName(run_key=n.run_key, model=n.model, dataset=n.dataset, pooling=n.pooling, site=n.site)
                 for n in names.of(p.run_keys)] if names else []
    return pb.QueryResult(
        arrays={k: to_ndarray(v) for k, v in r.arrays.items()},
        scalars=r.scalars,
        provenance=pb.Provenance(metric=p.metric, definition_version=p.definition_version,
                                 options_json=json.dumps(p.options), run_keys=p.run_keys, cached=p.cached,
                                 seconds=p.seconds, result_key=p.result_key, run_names=run_names,
                                 error_bound=p.error_bound),
        notes=r.notes,
    )


class KeptReplies:
    """`generation()` is what a kept reply is checked against by `is_current(generation, result)`;
    the runs' names (`names`) belong to it, so a reply kept before an alias was set is rebuilt."""

    def __init__(self, entries: int, generation: Callable[[], int],
                 is_current: Callable[[int, MetricResult], bool], names: RunNames | None = None) -> None:
        self._kept: LRUCache[tuple[str, bytes], tuple[int, MetricResult, pb.QueryResult]] = LRUCache(
            maxsize=max(entries, 1))
        self._keep = entries > 0
        self._names = names
        self._generation = (lambda: (generation(), names.version())) if names else generation
        self._is_current = (lambda kept, result: kept[1] == names.version() and is_current(kept[0], result)) \
            if names else is_current
        self._lock = threading.Lock()

    def answer(self, method: str, request, compute: Callable[[], MetricResult]) -> pb.QueryResult:
        """The reply to `request`: a kept one if it is still current, else `compute()`'s."""
        if not self._keep or getattr(request, "refresh", False):
            return result_proto(compute(), self._names)
        key = (method, request.SerializeToString(deterministic=True))
        with self._lock:
            kept = self._kept.get(key)
        if kept is not None and self._is_current(kept[0], kept[1]):
            return kept[2]
        generation = self._generation()  # before computing: a forget meanwhile makes the entry stale
        result = compute()
        message = result_proto(result, self._names)
        if result.provenance.cached and sum(a.nbytes for a in result.arrays.values()) <= SMALL_ANSWER_BYTES:
            with self._lock:
                self._kept[key] = (generation, result, message)
        return message
