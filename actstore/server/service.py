"""The service layer: every operation of the API as a plain method on domain objects.

Servicers only translate protos to these calls. The service owns the catalog (single writer), the
array store and the job manager, and sends model work to Ray.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import ray

from actstore.config import Settings
from actstore.errors import ActStoreError, Cancelled, DataLoss, InvalidArgument, NotFound, Unavailable
from actstore.server import cka_job
from actstore.server.capture_pool import CapturePool
from actstore.server.jobs import JobManager, JobSnapshot, JobState
from actstore.server.queries import QueryEngine
from actstore.store import datasets as ds
from actstore.store.arrays import RunLayout, ZarrArrayStore
from actstore.store.catalog import Catalog, DatasetRecord, ModelRecord, RunRecord
from actstore.store.keys import POOLINGS, STORAGE_DTYPES, run_key, run_spec, sha256_hex
from actstore.workers import cluster
from actstore.workers.models import BUILTIN_MODELS

log = logging.getLogger(__name__)

STITCH_VERSION = 1
IN_FLIGHT_PER_REPLICA = 2


def _ray_get(ref, otherwise):
    """ray.get, re-raising our errors from inside the task as themselves and anything else as
    `otherwise(cause)` (a task that died, a library error), with the message the user needs."""
    try:
        return ray.get(ref)
    except Exception as exc:
        cause = cluster.unwrap(exc)
        raise (cause if isinstance(cause, ActStoreError) else otherwise(cause)) from None


@dataclass(frozen=True)
class DatasetSource:
    """Where a dataset comes from: exactly one of path, builtin, texts."""

    path: str | None = None
    builtin: str | None = None
    texts: list[str] | None = None
    labels: list[int] | None = None
    sample_ids: list[str] | None = None
    label_names: list[str] | None = None
    limit: int | None = None
    seed: int = 0
    split: str | None = None
    text_column: str = "text"
    label_column: str | None = None
    id_column: str | None = None
    group_column: str | None = None
    augment_views: int = 0
    augment_method: str = "word-dropout"


@dataclass(frozen=True)
class TrainRequest:
    recipe: str
    method: str
    seed: int = 0
    steps: int = 0
    smoke: bool = False
    alternating: bool = False
    weights: str = ""


@dataclass(frozen=True)
class CaptureRequest:
    model: str
    dataset: str
    pooling: str = ""
    dtype: str = ""
    max_len: int = 0


class ActStoreService:
    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self.root = self.settings.store_path
        self.root.mkdir(parents=True, exist_ok=True)
        self.catalog = Catalog(self.root / "catalog.duckdb")
        self.arrays = ZarrArrayStore(self.root, self.settings.compressor)
        self.jobs = JobManager(self.catalog, self.settings.max_running_jobs)
        cluster.ensure_ray(self.settings.ray_address)
        self.capture_pool = CapturePool(str(self.root), self.settings.compressor, self.settings.capture_actors,
                                        self.settings.actor_idle_seconds)
        self._submit_lock = threading.Lock()
        self.queries = QueryEngine(self.catalog, self.arrays, self.settings)
        if self.settings.resume_on_start:
            self.resume_interrupted()

    def close(self) -> None:
        self.jobs.shutdown()
        self.capture_pool.shutdown()
        self.catalog.close()

    # ---- models -------------------------------------------------------------------------------
    def register_model(self, *, path: str | None = None, builtin: str | None = None,
                       name: str | None = None, lineage: dict | None = None) -> ModelRecord:
        if bool(path) == bool(builtin):
            raise InvalidArgument("give exactly one of a model folder path or a builtin name "
                                  f"({', '.join(BUILTIN_MODELS)})")
        if builtin:
            if builtin not in BUILTIN_MODELS:
                raise NotFound(f"no builtin model {builtin!r}; the builtins are {', '.join(BUILTIN_MODELS)}")
            try:  # registered before: the alias is the cache (SmolLM2 takes ~20 s to dequantise)
                return self.catalog.model(name or builtin)
            except NotFound:
                pass
        source = builtin or str(Path(path).expanduser().resolve())
        from actstore.workers.registry import register_model

        task = ray.remote(num_cpus=1)(register_model).remote(source, str(self.root))
        registered = _ray_get(task, lambda cause: InvalidArgument(f"the model at {source} failed to load: {cause}"))
        record = replace(registered, lineage={**registered.lineage, **(lineage or {})})
        self.catalog.add_model(record)
        self.catalog.set_model_alias(name or builtin or Path(path).name, record.digest)
        return self.catalog.model(record.digest)

    # ---- datasets -----------------------------------------------------------------------------
    def register_dataset(self, source: DatasetSource, name: str | None = None) -> DatasetRecord:
        chosen = [s for s in (source.path, source.builtin, source.texts) if s is not None and s != ""]
        if len(chosen) != 1:
            raise InvalidArgument("give exactly one dataset source: a file path, a builtin name "
                                  f"({', '.join(ds.BUILTIN_DATASETS)}) or a list of texts")
        if source.builtin:
            data = ds.load_builtin(source.builtin, limit=source.limit, seed=source.seed, split=source.split)
        elif source.path:
            data = ds.load_file(Path(source.path).expanduser(), text_column=source.text_column,
                                label_column=source.label_column, id_column=source.id_column,
                                group_column=source.group_column)
            if source.limit:
                data = data.take(range(min(source.limit, data.n)))
        else:
            data = ds.from_texts(source.texts, labels=source.labels or None, sample_ids=source.sample_ids or None)
            if source.label_names:
                data = replace(data, label_names=list(source.label_names))
        if source.augment_views > 1:
            data = ds.augment_texts(data, n_views=source.augment_views, method=source.augment_method,
                                    seed=source.seed)
        digest = ds.dataset_digest(data)
        target = self.root / "datasets" / digest
        if not target.exists():
            ds.save_dataset(data, target)
        record = DatasetRecord(
            digest=digest, kind=data.kind, n=data.n,
            num_labels=len(data.label_names) if data.label_names else
            (int(data.labels.max()) + 1 if data.labels is not None else 0),
            has_groups=data.groups is not None, path=str(target), source=data.source,
        )
        self.catalog.add_dataset(record)
        default_name = source.builtin or (Path(source.path).stem if source.path else f"texts-{digest[:8]}")
        self.catalog.set_dataset_alias(name or default_name, digest)
        return self.catalog.dataset(digest)

    # ---- runs ---------------------------------------------------------------------------------
    def describe_run(self, run: str) -> tuple[RunRecord, object, int]:
        record = self.catalog.run(run)
        health = self.catalog.chunk_health(record.run_key, record.num_layers)
        stored = self.arrays.nbytes_stored(record.run_key) if record.status == "committed" else 0
        return record, health, stored

    def delete_run(self, run: str) -> str:
        record = self.catalog.run(run)
        live = self.jobs.live_for(record.run_key)
        if live is not None:
            raise InvalidArgument(f"run {record.run_key[:12]} has a running capture job {live.snapshot.job_id}: "
                                  "cancel it first")
        self.catalog.delete_run(record.run_key)
        self.arrays.delete_run(record.run_key)
        self.queries.forget()
        return record.run_key

    # ---- capture ------------------------------------------------------------------------------
    def submit_capture(self, request: CaptureRequest, principal: str | None = None) -> JobSnapshot:
        model = self.catalog.model(request.model)
        dataset = self.catalog.dataset(request.dataset)
        pooling = request.pooling or ("last" if model.kind == "causal-lm" else "cls")
        if pooling not in POOLINGS:
            raise InvalidArgument(f"pooling {pooling!r} is not one of {', '.join(POOLINGS)}")
        if pooling == "cls" and model.kind == "causal-lm":
            raise InvalidArgument("pooling 'cls' takes the first token, which in a causal LM sees only "
                                  "itself: use 'last', 'mean' or 'tokens'")
        dtype = request.dtype or "float16"
        if dtype not in STORAGE_DTYPES:
            raise InvalidArgument(f"dtype {dtype!r} is not one of {', '.join(STORAGE_DTYPES)}")
        if dataset.kind == "image" and model.kind != "vision":
            raise InvalidArgument(f"dataset {request.dataset!r} holds images but model {request.model!r} "
                                  f"is a {model.kind}: capture it with a vision model")
        if dataset.kind == "text" and model.kind == "vision":
            raise InvalidArgument(f"dataset {request.dataset!r} holds texts but model {request.model!r} is "
                                  "a vision model")
        if request.max_len < 0 or request.max_len == 1:
            raise InvalidArgument(f"max_len {request.max_len} must be >= 2 tokens (0 picks the default)")
        max_len = request.max_len or min(self.settings.default_max_len, model.max_positions or 1 << 30)
        spec = run_spec(model_digest=model.digest, dataset_digest=dataset.digest, num_layers=model.num_layers,
                        pooling=pooling, max_len=max_len, dtype=dtype)
        key = run_key(spec)
        job_request = {"model": model.digest, "dataset": dataset.digest, "pooling": pooling,
                       "dtype": dtype, "max_len": max_len}
        existing = self.catalog.find_run(key)
        if existing is not None and existing.status == "committed":
            return self.jobs.record_finished("capture", key, job_request, principal=principal)
        with self._submit_lock:  # identical concurrent requests: the first creates, the rest join
            if self.jobs.live_for(key) is None:
                self._layout(key, spec, model, dataset)  # the run is visible (as running) from now on
            state, joined = self.jobs.start(
                "capture", key, job_request,
                lambda job: self._capture(job, key, spec, model, dataset), principal=principal,
            )
        return replace(state.snapshot, joined=joined)

    # ---- cross-model comparison -----------------------------------------------------------------
    def submit_cka_matrix(self, runs: list[str], refresh: bool = False, principal: str | None = None) -> JobSnapshot:
        records, key, options = cka_job.plan(self.queries, runs)
        request = {"runs": [r.run_key for r in records]}
        if not refresh and self.catalog.result_record(key) is not None:
            return self.jobs.record_finished("cka-matrix", key, request, principal=principal)
        state, joined = self.jobs.start("cka-matrix", key, request,
                                        lambda job: cka_job.run(self.queries, job, records, key, options),
                                        principal=principal)
        return replace(state.snapshot, joined=joined)

    def resume_interrupted(self) -> list[str]:
        """Restart jobs that a previous server left unfinished: captures compute only their missing
        shards, CKA matrix jobs continue from their stored partial accumulators."""
        resumed = []
        for job in self.catalog.jobs():
            if job.status in ("done", "failed", "cancelled"):
                continue
            if job.kind == "cka-matrix":
                records, key, options = cka_job.plan(self.queries, job.request["runs"])
                self.jobs.start("cka-matrix", key, job.request,
                                lambda state, r=records, k=key, o=options: cka_job.run(self.queries, state, r, k, o),
                                job_id=job.job_id)
                resumed.append(job.job_id)
                continue
            run = self.catalog.find_run(job.target)
            if run is None or run.status == "committed":
                self.catalog.update_job(job.job_id, status="done" if run else "failed")
                continue
            model = self.catalog.model(run.model_digest)
            dataset = self.catalog.dataset(run.dataset_digest)
            self.jobs.start("capture", run.run_key, job.request,
                            lambda state, r=run, m=model, d=dataset: self._capture(state, r.run_key, r.spec, m, d),
                            job_id=job.job_id)
            resumed.append(job.job_id)
            log.info("resuming capture job %s for run %s", job.job_id, run.run_key[:12])
        return resumed

    def _layout(self, key: str, spec: dict, model: ModelRecord, dataset: DatasetRecord) -> RunLayout:
        """Create (or find) the run's catalog row and arrays."""
        record = self.catalog.find_run(key)
        if record is not None and (self.root / "runs" / key / "zarr.json").exists():
            try:
                return self.arrays.layout(key)
            except NotFound:
                pass
        offsets = None
        rows = dataset.n
        if spec["pooling"] == "tokens":
            from actstore.workers.capture import token_offsets

            offsets = ray.get(ray.remote(num_cpus=1)(token_offsets).remote(model.path, dataset.path, spec["max_len"]))
            rows = int(offsets[-1])
        layout = RunLayout(n=dataset.n, rows=rows, num_states=model.num_layers + 1, width=model.hidden_size,
                           dtype=spec["dtype"], pooling=spec["pooling"], shard_rows=self.settings.shard_rows)
        data = ds.load_dataset(Path(dataset.path))
        self.arrays.create_run(key, layout, data.sample_ids, data.labels, offsets)
        self.catalog.add_run(RunRecord(
            run_key=key, model_digest=model.digest, dataset_digest=dataset.digest, pooling=layout.pooling,
            dtype=layout.dtype, max_len=spec["max_len"], n=layout.n, rows=layout.rows,
            num_layers=model.num_layers, width=model.hidden_size, num_shards=layout.num_shards,
            status="running", spec=spec,
        ))
        return layout

    def _capture(self, job: JobState, key: str, spec: dict, model: ModelRecord, dataset: DatasetRecord) -> None:
        from actstore.workers.capture import CapturePlan

        layout = self._layout(key, spec, model, dataset)
        missing = sorted(set(range(layout.num_shards)) - self.catalog.recorded_shards(key, model.num_layers))
        done = layout.num_shards - len(missing)
        job.progress(done, layout.num_shards, "shards",
                     f"resuming: {done} of {layout.num_shards} shards already stored" if done else "")
        plan = CapturePlan(run_key=key, dataset_path=dataset.path, pooling=layout.pooling,
                           max_len=spec["max_len"], batch_size=self.settings.capture_batch_size, layout=layout)
        actors = self.capture_pool.acquire(model.digest, model.path)
        # A bounded window of shards in flight per replica: cancelling means submitting no more (a
        # ray.cancel racing a finishing task can crash the driver), and a warm replica is free soon.
        queue = list(missing)
        pending: dict = {}
        broken = True
        try:
            while queue or pending:
                while queue and len(pending) < IN_FLIGHT_PER_REPLICA * len(actors):
                    shard = queue.pop(0)
                    pending[actors[shard % len(actors)].capture.remote(plan, shard)] = shard
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
                if job.cancel_requested.is_set():
                    ray.wait(list(pending), num_returns=len(pending))  # let the in-flight shards finish
                    raise Cancelled(f"capture of run {key[:12]} cancelled after {done} of "
                                    f"{layout.num_shards} shards; submit it again to resume")
                for ref in ready:
                    pending.pop(ref)
                    rows = _ray_get(ref, lambda cause: Unavailable(
                        f"a capture worker failed: {cause}; the shards stored so far are kept: submit the "
                        "capture again to resume"))
                    self.catalog.insert_chunks(pa.table(rows))
                    done += 1
                if ready:
                    job.progress(done, layout.num_shards, "shards")
            broken = False
        finally:
            self.capture_pool.release(model.digest, broken=broken)
        self._commit(key, layout, model.num_layers)

    def _commit(self, key: str, layout: RunLayout, num_layers: int) -> None:
        recorded = self.catalog.recorded_shards(key, num_layers)
        rows = self.catalog.chunk_rows_total(key)
        if len(recorded) != layout.num_shards or rows != layout.rows:
            raise DataLoss(f"run {key[:12]}: {len(recorded)} of {layout.num_shards} shards and {rows} of "
                           f"{layout.rows} rows recorded; submit the capture again to finish it")
        self.arrays.write_means(key)
        self.catalog.set_run_status(key, "committed")

    # ---- training -----------------------------------------------------------------------------
    def submit_train(self, request: TrainRequest, principal: str | None = None) -> JobSnapshot:
        from actstore.training import METHODS, RECIPES

        if request.recipe not in RECIPES:
            raise NotFound(f"no recipe {request.recipe!r}; the recipes are {', '.join(RECIPES)}")
        if request.method not in METHODS:
            raise InvalidArgument(f"method {request.method!r} is not one of {', '.join(METHODS)}")
        if request.steps < 0 or request.seed < 0:
            raise InvalidArgument("steps and seed must be >= 0 (steps 0: the recipe's budget)")
        spec = {"recipe": request.recipe, "method": request.method, "seed": request.seed,
                "steps": request.steps or None, "smoke": request.smoke, "alternating": request.alternating,
                "weights": request.weights or "linear"}
        key = sha256_hex({"training": spec})
        state, joined = self.jobs.start("train", key, spec, lambda job: self._train(job, spec, key),
                                        principal=principal)
        return replace(state.snapshot, joined=joined)

    def _train(self, job: JobState, spec: dict, key: str) -> None:
        from actstore.training import list_checkpoints
        from actstore.workers.train_task import read_progress, run_training

        out_dir = self.root / "training" / key[:16]
        out_dir.mkdir(parents=True, exist_ok=True)
        gpus = cluster.cluster_gpus()
        resources = {"num_gpus": 1} if gpus else {"num_cpus": cluster.cluster_cpus()}
        task = ray.remote(max_retries=0, **resources)(run_training).remote(
            spec["recipe"], spec["method"], spec["seed"], spec["steps"], spec["smoke"], spec["alternating"],
            spec["weights"], str(out_dir), None if gpus else cluster.cluster_cpus())
        registered: set[str] = set()
        name = f"{spec['recipe']}{'-smoke' if spec['smoke'] else ''}-{spec['method']}-s{spec['seed']}"
        while True:
            ready, _ = ray.wait([task], timeout=0.5)
            if job.cancel_requested.is_set():
                ray.cancel(task, force=True)
                raise Cancelled(f"training {name} cancelled; its checkpoints are kept: submit it again to resume")
            for checkpoint in list_checkpoints(out_dir):
                if checkpoint.name not in registered:
                    self._register_checkpoint(checkpoint, name)
                    registered.add(checkpoint.name)
            progress = read_progress(out_dir)
            if progress:
                job.progress(progress["step"], progress["total"], "steps", f"loss {progress['loss']:.4f}")
            if ready:
                break
        _ray_get(task, lambda cause: Unavailable(f"training {name} failed: {cause}; the checkpoints so far are kept"))
        for checkpoint in list_checkpoints(out_dir):
            if checkpoint.name not in registered:
                self._register_checkpoint(checkpoint, name)

    def _register_checkpoint(self, checkpoint: Path, name: str) -> ModelRecord:
        lineage = json.loads((checkpoint / "lineage.json").read_text())
        record = self.register_model(path=str(checkpoint), name=f"{name}@step{lineage['step']}", lineage=lineage)
        self.catalog.set_model_alias(name, record.digest)  # the name alone follows the newest checkpoint
        return record

    # ---- stitching ----------------------------------------------------------------------------
    def stitch(self, run_a: str, layer_a: int, run_b: str, layer_b: int, test_fraction: float = 0.0,
               seed: int = 0, refresh: bool = False):
        from actstore.workers.stitch import StitchPlan, stitch_penalty

        a, b = self.queries.committed_run(run_a), self.queries.committed_run(run_b)
        self.queries.check_layers(a, [layer_a], "layer_a")
        self.queries.check_layers(b, [layer_b], "layer_b")
        if a.pooling != "tokens" or b.pooling != "tokens":
            raise InvalidArgument("stitching feeds every token of A into B: capture both runs with --pooling tokens")
        self.queries.check_same_samples(a, b)
        self.queries.check_finite(a, [layer_a])
        self.queries.check_finite(b, [layer_b])
        test_fraction = test_fraction or 0.25
        if not 0 < test_fraction < 1:
            raise InvalidArgument(f"test_fraction {test_fraction} must be between 0 and 1")
        self.queries.check_memory(8 * a.rows * (a.width + 2 * b.width + 1), "the stitch fit")
        model_b = self.catalog.model(b.model_digest)
        options = {"layer_a": layer_a, "layer_b": layer_b, "test_fraction": test_fraction, "seed": seed}

        def compute():
            plan = StitchPlan(str(self.root), self.settings.compressor, a.run_key, layer_a, b.run_key, layer_b,
                              model_b.path, self.catalog.dataset(b.dataset_digest).path, b.max_len, test_fraction,
                              seed)
            scalars = _ray_get(self.queries.device_task(stitch_penalty)(plan),
                               lambda cause: Unavailable(f"the stitching task failed: {cause}"))
            notes = [f"least-squares affine map fitted on {int(scalars['train_prompts'])} prompts, penalty measured "
                     f"on {int(scalars['test_prompts'])} held-out prompts (seed {seed})"]
            return {}, scalars, notes

        return self.queries.cached_or_compute("stitch", STITCH_VERSION, options, [a.run_key, b.run_key], refresh,
                                              compute)

    # ---- reading ------------------------------------------------------------------------------
    def read_activations(self, run: str, layer: int, start: int, stop: int
                         ) -> Iterator[tuple[int, np.ndarray, list[str]]]:
        record = self.queries.committed_run(run)
        self.queries.check_layers(record, [layer], "layer")
        stop = stop or record.rows
        if not 0 <= start < stop <= record.rows:
            raise InvalidArgument(f"rows {start}..{stop} are outside 0..{record.rows} of run {record.run_key[:12]}")
        itemsize = 4 if record.dtype != "float16" else 2
        step = max(1, self.settings.read_chunk_bytes // (record.width * itemsize))
        ids = self.arrays.sample_ids(record.run_key) if record.pooling != "tokens" else []
        for lo in range(start, stop, step):
            hi = min(lo + step, stop)
            values = self.arrays.read_layers(record.run_key, [layer], lo, hi)[0]
            yield lo, values, ids[lo:hi]
