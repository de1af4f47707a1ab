"""One epoch of a run as batches for data-parallel training: which shards each rank reads, in
what order, and a shuffle buffer over them that never holds more than K shards' rows.

Partition (exact coverage). The run's shards are 0..S-1 (`RunLayout.shard_range`). An epoch's
order is a permutation of the full shards drawn from numpy's PCG64 seeded with (seed, epoch), the
same on every rank, followed by the run's short last shard if it has one (or 0..S-1 without
shuffling); rank r of w takes positions r, r+w, r+2w, ... of that order. Every row lies in one
shard and every shard goes to one rank, so every row is read exactly once per epoch across the
ranks. Uneven split: when S is not a multiple of w, the first S mod w ranks get one shard more,
and the short shard falls to one of them, so the ranks' row counts differ by at most one shard's
rows (`rows_of_rank` gives each count up front, so ranks can agree on a number of steps); with
w > S some ranks get nothing.

Shuffle buffer (bounded memory, not a full load). A rank's shards are read one at a time, in its
order, into a buffer of capacity K x shard_rows rows; each batch is drawn uniformly at random
without replacement from the rows in the buffer (numpy PCG64 seeded with (seed, epoch, rank)),
and the buffer is refilled with whole shards whenever one more fits. A row therefore mixes with
the rows of about K neighbouring shards of the shuffled order (the usual shard shuffle plus
shuffle buffer of streaming loaders). K is raised to ceil(batch_size / shard_rows) + 1 when a
batch needs more rows, so every batch but a rank's last is full. Without shuffling, shards are
read in order and rows kept in order, a batch spanning shard boundaries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from actstore.store.array_store import RunLayout

ReadShard = Callable[[int], np.ndarray]  # shard -> its rows, (rows, layers, d)


def epoch_order(layout: RunLayout, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    """The epoch's shard order, the same on every rank. A short last shard stays last, so it goes
    to a rank that gets one shard more than others (or to any rank when all get as many)."""
    if not shuffle:
        return np.arange(layout.num_shards)
    full = layout.num_shards - (layout.rows % layout.shard_rows != 0)
    return np.concatenate([np.random.default_rng([seed, epoch]).permutation(full),
                           np.arange(full, layout.num_shards)])


def shards_of_rank(layout: RunLayout, rank: int, world_size: int, shuffle: bool, seed: int, epoch: int) -> list[int]:
    """The shards rank `rank` reads this epoch, in the order it reads them."""
    return [int(s) for s in epoch_order(layout, shuffle, seed, epoch)[rank::world_size]]


def rows_of_rank(layout: RunLayout, rank: int, world_size: int, shuffle: bool, seed: int, epoch: int) -> int:
    """How many rows rank `rank` reads this epoch (the ranks' counts add up to the run's rows)."""
    return sum(hi - lo for lo, hi in (layout.shard_range(s) for s in
                                      shards_of_rank(layout, rank, world_size, shuffle, seed, epoch)))


def effective_buffer_shards(buffer_shards: int, batch_size: int, shard_rows: int) -> int:
    """K, raised so that a full batch can always be drawn while shards remain to be read."""
    return max(buffer_shards, -(-batch_size // shard_rows) + 1)


@dataclass
class BufferStats:
    """What a stream's buffer held: its capacity and the most rows it ever held at once."""

    capacity_rows: int
    peak_rows: int = 0


class ShuffleBuffer:
    """Rows of whole shards in, random batches out; at most `capacity_rows` rows held at once."""

    def __init__(self, capacity_rows: int, row_shape: tuple[int, ...], dtype: np.dtype,
                 rng: np.random.Generator) -> None:
        self.values = np.empty((capacity_rows, *row_shape), dtype)
        self.rows = np.empty(capacity_rows, np.int64)
        self.size = 0
        self.rng = rng
        self.stats = BufferStats(capacity_rows)

    def room(self) -> int:
        return len(self.rows) - self.size

    def add(self, values: np.ndarray, rows: np.ndarray) -> None:
        if len(rows) > self.room():
            raise ValueError(f"{len(rows)} rows do not fit in the {self.room()} rows left in the buffer")
        self.values[self.size:self.size + len(rows)] = values
        self.rows[self.size:self.size + len(rows)] = rows
        self.size += len(rows)
        self.stats.peak_rows = max(self.stats.peak_rows, self.size)

    def draw(self, m: int) -> tuple[np.ndarray, np.ndarray]:
        """m rows drawn uniformly without replacement; the holes are filled from the tail."""
        chosen = self.rng.choice(self.size, size=m, replace=False)
        values, rows = self.values[chosen], self.rows[chosen]
        kept = self.size - m  # rows [kept, size) are the tail; the chosen rows below it become holes
        holes = chosen[chosen < kept]
        tail_taken = np.zeros(m, bool)
        tail_taken[chosen[chosen >= kept] - kept] = True
        movers = kept + np.flatnonzero(~tail_taken)
        self.values[holes] = self.values[movers]
        self.rows[holes] = self.rows[movers]
        self.size -= m
        return values, rows


def shuffled_batches(read: ReadShard, layout: RunLayout, shards: list[int], batch_size: int, buffer_shards: int,
                     rng: np.random.Generator, row_shape: tuple[int, ...], dtype: np.dtype,
                     stats: list[BufferStats] | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(values, run row indices) per batch, drawn from a buffer of `buffer_shards` shards' rows.
    The buffer's `BufferStats` is appended to `stats` (for a caller that reports or checks it)."""
    k = effective_buffer_shards(buffer_shards, batch_size, layout.shard_rows)
    buffer = ShuffleBuffer(k * layout.shard_rows, row_shape, dtype, rng)
    if stats is not None:
        stats.append(buffer.stats)
    pending = list(shards)
    while pending or buffer.size:
        while pending and layout.shard_range(pending[0])[1] - layout.shard_range(pending[0])[0] <= buffer.room():
            shard = pending.pop(0)
            lo, hi = layout.shard_range(shard)
            buffer.add(read(shard), np.arange(lo, hi))
        yield buffer.draw(min(batch_size, buffer.size))


def sequential_batches(read: ReadShard, layout: RunLayout, shards: list[int], batch_size: int
                       ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(values, run row indices) per batch in the shards' order, rows in store order."""
    carry_values: list[np.ndarray] = []
    carry_rows: list[np.ndarray] = []
    held = 0
    for shard in shards:
        lo, hi = layout.shard_range(shard)
        carry_values.append(read(shard))
        carry_rows.append(np.arange(lo, hi))
        held += hi - lo
        if held < batch_size:
            continue
        values, rows = np.concatenate(carry_values), np.concatenate(carry_rows)
        full = held - held % batch_size
        for start in range(0, full, batch_size):
            yield values[start:start + batch_size], rows[start:start + batch_size]
        carry_values, carry_rows, held = [values[full:]], [rows[full:]], held - full
    if held:
        yield np.concatenate(carry_values), np.concatenate(carry_rows)
