"""The cross-model comparison job: the full CKA matrix of M runs over the same samples, or the
matrix of any streamed measure (`options.STREAMED_MEASURES`: Procrustes, shape metric, CCA, SVCCA,
PWCCA) from the same one pass over the data (`metrics.similarity.MomentMeasures`, feature space).

All layers of all runs are blocks of one streaming accumulator, so the data is read once per
tile (one tile when the accumulator fits the memory limit) and the cost is that of the per-block
Gram/covariance products plus cheap pairwise products, never a pass per layer pair. Feature or
Gram space is chosen by cost within the memory limit (`tiling.CkaSizing.mode`): with many blocks
and moderate n, one n x n Gram per block beats the (M(L+1)d)^2 covariance. Progress is
reported per finished map task. Partial accumulators are checkpointed under
`<store>/partials/<result key>/`, so a cancelled job, or one whose server died, resumes from them.
"""

from __future__ import annotations

import copy
import io
import pickle
import shutil
import time
from pathlib import Path

import numpy as np

from actstore.errors import Cancelled, InvalidArgument
from actstore.metrics import similarity as sim
from actstore.options import STREAMED_MEASURES
from actstore.server.dispatch import gather, run_windowed
from actstore.server.jobs import JobState
from actstore.server.planners import QueryParts
from actstore.server.planners.measures import streamed_options
from actstore.server.results import MetricResult, Provenance
from actstore.server.tiling import chunks, row_itemsize
from actstore.store.atomic import atomic_write_bytes
from actstore.store.catalog import RunRecord
from actstore.store.keys import result_key
from actstore.workers.metric_tasks import accumulate

METRIC = "linear_cka_matrix"
CHECKPOINT_SECONDS = 20.0
GROUPS_PER_TASK_SLOT = 4  # more map tasks than CPUs, so progress moves in small steps


def plan(parts: QueryParts, runs: list[str], measure: str = "", alpha: float = 1.0,
         **_unused) -> tuple[list[RunRecord], str, dict]:
    """Validate the request; returns the runs, the result key and the options. `measure`: empty
    for linear CKA, else one of the streamed measures (its identifier goes in the options)."""
    if len(runs) < 1:
        raise InvalidArgument("give at least one run")
    if measure and measure not in STREAMED_MEASURES:
        raise InvalidArgument(f"the matrix job computes linear CKA or a streamed measure "
                              f"({', '.join(STREAMED_MEASURES)}), not {measure!r}: ask for {measure} between run "
                              "pairs instead")
    checks = parts.checks
    records = [checks.committed_run(r) for r in runs]
    if len({r.run_key for r in records}) != len(records):
        raise InvalidArgument("a run is listed twice")
    for other in records[1:]:
        checks.check_same_samples(records[0], other)
    total_blocks = sum(r.num_layers + 1 for r in records)
    checks.check_matrix(total_blocks, total_blocks)
    for record in records:
        checks.check_finite(record, list(range(record.num_layers + 1)))
    options = {"runs": len(records), **(streamed_options(measure, alpha) if measure else {})}
    key = result_key(_metric(options), sim.DEFINITION_VERSION, options, [r.run_key for r in records])
    return records, key, options


def _metric(options: dict) -> str:
    """The result's metric name: linear CKA's, or the measure's identifier."""
    return options.get("identifier", METRIC)


def _finish(accumulator, options: dict, strip_map) -> dict[str, np.ndarray]:
    """A tile's named matrices: biased and debiased CKA, or the measure's values."""
    if "measure" not in options:
        matrices = accumulator.finalize(strip_map=strip_map)
        return {"biased": matrices.biased, "debiased": matrices.debiased}
    blocks = list(range(len(accumulator.block_widths)))
    measure = sim.moment_measure(options["measure"], options.get("alpha", 1.0))
    return {"values": accumulator.finalize(measure, blocks, blocks)}


def tile_groups(parts: QueryParts, blocks: list[tuple[RunRecord, int]], mode: str, rows: int) -> list[list[int]]:
    """Groups of block indices; a tile is a pair of groups whose union fits the memory limit."""
    itemsize = row_itemsize(*[run for run, _ in blocks])
    size = parts.sizing.group_size(len(blocks), [run.width for run, _ in blocks], mode, rows, itemsize)
    groups = chunks(list(range(len(blocks))), size)
    return [sorted(set(a) | set(b)) for i, a in enumerate(groups) for b in groups[i:]]


def _sources(blocks: list[tuple[RunRecord, int]], tile: list[int]) -> list[tuple[str, list[int]]]:
    sources: list[tuple[str, list[int]]] = []
    for index in tile:
        run, layer = blocks[index]
        if sources and sources[-1][0] == run.run_key:
            sources[-1][1].append(layer)
        else:
            sources.append((run.run_key, [layer]))
    return sources


def run(parts: QueryParts, job: JobState, records: list[RunRecord], key: str, options: dict) -> None:
    started = time.perf_counter()
    executor = parts.executor
    blocks = [(r, layer) for r in records for layer in range(r.num_layers + 1)]
    rows = records[0].rows
    measure = "measure" in options  # a streamed measure: always the feature-space moments
    mode = "feature" if measure else parts.sizing.mode([run.width for run, _ in blocks], rows, row_itemsize(*records))
    tiles = tile_groups(parts, blocks, mode, rows)
    groups = executor.row_groups(rows, executor.parts * GROUPS_PER_TASK_SLOT)
    partials = executor.store.path / "partials" / key
    partials.mkdir(parents=True, exist_ok=True)
    size = len(blocks)
    matrices = {name: np.full((size, size), np.nan) for name in (("values",) if measure else ("biased", "debiased"))}
    progress = _Progress(job, len(tiles) * len(groups))
    for t, tile in enumerate(tiles):
        finished_tile = partials / f"tile-{t}.npz"
        if finished_tile.exists():
            with np.load(finished_tile) as saved:
                for name, matrix in matrices.items():
                    matrix[np.ix_(tile, tile)] = saved[name]
            progress.advance(len(groups), publish=False)  # published with the next tile's first step
            continue
        widths = [blocks[i][0].width for i in tile]
        empty = sim.MomentMeasures(widths) if measure else sim.SimilarityAccumulator(widths, mode)
        accumulator = _run_tile(parts, job, progress, _sources(blocks, tile), empty, groups,
                                partials / f"tile-{t}.pkl", f"tile {t + 1}")
        finished = _finish(accumulator, options, executor.gram_strip_map)
        with io.BytesIO() as buffer:
            np.savez(buffer, **finished)
            atomic_write_bytes(finished_tile, buffer.getvalue())
        (partials / f"tile-{t}.pkl").unlink(missing_ok=True)
        for name, matrix in matrices.items():
            matrix[np.ix_(tile, tile)] = finished[name]
    seconds = time.perf_counter() - started
    arrays = {
        **matrices,
        "block_run": np.array([records.index(r) for r, _ in blocks]),
        "block_layer": np.array([layer for _, layer in blocks]),
    }
    run_keys = [r.run_key for r in records]
    result = MetricResult(arrays, {"n": float(rows)},
                          Provenance(_metric(options), sim.DEFINITION_VERSION, options, run_keys, False, seconds, key),
                          [f"{mode} space, {len(tiles)} tile(s), {len(groups)} map tasks per tile"])
    # the job runs only when no result is stored or the user asked to recompute (refresh)
    parts.results.store(result, replace=True)
    shutil.rmtree(partials, ignore_errors=True)


class _Progress:
    """Finished map tasks over the whole job, published to its watchers."""

    def __init__(self, job: JobState, total: int) -> None:
        self.job, self.total, self.done = job, total, 0

    def advance(self, steps: int = 1, message: str = "", publish: bool = True) -> None:
        self.done += steps
        if publish:
            self.job.progress(self.done, self.total, "tasks", message)


def _run_tile(parts: QueryParts, job: JobState, progress: _Progress, sources: list[tuple[str, list[int]]],
              empty, groups: list, checkpoint: Path, name: str):
    """Map and merge one tile's accumulator (`empty` is a fresh one), resuming from and
    checkpointing to `checkpoint`."""
    executor = parts.executor
    total, finished = copy.deepcopy(empty), set()
    if checkpoint.exists():
        total, finished = pickle.loads(checkpoint.read_bytes())
    progress.advance(len(finished), f"resuming from {len(finished)} stored partial results" if finished else "")
    submit = executor.device_task(accumulate)
    saved_at = time.monotonic()

    def collect(g: int, ref) -> None:
        total.merge(gather(ref))
        finished.add(g)
        progress.advance()

    def checkpoint_now_and_then() -> None:
        nonlocal saved_at
        if time.monotonic() - saved_at > CHECKPOINT_SECONDS:
            atomic_write_bytes(checkpoint, pickle.dumps((total, finished)))
            saved_at = time.monotonic()

    complete = run_windowed([g for g in range(len(groups)) if g not in finished],
                            lambda g: submit(executor.store, sources, groups[g], empty),
                            2 * executor.parts, collect, job.cancel_requested, checkpoint_now_and_then)
    if not complete:
        atomic_write_bytes(checkpoint, pickle.dumps((total, finished)))
        raise Cancelled(f"CKA matrix job cancelled at {len(finished)} of {len(groups)} tasks of {name}; submit "
                        "it again to resume from the stored partial results")
    return total
