"""Capture jobs: validate a request, open its run once, deal the missing shards to warm model
replicas through the windowed dispatcher, record each shard, and commit.

A shard is recorded in the catalog only after its arrays were written, and the run is committed
only when every shard is recorded, so a crash at any moment leaves a run that a resubmitted (or,
at server start, resumed) capture finishes by computing only its missing shards.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, replace

import pyarrow as pa
import ray

from actstore.config import Settings
from actstore.errors import ActStoreError, Cancelled, InvalidArgument, NotFound, Unavailable
from actstore.options import CAPTURE, from_wire
from actstore.server.capture_pool import CapturePool
from actstore.server.dispatch import get_or_raise, run_windowed
from actstore.server.jobs import JobManager, JobSnapshot, JobState
from actstore.store import datasets as ds
from actstore.store.array_store import RunLayout
from actstore.store.catalog import (
    Catalog,
    DatasetRecord,
    JobRecord,
    ModelRecord,
    RunRecord,
)
from actstore.store.handle import StoreHandle
from actstore.store.keys import run_key, run_spec
from actstore.workers.capture import CapturePlan, token_char_spans, token_offsets

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CaptureRequest:
    model: str
    dataset: str
    pooling: str = ""
    dtype: str = ""
    max_len: int = 0


@dataclass(frozen=True)
class OpenRun:
    """A run as its capture sees it: catalog record, array layout, shards already recorded."""

    record: RunRecord
    layout: RunLayout
    recorded: set[int]
    model: ModelRecord
    dataset: DatasetRecord


class CaptureJobs:
    def __init__(self, catalog: Catalog, store: StoreHandle, jobs: JobManager, pool: CapturePool,
                 settings: Settings) -> None:
        self.catalog = catalog
        self.store = store
        self.arrays = store.open()
        self.jobs = jobs
        self.pool = pool
        self.settings = settings
        self.submissions = threading.Lock()

    def submit(self, request: CaptureRequest, principal: str | None = None) -> JobSnapshot:
        model = self.catalog.model(request.model)
        dataset = self.catalog.dataset(request.dataset)
        spec = self._spec(request, model, dataset)
        key = run_key(spec)
        job_request = {"model": model.digest, "dataset": dataset.digest, "pooling": spec["pooling"],
                       "dtype": spec["dtype"], "max_len": spec["max_len"]}
        existing = self.catalog.find_run(key)
        if existing is not None and existing.status == "committed":
            return self.jobs.record_finished("capture", key, job_request, principal=principal)
        with self.submissions:  # identical concurrent requests: the first opens the run, the rest join
            # opened here, before the job is visible, so a failure to open is this call's error
            opened = None if self.jobs.live_for(key) else self._open(key, spec, model, dataset)
            state, joined = self.jobs.start(
                "capture", key, job_request,
                lambda job: self._capture(job, opened or self._open(key, spec, model, dataset)),
                principal=principal)
        return replace(state.snapshot, joined=joined)

    def resume(self, job: JobRecord) -> bool:
        """Continue an unfinished capture job of an earlier server; False if nothing is left."""
        run = self.catalog.find_run(job.target)
        if run is None or run.status == "committed":
            self.catalog.update_job(job.job_id, status="done" if run else "failed")
            return False
        opened = self._open(run.run_key, run.spec, self.catalog.model(run.model_digest),
                            self.catalog.dataset(run.dataset_digest))
        self.jobs.start("capture", run.run_key, job.request, lambda state: self._capture(state, opened),
                        job_id=job.job_id, principal=job.principal)
        log.info("resuming capture job %s for run %s", job.job_id, run.run_key[:12])
        return True

    def _spec(self, request: CaptureRequest, model: ModelRecord, dataset: DatasetRecord) -> dict:
        # the table checks the choice and leaves the default to the model kind
        pooling = from_wire(CAPTURE, "pooling", request.pooling) or ("last" if model.kind == "causal-lm" else "cls")
        if pooling == "cls" and model.kind == "causal-lm":
            raise InvalidArgument("pooling 'cls' takes the first token, which in a causal LM sees only "
                                  "itself: use 'last', 'mean' or 'tokens'")
        dtype = from_wire(CAPTURE, "dtype", request.dtype)
        if dataset.kind == "image" and model.kind != "vision":
            raise InvalidArgument(f"dataset {request.dataset!r} holds images but model {request.model!r} "
                                  f"is a {model.kind}: capture it with a vision model")
        if dataset.kind == "text" and model.kind == "vision":
            raise InvalidArgument(f"dataset {request.dataset!r} holds texts but model {request.model!r} is "
                                  "a vision model")
        try:  # the table's minimum (2 tokens)
            max_len = from_wire(CAPTURE, "max_len", request.max_len)
        except InvalidArgument as e:
            raise InvalidArgument(f"{e} tokens (0 picks the default)") from None
        if max_len and model.max_positions and max_len > model.max_positions:
            raise InvalidArgument(f"max_len {max_len} is more than model {request.model!r} can take "
                                  f"({model.max_positions} positions): ask for at most {model.max_positions}")
        max_len = max_len or min(self.settings.default_max_len, model.max_positions or 1 << 30)
        return run_spec(model_digest=model.digest, dataset_digest=dataset.digest, num_layers=model.num_layers,
                        pooling=pooling, max_len=max_len, dtype=dtype)

    def _open(self, key: str, spec: dict, model: ModelRecord, dataset: DatasetRecord) -> OpenRun:
        """Create (or find) the run's arrays and catalog row; the run is visible as running from now on."""
        try:
            layout = self.arrays.layout(key)
        except NotFound:
            layout = self._create_arrays(key, spec, model, dataset)
        record, recorded = self.catalog.open_run(RunRecord(
            run_key=key, model_digest=model.digest, dataset_digest=dataset.digest, pooling=layout.pooling,
            dtype=layout.dtype, max_len=spec["max_len"], n=layout.n, rows=layout.rows,
            num_layers=model.num_layers, width=model.hidden_size, num_shards=layout.num_shards,
            status="running", spec=spec,
        ))
        return OpenRun(record, layout, recorded, model, dataset)

    def _create_arrays(self, key: str, spec: dict, model: ModelRecord, dataset: DatasetRecord) -> RunLayout:
        offsets = None
        rows = dataset.n
        if spec["pooling"] == "tokens":
            task = ray.remote(num_cpus=1)(token_offsets).remote(self.store, model.path, dataset.path,
                                                                 spec["max_len"])
            offsets = get_or_raise(task, lambda cause: Unavailable(f"tokenising the dataset failed: {cause}"))
            rows = int(offsets[-1])
        layout = RunLayout(n=dataset.n, rows=rows, num_states=model.num_layers + 1, width=model.hidden_size,
                           dtype=spec["dtype"], pooling=spec["pooling"], shard_rows=self.settings.shard_rows)
        data = ds.load_dataset(self.store.local(dataset.path))
        self.arrays.create_run(key, layout, data.sample_ids, data.labels, offsets, spec)
        if offsets is not None:  # where each token lies in its text, for cross-tokenizer alignment
            task = ray.remote(num_cpus=1)(token_char_spans).remote(self.store, model.path, dataset.path,
                                                                    spec["max_len"])
            spans = get_or_raise(task, lambda cause: Unavailable(f"tokenising the dataset failed: {cause}"))
            if spans is not None:
                self.arrays.write_char_spans(key, spans)
        return layout

    def _capture(self, job: JobState, opened: OpenRun) -> None:
        record, layout = opened.record, opened.layout
        missing = sorted(set(range(layout.num_shards)) - opened.recorded)
        done = layout.num_shards - len(missing)
        job.progress(done, layout.num_shards, "shards",
                     f"resuming: {done} of {layout.num_shards} shards already stored" if done else "")
        plan = CapturePlan(run_key=record.run_key, dataset_path=opened.dataset.path, pooling=layout.pooling,
                           max_len=record.max_len, batch_size=self.settings.capture_batch_size, layout=layout)
        actors = self.pool.acquire(opened.model.digest, opened.model.path)

        def collect(_shard: int, ref) -> None:
            nonlocal done
            rows = get_or_raise(ref, lambda cause: Unavailable(
                f"a capture worker failed: {cause}; the shards stored so far are kept: submit the capture "
                "again to resume"))
            self.catalog.record_shard(pa.table(rows))
            done += 1
            job.progress(done, layout.num_shards, "shards")

        # one more than a replica works on at once: the next shard is already there when a slot frees
        in_flight = self.settings.capture_concurrent_shards + 1
        broken = True
        try:
            complete = run_windowed(missing, lambda shard: actors[shard % len(actors)].capture.remote(plan, shard),
                                    in_flight * len(actors), collect, job.cancel_requested)
            broken = False
        except ActStoreError as exc:
            # the run says so (not `running` forever); its stored shards stay, and submitting the
            # capture again resumes it
            if not isinstance(exc, Cancelled):
                self.catalog.set_run_status(record.run_key, "failed")
            raise
        finally:
            self.pool.release(opened.model.digest, broken=broken)
        if not complete:
            raise Cancelled(f"capture of run {record.run_key[:12]} cancelled after {done} of "
                            f"{layout.num_shards} shards; submit it again to resume")
        self.arrays.write_means(record.run_key)
        self.catalog.commit_run(record)
        self.arrays.mark_committed(record.run_key)  # after the catalog: the store never claims more
