"""How CKA accumulators are sized and tiled to the memory limit, for queries and the matrix job.

A CKA accumulator over many blocks (layers) runs in feature or Gram space, whichever is cheaper
and fits ``max_accumulator_bytes``. When even the cheaper one does not fit, the blocks are cut
into groups, and every pair of groups is one tile whose accumulator fits.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from actstore.config import Settings
from actstore.errors import ResourceExhausted
from actstore.metrics import similarity as sim
from actstore.server.executor import Executor
from actstore.server.runs import byte_size
from actstore.store.array_store import READ_ITEMSIZE
from actstore.store.catalog import RunRecord


def row_itemsize(*runs: RunRecord) -> int:
    """Bytes per value of the rows a Gram-space accumulator keeps: float16 stays float16,
    float32, bfloat16 and int8 (read back as float32) take 4."""
    return max(READ_ITEMSIZE[run.dtype] for run in runs)


class CkaSizing:
    def __init__(self, settings: Settings, executor: Executor) -> None:
        self.limit = settings.max_accumulator_bytes
        self.worker_bytes = settings.metric_worker_bytes
        self.executor = executor

    @property
    def strip_tasks(self) -> int:
        """The tasks a Gram-space finalize spreads its strips over (the cluster may grow)."""
        return self.executor.parts

    def mode(self, widths: list[int], rows: int, itemsize: int) -> str:
        """Feature or Gram space for a CKA accumulator over these blocks: the cheaper one whose
        memory fits (`similarity.choose_cka_mode`; the Gram strips run in `strip_tasks` tasks)."""
        return sim.choose_cka_mode(widths, rows, self.limit, itemsize=itemsize, strip_tasks=self.strip_tasks)

    def nbytes(self, widths: list[int], mode: str, rows: int, itemsize: int) -> int:
        """What a CKA accumulator is held to against the limit: the peak of its finalize. Feature
        space: the O(D^2) state plus finalize's 2 D^2 temporaries, whatever n. Gram space: the
        rows, their concatenation, the copy the strip tasks read and one Gram strip per task."""
        return sim.SimilarityAccumulator.estimate_peak_nbytes(widths, mode, rows, itemsize=itemsize,
                                                              strip_tasks=self.strip_tasks)

    def group_size(self, count: int, widest: list[int], mode: str, rows: int, itemsize: int, tasks: int = 0) -> int:
        """The most blocks per group such that the accumulator of two groups of the widest blocks
        fits the limit at the peak of its finalize, together with the states of `tasks` map tasks
        running at the same time (a job's map tasks each hold one)."""
        widest = sorted(widest)

        def nbytes(widths: list[int]) -> int:
            held = sim.SimilarityAccumulator.estimate_nbytes(widths, mode, rows, itemsize)
            return self.nbytes(widths, mode, rows, itemsize) + tasks * held

        for size in range(count, 0, -1):
            if nbytes(widest[-2 * size:]) <= self.limit:
                return size
        need = nbytes(widest[-2:])
        raise ResourceExhausted(f"one block pair needs {byte_size(need)} of accumulator, over the "
                                f"{byte_size(self.limit)} limit (ACTSTORE_MAX_ACCUMULATOR_BYTES)")

    def pair_tiles(self, a: RunRecord, b: RunRecord, la: list[int], lb: list[int], mode: str, itemsize: int):
        """Split the layer lists so one tile's accumulator fits `max_accumulator_bytes`."""
        widest = [a.width] * len(la) + [b.width] * len(lb)
        size = self.group_size(max(len(la), len(lb)), widest, mode, a.rows, itemsize)
        return [(tile_a, tile_b) for tile_a in chunks(la, size) for tile_b in chunks(lb, size)]


def chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def pair_blocks(a: RunRecord, b: RunRecord, la: list[int], lb: list[int]
                ) -> tuple[list[tuple[str, list[int]]], list[int], list[int]]:
    """The accumulator's blocks (as read sources) and where each requested layer sits in them."""
    if a.run_key == b.run_key:
        union = sorted(set(la) | set(lb))
        where = {layer: i for i, layer in enumerate(union)}
        return [(a.run_key, union)], [where[x] for x in la], [where[x] for x in lb]
    return ([(a.run_key, la), (b.run_key, lb)], list(range(len(la))),
            [len(la) + j for j in range(len(lb))])


def fill_tiles(a: RunRecord, b: RunRecord, la: list[int], lb: list[int], tiles: list[tuple[list[int], list[int]]],
               names: tuple[str, ...],
               compute: Callable[[list[tuple[str, list[int]]], list[int], list[int]], dict[str, np.ndarray]]
               ) -> dict[str, np.ndarray]:
    """The len(la) x len(lb) matrices ``names`` of a tiled query, filled tile by tile
    (`CkaSizing.pair_tiles`): ``compute(sources, ia, ib)`` gives each one's block over one tile, its
    rows the tile's A layers and its columns its B layers (``sources``, ``ia``, ``ib``: `pair_blocks`
    of the tile)."""
    matrices = {name: np.empty((len(la), len(lb))) for name in names}
    pos_a = {layer: i for i, layer in enumerate(la)}
    pos_b = {layer: j for j, layer in enumerate(lb)}
    for tile_a, tile_b in tiles:
        sources, ia, ib = pair_blocks(a, b, tile_a, tile_b)
        where = np.ix_([pos_a[x] for x in tile_a], [pos_b[x] for x in tile_b])
        for name, block in compute(sources, ia, ib).items():
            matrices[name][where] = block
    return matrices
