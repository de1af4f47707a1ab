"""The matrix job in Gram space: tiles of the n x n sample space, every block in every tile.

The plan, and why (M runs of L+1 blocks, B = M(L+1) blocks of width d, D = B d, n samples):

* Cost. Biased and debiased CKA of all block pairs need `S = <K_b, K_b'>_F` of the centred Grams
  and their diagonals (`similarity.gram_tiles`). Gram space costs `n^2 D / 2` multiply-adds for
  the Grams (each entry of each Gram once) plus `n^2 B^2 / 4` for the pairwise products, against
  `n D^2 / 2` in feature space; at n = 10,000 and M = 32 (B = 224, d = 384) that is 6.8e12
  against 3.7e13.
* Why tiles of samples, not of blocks. One n x n Gram is 800 MB at n = 10,000, so a tile of
  blocks whose Grams fit the 1 GiB limit holds one block, and visiting every pair of such tiles
  forms each Gram B times. The pairwise sum runs over Gram entries instead, so the entries are
  cut: the upper triangle of the n x n sample space is tiled by pairs of row panels `R <= C`, and
  each tile forms, for every block at once, `Xc_b[R] Xc_b[C]^T` (one piece of rows at a time)
  and adds the syrk of those entries to S. Each Gram entry is formed once; no Gram is ever held.
* Memory. A tile task holds R's rows of all blocks as stored (float16 stays), one shard of C,
  and one piece of entries (B x piece x shard float64); the reducer holds S and the B x n Gram
  diagonals. Each running task's worker process also grows by `metric_worker_bytes` beside those
  arrays when it first runs a metric task (imports, Ray's task state, BLAS buffers: 88 MiB
  measured), and hands large freed buffers back at once (`workers/heap.py`), so the arrays
  are what it adds. The panel height is the largest (whole shards) with which `executor.parts`
  running tasks plus the reducer fit `max_accumulator_bytes`, and small enough to give every
  task slot several tiles. What a larger limit buys is fewer panels: the data is read once for
  the means and once more per panel.
* Passes. (1) Column means of every block (`ColumnMeans`, one read). (2) The k(k+1)/2 tiles of k
  panels, in Ray tasks; each returns its B x B sum and, for a square, the diagonals of R.
  Progress is per tile. The sums, the diagonals and the finished tiles are checkpointed under
  `<store>/partials/<result key>/`, so a cancelled or killed job resumes.
"""

from __future__ import annotations

import math
import pickle
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import ray

from actstore.errors import Cancelled
from actstore.metrics.similarity.gram_tiles import ColumnMeans, cka_from_gram_sums, rectangle_nbytes
from actstore.server.dispatch import gather, run_windowed
from actstore.server.executor import remote
from actstore.server.jobs import JobState
from actstore.store.atomic import atomic_write_bytes
from actstore.workers.gram_tasks import gram_tile
from actstore.workers.metric_tasks import accumulate

CHECKPOINT_SECONDS = 20.0
FLOAT64_BYTES = 8


@dataclass(frozen=True)
class GramPlan:
    panel_rows: int
    piece_rows: int
    panels: list[tuple[int, int]]
    memory_bytes: int  # the running tile tasks and the reducer together

    @property
    def tiles(self) -> list[tuple[int, int]]:
        return [(i, j) for i in range(len(self.panels)) for j in range(i, len(self.panels))]

    def describe(self) -> str:
        return (f"gram space, {len(self.panels)} panels of {self.panel_rows} rows, {len(self.tiles)} tile tasks, "
                f"pieces of {self.piece_rows} rows")


def reducer_nbytes(blocks: int, n: int) -> int:
    """The reducer's S and Gram diagonals, twice (the checkpoint pickles a copy)."""
    return 2 * FLOAT64_BYTES * (blocks * n + blocks**2)


def task_nbytes(widths: list[int], panel_rows: int, shard_rows: int, piece_rows: int, itemsize: int,
                run_width: int) -> int:
    """One tile task: R's rows as stored (plus one run's read buffer), one shard of C (plus its
    buffer), and `rectangle_products`' working set."""
    total = sum(widths)
    held = itemsize * (total * (panel_rows + 2 * shard_rows) + run_width * panel_rows)
    return held + rectangle_nbytes(len(widths), max(widths), piece_rows, shard_rows)


def plan(widths: list[int], n: int, shard_rows: int, itemsize: int, run_width: int, limit: int,
         tasks: int, tiles_per_task: int, worker_bytes: int = 0, slots: int | None = None) -> GramPlan | None:
    """The tallest panels (whole shards) such that `tasks` tile tasks, each in a worker process that
    grows by `worker_bytes` beside the task's arrays, and the reducer fit `limit`, and at least
    `tiles_per_task` tiles for each of `slots` task slots (default `tasks`; a number fixed by the
    settings gives the same panels, so the same sums, on a cluster of any size while the memory
    does not bind); None when even one-shard panels do not fit."""
    blocks = len(widths)
    budget = (limit - reducer_nbytes(blocks, n)) // max(1, tasks) - worker_bytes
    piece_rows = int(min(shard_rows, max(1, budget // 4 // (FLOAT64_BYTES * blocks * shard_rows))))
    if budget <= 0 or task_nbytes(widths, shard_rows, shard_rows, piece_rows, itemsize, run_width) > budget:
        return None
    shards = -(-n // shard_rows)
    fitting = 1
    while fitting < shards and task_nbytes(widths, (fitting + 1) * shard_rows, shard_rows, piece_rows,
                                           itemsize, run_width) <= budget:
        fitting += 1
    # k panels give k(k+1)/2 tiles: enough for every task slot to take several
    wanted = math.ceil((math.sqrt(1 + 8 * tiles_per_task * (slots or tasks)) - 1) / 2)
    per_panel = max(1, min(fitting, -(-shards // wanted)))
    panel_rows = per_panel * shard_rows
    panels = [(start, min(start + panel_rows, n)) for start in range(0, n, panel_rows)]
    memory = max(1, tasks) * (worker_bytes + task_nbytes(widths, panel_rows, shard_rows, piece_rows, itemsize,
                                                         run_width))
    return GramPlan(panel_rows, piece_rows, panels, memory + reducer_nbytes(blocks, n))


def run_tiles(executor, job: JobState, progress, sources: list[tuple[str, list[int]]], widths: list[int],
              n: int, gram_plan: GramPlan, groups: list, checkpoint: Path) -> tuple[np.ndarray, np.ndarray]:
    """Both passes; returns (biased, debiased). `progress.advance()` counts the means' map tasks,
    then the tiles."""
    state = pickle.loads(checkpoint.read_bytes()) if checkpoint.exists() else None
    if state is None:
        means = _means(executor, progress, sources, widths, groups, job)
        state = {"means": means, "cross": np.zeros((len(widths),) * 2), "diagonals": np.zeros((len(widths), n)),
                 "finished": set()}
    else:
        progress.advance(len(groups) + len(state["finished"]),
                         f"resuming from {len(state['finished'])} stored tiles")
    tiles = gram_plan.tiles
    submit = remote(gram_tile, num_cpus=1).remote
    means_ref = ray.put(state["means"])
    saved_at = time.monotonic()

    def collect(t: int, ref) -> None:
        cross, diagonal = gather(ref)
        state["cross"] += cross
        if diagonal is not None:
            first, last = gram_plan.panels[tiles[t][0]]
            state["diagonals"][:, first:last] = diagonal
        state["finished"].add(t)
        progress.advance()

    def checkpoint_now_and_then() -> None:
        nonlocal saved_at
        if time.monotonic() - saved_at > CHECKPOINT_SECONDS:
            atomic_write_bytes(checkpoint, pickle.dumps(state))
            saved_at = time.monotonic()

    def start(t: int):
        i, j = tiles[t]
        return submit(executor.store, sources, gram_plan.panels[i], gram_plan.panels[j],
                      executor.settings.shard_rows, means_ref, gram_plan.piece_rows)

    try:
        complete = run_windowed([t for t in range(len(tiles)) if t not in state["finished"]], start,
                                2 * executor.parts, collect, job.cancel_requested, checkpoint_now_and_then,
                                ordered=True)
    except Cancelled:  # raised by the progress report of a job cancelled meanwhile
        complete = False
    if not complete:
        atomic_write_bytes(checkpoint, pickle.dumps(state))
        raise Cancelled(f"CKA matrix job cancelled at {len(state['finished'])} of {len(tiles)} tiles; submit it "
                        "again to resume from the stored partial results")
    return cka_from_gram_sums(state["cross"], state["diagonals"], n)


def _means(executor, progress, sources, widths, groups, job: JobState) -> list[np.ndarray]:
    submit = remote(accumulate, num_cpus=1).remote
    total = ColumnMeans(widths)

    def collect(_, ref) -> None:
        total.merge(gather(ref))
        progress.advance()

    complete = run_windowed(range(len(groups)), lambda g: submit(executor.store, sources, groups[g],
                                                                 ColumnMeans(widths)),
                            2 * executor.parts, collect, job.cancel_requested, ordered=True)
    if not complete:
        raise Cancelled("CKA matrix job cancelled while computing the column means; submit it again")
    return total.finalize()
