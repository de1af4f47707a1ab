"""The Ray side of metric queries: map accumulators over shard groups, merge, and run the
in-memory and Gram-strip tasks, each task opening the store from the handle it is given.

One answer per stored bytes: the rows of a reduction are cut into `groups` groups (the settings'
`metric_groups`, never the cluster's CPUs) and the groups' accumulators are merged in group order
(`dispatch.fold_in_order`), at most `parts` tasks at a time, so a query gives the same float64
bits on a cluster of any size, in any run."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from functools import partial
from typing import TypeVar

import numpy as np
import ray

from actstore.config import Settings
from actstore.errors import FailedPrecondition
from actstore.metrics.accumulator import Accumulator
from actstore.server.dispatch import fold_in_order, gather
from actstore.store.handle import StoreHandle
from actstore.workers import cluster
from actstore.workers.metric_tasks import (
    accumulate,
    accumulate_prompts,
    evaluate_layers,
    evaluate_pairs,
    split_prompts,
    split_ranges,
    strip_products,
)


@functools.cache
def remote(function, **options):
    """One Ray remote function per (function, options), made once: a `ray.remote(...)` made anew for
    every query is pickled and exported to the cluster again each time."""
    return ray.remote(**options)(function)


A = TypeVar("A", bound=Accumulator)


def merged(partials: list[A]) -> A:
    """The accumulators from map tasks merged into one."""
    total = copy.deepcopy(partials[0])  # objects from Ray's store are read-only
    for part in partials[1:]:
        total.merge(part)
    return total


def accumulated_and_finalized(store: StoreHandle, sources, ranges, accumulator: Accumulator, labels=None,
                              device_policy: str = "cpu"):
    """`map_finalize` with one map task: it accumulates and finalizes, so the state never leaves it."""
    return accumulate(store, sources, ranges, accumulator, labels, device_policy).finalize()


def merged_and_finalized(*partials: Accumulator):
    """`map_finalize`'s reduce task: the map tasks' accumulators merged, then finalized (a single
    one as it came: `map_finalize` is for accumulators whose finalize only reads their state)."""
    return (partials[0] if len(partials) == 1 else merged(list(partials))).finalize()


class Executor:
    def __init__(self, store: StoreHandle, settings: Settings,
                 release_idle_gpus: Callable[[], None] = lambda: None) -> None:
        self.store = store
        self.settings = settings
        # warm capture replicas hold whole GPUs while idle: a metric job asking for a GPU share
        # hands them back first (a single-GPU machine otherwise waited out actor_idle_seconds)
        self.release_idle_gpus = release_idle_gpus

    @property
    def parts(self) -> int:
        """Map tasks per job that run at once: the setting, or the cluster's CPUs."""
        return self.settings.metric_tasks or cluster.cluster_cpus()

    @property
    def groups(self) -> int:
        """Groups a reduction's rows are cut into: fixed by the settings, whatever the cluster."""
        return self.settings.metric_groups

    def device_task(self, function):
        """A submitter of `function` as a Ray task whose float64 products may run on a GPU: the
        task asks for `metric_gpus_per_task` of one when `metric_device` is cuda, or auto and a
        share is free once idle capture replicas have handed theirs back (a GPU busy with a capture
        or training leaves auto's tasks on the host), and gets `device_policy=metric_device`
        (`metric_tasks.task_device` decides in the task). Call it as `function` is called; it
        returns the task's ref."""
        policy = self.settings.metric_device
        gpus = cluster.cluster_gpus()
        if policy == "cuda" and not gpus:
            raise FailedPrecondition("metric_device is 'cuda' but the Ray cluster has no GPU: join a cluster "
                                     "with GPUs, or set ACTSTORE_METRIC_DEVICE=auto (GPUs when there are any)")
        share = {}
        if policy in ("auto", "cuda") and gpus:
            self.release_idle_gpus()
            # auto: the host's BLAS when every GPU is busy now (a capture, a training job), rather
            # than a queue behind that job; cuda: the tasks wait for their share
            wanted = self.settings.metric_gpus_per_task
            if policy == "cuda" or ray.available_resources().get("GPU", 0.0) >= wanted:
                share = {"num_gpus": wanted}
        return partial(remote(function, num_cpus=1, **share).remote, device_policy=policy)

    def row_groups(self, rows: int, parts: int | None = None) -> list[list[tuple[int, int]]]:
        """Shard-aligned row ranges in at most ``parts`` groups (default: `groups`)."""
        return split_ranges(rows, self.settings.shard_rows, parts or self.groups)

    def fold(self, partials_of, items: list):
        """The accumulators ``partials_of(item)`` (task refs) merged in the items' order, `parts`
        tasks at a time (`dispatch.fold_in_order`)."""
        total = []

        def add(part) -> None:
            if total:
                total[0].merge(part)
            else:
                total.append(copy.deepcopy(part))  # objects from Ray's store are read-only

        fold_in_order(items, partials_of, self.parts, add)
        return total[0]

    def map_reduce(self, rows: int, sources: list[tuple[str, list[int]]], accumulator, groups=None,
                   labels: np.ndarray | None = None):
        """Map `accumulate` over shard-aligned row groups (or the given range groups), merge in
        group order."""
        submit = self.device_task(accumulate)
        groups = groups or self.row_groups(rows)
        return self.fold(lambda g: submit(self.store, sources, g, accumulator, labels), groups)

    def map_finalize(self, rows: int, sources: list[tuple[str, list[int]]], accumulators: list, groups=None
                     ) -> list:
        """`map_reduce` and `finalize` of each accumulator, all submitted at once (shares of one
        query's work over the same rows run side by side), the merge and the finalize in one more
        Ray task per accumulator (single-threaded BLAS, off the server process; with one map task,
        in that task), for accumulators with a large state and a heavy finalize that only reads it:
        only the finalized results come back, in order."""
        groups = groups or self.row_groups(rows)
        if len(groups) == 1:
            submit = self.device_task(accumulated_and_finalized)
            return gather([submit(self.store, sources, groups[0], accumulator) for accumulator in accumulators])
        submit = self.device_task(accumulate)
        reduce = remote(merged_and_finalized, num_cpus=1).remote
        return gather([reduce(*[submit(self.store, sources, g, accumulator, None) for g in groups])
                       for accumulator in accumulators])

    def map_prompts(self, offsets: np.ndarray, run_key: str, layers: list[int], make_accumulator):
        """Map `accumulate_prompts` over groups of whole prompts, merge."""
        task = remote(accumulate_prompts, num_cpus=1)
        groups = split_prompts(offsets, self.settings.shard_rows, self.groups)
        return self.fold(lambda g: task.remote(self.store, run_key, layers, g, make_accumulator()), groups)

    def evaluate_layers(self, run_key: str, layers: list[int], evaluate) -> list:
        """`evaluate(z)` on each whole layer, in one task (in-memory metrics, bounded by the caller)."""
        return gather(remote(evaluate_layers, num_cpus=1).remote(self.store, run_key, layers, evaluate))

    def evaluate_pairs(self, run_a: str, layers_a: list[int], run_b: str, layers_b: list[int], evaluate,
                       prepare=None):
        task = remote(evaluate_pairs, num_cpus=1)
        return gather(task.remote(self.store, run_a, layers_a, run_b, layers_b, evaluate, prepare))

    def gram_strip_map(self, rows: np.ndarray, means: np.ndarray, widths, strips: list[tuple[int, int]]):
        """A Gram-space finalize's strips (`similarity.gram_strip_products`) in `parts` Ray tasks:
        single-threaded BLAS each, off the server process, the rows shared through Ray's object
        store. Strips are dealt largest first to the least loaded task (a strip's work grows with
        the columns right of its first row)."""
        groups: list[list[tuple[int, int]]] = [[] for _ in range(min(self.parts, len(strips)))]
        work = [0] * len(groups)
        for strip in sorted(strips, key=lambda s: -(s[1] - s[0]) * (len(rows) - s[0])):
            least = work.index(min(work))
            groups[least].append(strip)
            work[least] += (strip[1] - strip[0]) * (len(rows) - strip[0])
        rows_ref = ray.put(rows)
        submit = self.device_task(strip_products)
        return gather([submit(rows_ref, means, widths, group) for group in groups])
