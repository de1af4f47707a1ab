"""Dry runs: what a capture or a CKA matrix job would cost, without running it.

A capture plan checks the request exactly as a submit does (same errors) and gives each site's run
key, the rows and shards per run, the raw bytes, the stored bytes estimated with the compression
measured on similar committed runs (same dtype; the same model's runs first; the dtype alone when
there are none), and the wall time estimated from this server's recent finished capture jobs of
the same model (rows per second, submit to done). A CKA matrix plan is the matrix job's own plan:
its mode, tiles, map tasks, the peak accumulator memory of the largest tile, the FLOPs of every
tile's accumulation (2 x `similarity.cka_mode_costs`) and the bytes read.
"""

from __future__ import annotations

from actstore.errors import Unavailable
from actstore.metrics import similarity as sim
from actstore.records import CapturePlanInfo, CKAMatrixPlanInfo
from actstore.server import cka_job
from actstore.server.capture_job import CaptureJobs, CaptureRequest, CaptureTarget
from actstore.server.dispatch import get_or_raise
from actstore.server.planners import QueryParts
from actstore.server.runs import stored_ratio
from actstore.server.tiling import row_itemsize
from actstore.store.array_store import ITEMSIZE, RunLayout
from actstore.store.catalog import Catalog, RunRecord

RECENT_JOBS = 20  # finished capture jobs the rate is taken from


class CostPlanner:
    def __init__(self, catalog: Catalog, captures: CaptureJobs, parts: QueryParts) -> None:
        self.catalog = catalog
        self.captures = captures
        self.parts = parts
        self.arrays = captures.arrays

    def capture(self, request: CaptureRequest) -> CapturePlanInfo:
        target = self.captures.target(request)
        model, dataset = target.model, target.dataset
        stored = [(found := self.catalog.runs.find(key)) is not None and found.status == "committed"
                  for key in target.keys]
        rows = self._rows(target)
        settings = self.captures.settings
        shard_rows = RunLayout.new(dataset.n, rows, model.num_layers + 1, model.hidden_size, target.dtype,
                                   target.pooling, settings.shard_rows, settings.shard_mb).shard_rows
        per_run = rows * (model.num_layers + 1) * model.hidden_size * ITEMSIZE[target.dtype]
        raw = per_run * sum(not s for s in stored)
        ratio, ratio_basis = self._compression(model.digest, target.dtype)
        seconds, seconds_basis = self._seconds(model.digest, rows, any(not s for s in stored))
        return CapturePlanInfo(
            sites=dict(zip(target.sites, target.keys)), stored=dict(zip(target.sites, stored)), n=dataset.n,
            rows=rows, num_shards=-(-rows // shard_rows), num_layers=model.num_layers, width=model.hidden_size,
            dtype=target.dtype, pooling=target.pooling, max_len=target.max_len, raw_bytes=raw,
            stored_bytes=int(raw * ratio), compression=ratio, compression_basis=ratio_basis, seconds=seconds,
            seconds_basis=seconds_basis)

    def _rows(self, target: CaptureTarget) -> int:
        dataset = target.dataset
        if target.pooling != "tokens":
            return dataset.n
        for run in self.catalog.runs.all(target.model.digest, dataset.digest):  # any site's run counted them already
            if run.pooling == "tokens" and run.max_len == target.max_len:
                return run.rows
        task = self.captures.pool.token_rows(target.model.path, dataset.path, target.max_len, spans=False)
        offsets, _ = get_or_raise(task, lambda cause: Unavailable(f"tokenising the dataset failed: {cause}"))
        return int(offsets[-1])

    def _compression(self, model_digest: str, dtype: str) -> tuple[float, str]:
        """Stored / raw bytes of up to SIMILAR_RUNS committed runs of this dtype, the model's own first."""
        measured = stored_ratio(self.catalog, self.arrays, model_digest, dtype)
        if measured is None:
            return 1.0, f"dtype only ({ITEMSIZE[dtype]} bytes per value, no committed {dtype} run to measure)"
        ratio, runs, mine = measured
        return ratio, f"measured on {runs} committed {dtype} run(s), {mine} of this model"

    def _seconds(self, model_digest: str, rows: int, anything: bool) -> tuple[float, str]:
        """Rows / (rows per second of this model's recent finished captures, submit to done)."""
        if not anything:
            return 0.0, "every run is stored: nothing to compute"
        done_rows = seconds = jobs = 0
        for request, took in self.catalog.jobs.finished_captures(RECENT_JOBS):
            if request.get("model") != model_digest:
                continue
            run = self._first_run(request)
            if run is not None:
                done_rows, seconds, jobs = done_rows + run.rows, seconds + took, jobs + 1
        if not jobs or seconds <= 0:
            return 0.0, "no finished capture of this model on this server yet"
        rate = done_rows / seconds
        return rows / rate, f"{rate:.1f} rows/s over {jobs} recent capture job(s) of this model"

    def _first_run(self, request: dict) -> RunRecord | None:
        keys = request.get("run_keys") or []
        return self.catalog.runs.find(keys[0]) if keys else None

    def cka_matrix(self, runs: list[str]) -> CKAMatrixPlanInfo:
        parts = self.parts
        records, key, _ = cka_job.plan(parts, runs)
        blocks = [(r, layer) for r in records for layer in range(r.num_layers + 1)]
        rows = records[0].rows
        itemsize = row_itemsize(*records)
        groups = parts.executor.row_groups(rows)  # as the job cuts them (`cka_job.run`)
        gram = cka_job.gram_plan(parts, blocks, rows)
        if gram is not None:  # the sample-space tiles of `gram_matrix`: each Gram entry once
            data = sum(rows * run.width * ITEMSIZE[run.dtype] for run, _ in blocks)
            flops = 2 * sim.cka_mode_costs([run.width for run, _ in blocks], rows)["gram"]
            return CKAMatrixPlanInfo([r.run_key for r in records], len(blocks), rows, "gram", len(gram.tiles),
                                     len(groups) + len(gram.tiles), gram.memory_bytes, parts.sizing.limit,
                                     float(flops), data * (len(gram.panels) + 1),
                                     self.catalog.results.get_record(key) is not None)
        mode = parts.sizing.mode([run.width for run, _ in blocks], rows, itemsize)
        tiles = cka_job.tile_groups(parts, blocks, mode, rows)
        widths = [[blocks[i][0].width for i in tile] for tile in tiles]
        memory = max(parts.sizing.nbytes(w, mode, rows, itemsize) for w in widths)
        flops = sum(2 * sim.cka_mode_costs(w, rows)[mode] for w in widths)
        read = sum(rows * blocks[i][0].width * ITEMSIZE[blocks[i][0].dtype] for tile in tiles for i in tile)
        return CKAMatrixPlanInfo([r.run_key for r in records], len(blocks), rows, mode, len(tiles),
                                 len(tiles) * len(groups), memory, parts.sizing.limit, float(flops), read,
                                 self.catalog.results.get_record(key) is not None)
