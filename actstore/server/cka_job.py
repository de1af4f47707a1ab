"""The cross-model comparison job: the full CKA matrix of M runs over the same samples.

All layers of all runs are blocks of one streaming accumulator, so the data is read once per
tile (one tile when the accumulator fits the memory limit) and the cost is that of the per-block
Gram/covariance products plus cheap pairwise products, never a pass per layer pair. Feature or
Gram space is chosen by cost within the memory limit (`QueryEngine.cka_mode`): with many blocks
and moderate n, one n x n Gram per block beats the (M(L+1)d)^2 covariance. Progress is
reported per finished map task. Partial accumulators are checkpointed under
`<store>/partials/<result key>/`, so a cancelled job, or one whose server died, resumes from them.
"""

from __future__ import annotations

import pickle
import shutil
import time
from pathlib import Path

import numpy as np
import ray

from actstore.errors import Cancelled, InvalidArgument, ResourceExhausted
from actstore.metrics import similarity as sim
from actstore.server.jobs import JobState
from actstore.server.queries import MetricResult, Provenance, QueryEngine, byte_size
from actstore.store.catalog import RunRecord
from actstore.store.keys import result_key
from actstore.workers.metric_tasks import accumulate, split_ranges

METRIC = "linear_cka_matrix"
CHECKPOINT_SECONDS = 20.0
GROUPS_PER_TASK_SLOT = 4  # more map tasks than CPUs, so progress moves in small steps


def plan(engine: QueryEngine, runs: list[str]) -> tuple[list[RunRecord], str, dict]:
    """Validate the request; returns the runs, the result key and the options."""
    if len(runs) < 1:
        raise InvalidArgument("give at least one run")
    records = [engine.committed_run(r) for r in runs]
    if len({r.run_key for r in records}) != len(records):
        raise InvalidArgument("a run is listed twice")
    for other in records[1:]:
        engine.check_same_samples(records[0], other)
    total_blocks = sum(r.num_layers + 1 for r in records)
    engine.check_matrix(total_blocks, total_blocks)
    for record in records:
        engine.check_finite(record, list(range(record.num_layers + 1)))
    options = {"runs": len(records)}
    key = result_key(METRIC, sim.DEFINITION_VERSION, options, [r.run_key for r in records])
    return records, key, options


def _tiles(engine: QueryEngine, blocks: list[tuple[RunRecord, int]], mode: str, rows: int) -> list[list[int]]:
    """Groups of block indices; a tile is a pair of groups whose union fits the memory limit."""
    limit = engine.settings.max_accumulator_bytes
    widths = [run.width for run, _ in blocks]
    itemsize = engine.row_itemsize(*[run for run, _ in blocks])
    for size in range(len(blocks), 0, -1):
        if engine.accumulator_nbytes(sorted(widths)[-2 * size:], mode, rows, itemsize) <= limit:
            groups = [list(range(i, min(i + size, len(blocks)))) for i in range(0, len(blocks), size)]
            return [sorted(set(a) | set(b)) for i, a in enumerate(groups) for b in groups[i:]]
    need = engine.accumulator_nbytes(sorted(widths)[-2:], mode, rows, itemsize)
    raise ResourceExhausted(f"one block pair needs {byte_size(need)}, over the {byte_size(limit)} "
                            "limit (ACTSTORE_MAX_ACCUMULATOR_BYTES)")


def _sources(blocks: list[tuple[RunRecord, int]], tile: list[int]) -> list[tuple[str, list[int]]]:
    sources: list[tuple[str, list[int]]] = []
    for index in tile:
        run, layer = blocks[index]
        if sources and sources[-1][0] == run.run_key:
            sources[-1][1].append(layer)
        else:
            sources.append((run.run_key, [layer]))
    return sources


def run(engine: QueryEngine, job: JobState, records: list[RunRecord], key: str, options: dict) -> None:
    started = time.perf_counter()
    blocks = [(r, layer) for r in records for layer in range(r.num_layers + 1)]
    rows = records[0].rows
    mode = engine.cka_mode([run.width for run, _ in blocks], rows, engine.row_itemsize(*records))
    tiles = _tiles(engine, blocks, mode, rows)
    groups = split_ranges(rows, engine.settings.shard_rows, engine.parts * GROUPS_PER_TASK_SLOT)
    partials = engine.arrays.root / "partials" / key
    partials.mkdir(parents=True, exist_ok=True)
    size = len(blocks)
    biased, debiased = np.full((size, size), np.nan), np.full((size, size), np.nan)
    total_steps = len(tiles) * len(groups)
    done = 0
    submit = engine.device_task(accumulate)
    for t, tile in enumerate(tiles):
        finished_tile = partials / f"tile-{t}.npz"
        if finished_tile.exists():
            with np.load(finished_tile) as saved:
                biased[np.ix_(tile, tile)], debiased[np.ix_(tile, tile)] = saved["biased"], saved["debiased"]
            done += len(groups)
            continue
        checkpoint = partials / f"tile-{t}.pkl"
        widths = [blocks[i][0].width for i in tile]
        total, finished = sim.SimilarityAccumulator(widths, mode), set()
        if checkpoint.exists():
            total, finished = pickle.loads(checkpoint.read_bytes())
        done += len(finished)
        job.progress(done, total_steps, "tasks",
                     f"resuming from {len(finished)} stored partial results" if finished else "")
        sources = _sources(blocks, tile)
        empty = sim.SimilarityAccumulator(widths, mode)
        queue = [g for g in range(len(groups)) if g not in finished]
        pending: dict = {}
        saved_at = time.monotonic()
        try:
            while queue or pending:
                # a bounded window: cancelling submits no more (a ray.cancel racing a finishing task
                # can crash the driver) and the in-flight results still go into the checkpoint
                while queue and len(pending) < 2 * engine.parts:
                    g = queue.pop(0)
                    pending[submit(str(engine.arrays.root), engine.settings.compressor, sources, groups[g],
                                   empty)] = g
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
                for ref in ready:
                    total.merge(ray.get(ref))
                    finished.add(pending.pop(ref))
                    done += 1
                    job.progress(done, total_steps, "tasks")
                if job.cancel_requested.is_set():
                    for ref in ray.wait(list(pending), num_returns=len(pending))[0]:
                        total.merge(ray.get(ref))
                        finished.add(pending.pop(ref))
                    raise Cancelled(f"CKA matrix job cancelled at {len(finished)} of {len(groups)} tasks of tile "
                                    f"{t + 1}; submit it again to resume from the stored partial results")
                if pending and time.monotonic() - saved_at > CHECKPOINT_SECONDS:
                    _save(checkpoint, (total, finished))
                    saved_at = time.monotonic()
        except Cancelled:
            _save(checkpoint, (total, finished))
            raise
        matrices = total.finalize(strip_map=engine.gram_strip_map)
        np.savez(finished_tile, biased=matrices.biased, debiased=matrices.debiased)
        checkpoint.unlink(missing_ok=True)
        biased[np.ix_(tile, tile)], debiased[np.ix_(tile, tile)] = matrices.biased, matrices.debiased
    seconds = time.perf_counter() - started
    arrays = {
        "biased": biased, "debiased": debiased,
        "block_run": np.array([records.index(r) for r, _ in blocks]),
        "block_layer": np.array([layer for _, layer in blocks]),
    }
    run_keys = [r.run_key for r in records]
    result = MetricResult(arrays, {"n": float(rows)},
                          Provenance(METRIC, sim.DEFINITION_VERSION, options, run_keys, False, seconds, key),
                          [f"{mode} space, {len(tiles)} tile(s), {len(groups)} map tasks per tile"])
    # the job runs only when no result is stored or the user asked to recompute (refresh)
    engine.catalog.put_result(key, METRIC, sim.DEFINITION_VERSION, options, run_keys, result.to_bytes(), seconds,
                              replace=True)
    shutil.rmtree(partials, ignore_errors=True)


def _save(path: Path, state) -> None:
    staging = path.with_suffix(".tmp")
    staging.write_bytes(pickle.dumps(state))
    staging.replace(path)
