"""The map side of metric jobs: read a range of shards, feed a streaming accumulator, return it.

A task reads one shard's rows of each requested layer at a time, so its memory is one chunk per
layer plus the accumulator, whatever n is. The job manager merges the returned accumulators. Every
task first has its process hand large freed buffers back to the OS (`heap.unmap_large_frees`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import ray

from actstore.errors import FailedPrecondition
from actstore.metrics.accumulator import Accumulator, OnDevice, Seekable
from actstore.metrics.similarity import gram_strip_products
from actstore.store.handle import StoreHandle
from actstore.workers.heap import unmap_large_frees


def task_device(policy: str) -> str | None:
    """Where this task forms its products, by `Settings.metric_device`: a torch device name, or
    None for numpy/BLAS on the host. "auto" takes CUDA only when Ray gave the task a GPU."""
    if policy == "torch-cpu":
        return "cpu"
    if policy == "cpu" or (policy == "auto" and not ray.get_gpu_ids()):
        return None
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if policy == "cuda":
        raise FailedPrecondition(
            f"metric_device is 'cuda' but this task sees no CUDA device (Ray GPU ids "
            f"{ray.get_gpu_ids()}): check the node's driver, or set ACTSTORE_METRIC_DEVICE=auto")
    return None


def accumulate(store: StoreHandle, sources: list[tuple[str, list[int]]],
               ranges: list[tuple[int, int]], accumulator: Accumulator,
               labels: np.ndarray | None = None, device_policy: str = "cpu") -> Accumulator:
    """Feed rows [start, stop) of every range to `accumulator`; `sources` lists (run key, layers)
    in the accumulator's block order. With `labels`, each update also gets the rows' labels.
    An `OnDevice` accumulator forms its products where `device_policy` says; a `Seekable` one is
    told each range's first row."""
    unmap_large_frees()
    arrays = store.open()
    accumulator = copy.deepcopy(accumulator)  # Ray hands arguments over as read-only buffers
    if isinstance(accumulator, OnDevice):
        accumulator.device = task_device(device_policy)
    for start, stop in ranges:
        blocks = []
        for run_key, layers in sources:
            blocks.extend(arrays.read_layers(run_key, layers, start, stop))
        if isinstance(accumulator, Seekable):  # resampling: weights keyed on the global row
            accumulator.seek(start)
        accumulator.update(blocks, *(() if labels is None else (labels[start:stop],)))
    return accumulator


def deal(items: list, parts: int) -> list[list]:
    """`items` in at most `parts` contiguous groups of near-equal size."""
    parts = max(1, min(parts, len(items)))
    size, extra = divmod(len(items), parts)
    groups, at = [], 0
    for p in range(parts):
        take = size + (1 if p < extra else 0)
        groups.append(items[at: at + take])
        at += take
    return groups


def split_ranges(rows: int, shard_rows: int, parts: int) -> list[list[tuple[int, int]]]:
    """Shard-aligned row ranges, dealt into at most `parts` contiguous groups of near-equal size."""
    return deal([(s, min(s + shard_rows, rows)) for s in range(0, rows, shard_rows)], parts)


class PerLayer:
    """One accumulator per block: every chunk's block b goes to accumulator b."""

    def __init__(self, accumulators: list[Accumulator]) -> None:
        self.accumulators = accumulators

    def update(self, blocks: list, *extra) -> None:
        for accumulator, block in zip(self.accumulators, blocks):
            accumulator.update(block, *extra)

    def merge(self, other: PerLayer) -> PerLayer:
        for mine, theirs in zip(self.accumulators, other.accumulators):
            mine.merge(theirs)
        return self

    def finalize(self, *args, **kwargs) -> list:
        """Each block's answer, in block order."""
        return [accumulator.finalize(*args, **kwargs) for accumulator in self.accumulators]

    @property
    def device(self) -> str | None:
        return next((a.device for a in self.accumulators if isinstance(a, OnDevice)), None)

    @device.setter
    def device(self, device: str | None) -> None:
        for accumulator in self.accumulators:
            if isinstance(accumulator, OnDevice):
                accumulator.device = device


def strip_products(rows: np.ndarray, means: np.ndarray, widths: list[int], strips: list[tuple[int, int]],
                   device_policy: str = "cpu") -> np.ndarray:
    """`similarity.gram_strip_products` of a Gram-space CKA finalize, on this task's device."""
    unmap_large_frees()
    return gram_strip_products(rows, means, widths, strips, task_device(device_policy))


def accumulate_prompts(store: StoreHandle, run_key: str, layers: list[int],
                       prompt_chunks: list[np.ndarray], accumulator: Accumulator) -> Accumulator:
    """Token-level map task: each chunk is a slice of the run's offsets (whole prompts), fed to
    `accumulator.update(blocks, local_offsets)`."""
    unmap_large_frees()
    arrays = store.open()
    accumulator = copy.deepcopy(accumulator)
    for offsets in prompt_chunks:
        blocks = arrays.read_layers(run_key, layers, int(offsets[0]), int(offsets[-1]))
        accumulator.update(list(blocks), offsets - offsets[0])
    return accumulator


def prompt_ranges(offsets: np.ndarray, rows_per_chunk: int) -> list[tuple[int, int]]:
    """The prompts cut into ranges [first, last) of whole prompts of about `rows_per_chunk`
    token rows each (a longer prompt alone)."""
    ranges, first = [], 0
    n = len(offsets) - 1
    while first < n:
        last = int(np.searchsorted(offsets, offsets[first] + rows_per_chunk, side="right")) - 1
        last = min(max(last, first + 1), n)
        ranges.append((first, last))
        first = last
    return ranges


def split_prompts(offsets: np.ndarray, rows_per_chunk: int, parts: int) -> list[list[np.ndarray]]:
    """Cut the prompts into chunks of about `rows_per_chunk` token rows (whole prompts only), dealt
    into at most `parts` contiguous groups."""
    chunks = [offsets[first: last + 1].copy() for first, last in prompt_ranges(offsets, rows_per_chunk)]
    return deal(chunks, parts)


def evaluate_layers(store: StoreHandle, run_key: str, layers: list[int],
                    evaluate: Callable[[np.ndarray], object]) -> list:
    """In-memory metrics (n x n ones, bounded by the caller): `evaluate(z)` on each whole layer."""
    unmap_large_frees()
    arrays = store.open()
    rows = arrays.layout(run_key).rows
    return [evaluate(arrays.read_layers(run_key, [layer], 0, rows)[0]) for layer in layers]


def evaluate_pairs(store: StoreHandle, run_a: str, layers_a: list[int], run_b: str,
                   layers_b: list[int], evaluate: Callable[[object, object], float],
                   prepare: Callable[[np.ndarray], object] | None = None) -> np.ndarray:
    """In-memory pairwise metrics: `evaluate(x, y)` for every layer of A against every layer of B,
    each layer passed through `prepare` once first when given (an RDM, a kernel)."""
    unmap_large_frees()
    arrays = store.open()
    rows = arrays.layout(run_a).rows
    prepare = prepare or (lambda z: z)
    b_layers = {layer: prepare(arrays.read_layers(run_b, [layer], 0, rows)[0]) for layer in layers_b}
    out = np.empty((len(layers_a), len(layers_b)))
    for i, la in enumerate(layers_a):
        x = prepare(arrays.read_layers(run_a, [la], 0, rows)[0])
        for j, lb in enumerate(layers_b):
            out[i, j] = evaluate(x, b_layers[lb])
    return out

