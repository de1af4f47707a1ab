"""The cross-model comparison job: the full CKA matrix of M runs over the same samples, or the
matrix of any streamed measure (a MOMENTS measure of `actstore.measures`: Procrustes, the shape
metric, CCA, SVCCA, PWCCA, NBS, linear-regression R^2 ...) from the same one pass over the data
(`metrics.similarity.MomentMeasures`, feature space).

All layers of all runs are blocks of one computation, never a pass per layer pair; the cost is
one Gram (or covariance) product per block plus the pairwise products, and the job's memory, all
running map tasks and the reducer together, stays within `max_accumulator_bytes`.

* Gram space, for linear CKA when it costs less (`similarity.cka_mode_costs`; with many blocks
  and moderate n, e.g. M = 32 runs of 7 layers at n = 10,000): `gram_matrix` tiles the n x n
  sample space, every block in every tile, so each Gram entry is formed once (its docstring
  gives the plan).
* Feature space otherwise (n large against the total width, and every streamed measure): the
  blocks are cut into groups and every pair of groups is one tile whose D x D moments, one per
  running map task plus the reducer's, fit the limit (`tiling.CkaSizing.group_size`).

Progress is reported per finished task. Partial results are checkpointed under
`<store>/partials/<result key>/`, so a cancelled job, or one whose server died, resumes from them.

The same bits on any cluster: the rows are cut into the executor's `groups` (a setting, not the
cluster's CPUs), the Gram panels are spread over a fixed number of slots, and every merge takes
the tasks' results in task order (`run_windowed(..., ordered=True)`), never as they arrive.
"""

from __future__ import annotations

import copy
import io
import pickle
import shutil
import time
from pathlib import Path

import numpy as np

from actstore import measures
from actstore.errors import Cancelled, InvalidArgument
from actstore.metrics import similarity as sim
from actstore.server import gram_matrix
from actstore.server.dispatch import gather, run_windowed
from actstore.server.jobs import JobState
from actstore.server.planners import QueryParts
from actstore.server.planners.similarity import constant_layers_note
from actstore.server.requests import measure_options
from actstore.server.results import MetricResult, Provenance
from actstore.server.tiling import chunks, row_itemsize
from actstore.store.atomic import atomic_write_bytes
from actstore.store.catalog import RunRecord
from actstore.store.keys import result_key
from actstore.workers.metric_tasks import accumulate

METRIC = "linear_cka_matrix"
CHECKPOINT_SECONDS = 20.0
GROUPS_PER_TASK_SLOT = 4  # Gram tiles per task slot, so progress moves in small steps


def plan(parts: QueryParts, runs: list[str], measure: str = "", strict: bool = False,
         **given: object) -> tuple[list[RunRecord], str, dict]:
    """Validate the request; returns the runs, the result key and the options. `measure`: empty
    for linear CKA, else a MOMENTS measure, whose options `given` are resolved here, once (its
    identifier and options go in the result's options). `strict`: an option the measure does not
    take is refused; otherwise it is not read (the legacy wire field alpha, which old clients send
    for every measure, and requests stored by older servers, which a resume replays)."""
    if len(runs) < 1:
        raise InvalidArgument("give at least one run")
    spec = None
    if measure:
        try:
            spec = measures.get(measure, needs=measures.MOMENTS)
        except InvalidArgument:
            streamed = ", ".join(m.identifier for m in measures.measures(measures.MOMENTS))
            raise InvalidArgument(f"the matrix job computes linear CKA or a streamed measure ({streamed}), not "
                                  f"{measure!r}: ask for {measure} between run pairs instead") from None
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
    options = {"runs": len(records)}
    if spec is not None:
        taken = given if strict else spec.taken(given)
        options.update(measure_options(spec, spec.resolve(taken, parts.checks.settings)))
    key = result_key(_metric(options), _version(options), options, [r.run_key for r in records])
    return records, key, options


def _metric(options: dict) -> str:
    """The result's metric name: linear CKA's, or the measure's identifier."""
    return options.get("identifier", METRIC)


def _version(options: dict) -> int:
    """The result's definition version: linear CKA's, or the measure's."""
    return measures.get(options["measure"]).version if "measure" in options else sim.DEFINITION_VERSION


def _finish(accumulator, options: dict, strip_map) -> dict[str, np.ndarray]:
    """A tile's named matrices: biased and debiased CKA, or the measure's values."""
    if "measure" not in options:
        matrices = accumulator.finalize(strip_map=strip_map)
        return {"biased": matrices.biased, "debiased": matrices.debiased}
    blocks = list(range(len(accumulator.block_widths)))
    spec = measures.get(options["measure"])
    measure = spec.build({option.name: options[option.name] for option in spec.options})
    return {"values": accumulator.finalize(measure, blocks, blocks)}


def tile_groups(parts: QueryParts, blocks: list[tuple[RunRecord, int]], mode: str, rows: int) -> list[list[int]]:
    """Groups of block indices; a tile is a pair of groups whose accumulator, at the peak of its
    finalize and with one state per running map task, fits the memory limit."""
    itemsize = row_itemsize(*[run for run, _ in blocks])
    size = parts.sizing.group_size(len(blocks), [run.width for run, _ in blocks], mode, rows, itemsize,
                                   tasks=parts.executor.parts)
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


def gram_plan(parts: QueryParts, blocks: list[tuple[RunRecord, int]], rows: int) -> gram_matrix.GramPlan | None:
    """The Gram-space plan (`gram_matrix`) of a linear CKA matrix when it costs less than feature
    space and one-shard panels fit the memory limit; None for the feature-space tiles."""
    widths = [run.width for run, _ in blocks]
    costs = sim.cka_mode_costs(widths, rows)
    if costs["gram"] >= costs["feature"]:
        return None
    executor = parts.executor
    return gram_matrix.plan(widths, rows, executor.settings.shard_rows, row_itemsize(*[r for r, _ in blocks]),
                            max(r.width * (r.num_layers + 1) for r, _ in blocks), parts.sizing.limit,
                            executor.parts, GROUPS_PER_TASK_SLOT, parts.sizing.worker_bytes,
                            slots=max(1, executor.groups // GROUPS_PER_TASK_SLOT))


def run(parts: QueryParts, job: JobState, records: list[RunRecord], key: str, options: dict) -> None:
    started = time.perf_counter()
    executor = parts.executor
    blocks = [(r, layer) for r in records for layer in range(r.num_layers + 1)]
    rows = records[0].rows
    partials = executor.store.path / "partials" / key
    partials.mkdir(parents=True, exist_ok=True)
    groups = executor.row_groups(rows)
    gram = None if "measure" in options else gram_plan(parts, blocks, rows)
    if gram is not None:
        progress = _Progress(job, len(groups) + len(gram.tiles))
        biased, debiased = gram_matrix.run_tiles(executor, job, progress, _sources(blocks, list(range(len(blocks)))),
                                                 [run.width for run, _ in blocks], rows, gram, groups,
                                                 partials / "gram.pkl")
        matrices = {"biased": biased, "debiased": debiased}
        note = f"{gram.describe()}, {len(groups)} map tasks for the means"
    else:
        matrices, note = _feature_tiles(parts, job, blocks, rows, groups, partials, options)
    seconds = time.perf_counter() - started
    arrays = {
        **matrices,
        "block_run": np.array([records.index(r) for r, _ in blocks]),
        "block_layer": np.array([layer for _, layer in blocks]),
    }
    run_keys = [r.run_key for r in records]
    notes = [note]
    if "biased" in matrices and np.isnan(np.diag(matrices["biased"])).any():
        notes.append(constant_layers_note([(blocks[k][0].run_key, blocks[k][1])
                                           for k in np.flatnonzero(np.isnan(np.diag(matrices["biased"])))], rows))
    result = MetricResult(arrays, {"n": float(rows)},
                          Provenance(_metric(options), _version(options), options, run_keys, False, seconds, key),
                          notes)
    # the job runs only when no result is stored or the user asked to recompute (refresh)
    parts.results.store(result, replace=True)
    shutil.rmtree(partials, ignore_errors=True)


def _feature_tiles(parts: QueryParts, job: JobState, blocks: list[tuple[RunRecord, int]], rows: int, groups: list,
                   partials: Path, options: dict) -> tuple[dict[str, np.ndarray], str]:
    """Accumulators of pairs of block groups, each group pair one tile (`tile_groups`): the named
    matrices and the result's note."""
    executor = parts.executor
    measure = "measure" in options  # a streamed measure: always the feature-space moments
    mode = "feature" if measure else parts.sizing.mode([run.width for run, _ in blocks], rows,
                                                       row_itemsize(*[r for r, _ in blocks]))
    tiles = tile_groups(parts, blocks, mode, rows)
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
    return matrices, f"{mode} space, {len(tiles)} tile(s), {len(groups)} map tasks per tile"


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

    try:
        complete = run_windowed([g for g in range(len(groups)) if g not in finished],
                                lambda g: submit(executor.store, sources, groups[g], empty),
                                2 * executor.parts, collect, job.cancel_requested, checkpoint_now_and_then,
                                ordered=True)
    except Cancelled:  # raised by the progress report of a job cancelled meanwhile
        complete = False
    if not complete:
        atomic_write_bytes(checkpoint, pickle.dumps((total, finished)))
        raise Cancelled(f"CKA matrix job cancelled at {len(finished)} of {len(groups)} tasks of {name}; submit "
                        "it again to resume from the stored partial results")
    return total
