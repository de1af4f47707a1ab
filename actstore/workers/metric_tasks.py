"""The map side of metric jobs: read a range of shards, feed a streaming accumulator, return it.

A task reads one shard's rows of each requested layer at a time, so its memory is one chunk per
layer plus the accumulator, whatever n is. The job manager merges the returned accumulators.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Protocol

from actstore.store.arrays import ZarrArrayStore


class Accumulator(Protocol):
    def update(self, blocks: list) -> None: ...


def accumulate(store_root: str, compressor: str, sources: list[tuple[str, list[int]]],
               ranges: list[tuple[int, int]], accumulator: Accumulator) -> Accumulator:
    """Feed rows [start, stop) of every range to `accumulator`; `sources` lists (run key, layers)
    in the accumulator's block order."""
    arrays = ZarrArrayStore(Path(store_root), compressor)
    accumulator = copy.deepcopy(accumulator)  # Ray hands arguments over as read-only buffers
    for start, stop in ranges:
        blocks = []
        for run_key, layers in sources:
            blocks.extend(arrays.read_layers(run_key, layers, start, stop))
        accumulator.update(blocks)
    return accumulator


def split_ranges(rows: int, shard_rows: int, parts: int) -> list[list[tuple[int, int]]]:
    """Shard-aligned row ranges, dealt into at most `parts` contiguous groups of near-equal size."""
    shards = [(s, min(s + shard_rows, rows)) for s in range(0, rows, shard_rows)]
    parts = max(1, min(parts, len(shards)))
    size, extra = divmod(len(shards), parts)
    groups, at = [], 0
    for p in range(parts):
        take = size + (1 if p < extra else 0)
        groups.append(shards[at: at + take])
        at += take
    return groups
