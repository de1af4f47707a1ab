"""Import jobs: activations made elsewhere become a run with full identity (docs/import.md).

``submit`` resolves the registered model and dataset, opens the source in a Ray task on this
node (the files are on the server's disk, as for register-model from a path: the same role rule
and redaction apply), checks it against the model (layers 0..L, its width) and the dataset (its
samples, in order), and opens the run. The job then writes every missing shard in Ray tasks
through the capture's own path (``store_shard``: checksummed Zarr chunks, chunk rows, NaN/Inf
counts) and commits it like a capture (``fill_shards``, ``commit``), so every query works on it.

The run key is a capture's spec plus ``source = {"import": format, "digest": sha256 of the files
read}``: an import never shares a key with a capture, two imports of different files never
share one, and the same files imported again are a cache hit (or resume the missing shards).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actstore.config import Settings
from actstore.errors import Cancelled, InvalidArgument
from actstore.options import CAPTURE, IMPORTS, from_wire
from actstore.server.capture_job import commit, fill_shards, model_pooling
from actstore.server.dispatch import get_or_raise
from actstore.server.jobs import JobManager, JobSnapshot, JobState
from actstore.server.registration import Registrar, server_path
from actstore.server.rounding import JobFigures
from actstore.store import datasets as ds
from actstore.store.array_store import RunLayout
from actstore.store.catalog import Catalog, RunRecord
from actstore.store.handle import StoreHandle
from actstore.store.keys import run_key, run_spec
from actstore.workers.import_task import ImportPlan, SourceSummary, import_shard, inspect_source


@dataclass(frozen=True)
class ImportRequest:
    path: str
    model: str
    dataset: str
    format: str = ""
    pooling: str = ""
    dtype: str = ""


class ImportJobs:
    def __init__(self, catalog: Catalog, store: StoreHandle, jobs: JobManager, registrar: Registrar,
                 settings: Settings, submissions: threading.Lock) -> None:
        self.catalog = catalog
        self.store = store
        self.arrays = store.open()
        self.jobs = jobs
        self.registrar = registrar
        self.settings = settings
        self.submissions = submissions  # the captures' lock: gc never sees a run half opened

    def _here(self) -> NodeAffinitySchedulingStrategy:
        """The files are on this node's disk: the tasks that read them run here."""
        return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)

    def submit(self, request: ImportRequest, principal: str | None = None) -> JobSnapshot:
        if not request.path:
            raise InvalidArgument("give the path of the activations on the server (a folder or file; docs/import.md)")
        model = self.catalog.models.get(request.model)
        dataset = self.catalog.datasets.get(request.dataset)
        fmt = from_wire(IMPORTS, "format", request.format)
        pooling = from_wire(IMPORTS, "pooling", request.pooling) or model_pooling(model)
        dtype = from_wire(IMPORTS, "dtype", request.dtype)

        def inspect() -> SourceSummary:
            task = ray.remote(num_cpus=1)(inspect_source).options(scheduling_strategy=self._here()).remote(
                self.store, str(server_path(request.path, "activations").resolve()), fmt, dataset.path)
            return get_or_raise(task, lambda cause: InvalidArgument(f"the activations at {request.path} cannot be "
                                                                     f"read: {cause}"))

        summary = self.registrar.from_server_path(request.path, "activations", inspect)
        where = summary.description if not self.registrar.redact_file_errors else request.path
        if summary.num_states != model.num_layers + 1:
            raise InvalidArgument(f"{where} holds layers 0..{summary.num_states - 1}, but model {request.model!r} has "
                                  f"layers 0..{model.num_layers}: import every hidden state of the model")
        if summary.width != model.hidden_size:
            raise InvalidArgument(f"{where} is {summary.width} wide, but model {request.model!r} is "
                                  f"{model.hidden_size} wide: are these the activations of another model?")
        if pooling == "tokens" and summary.token_counts is None:
            raise InvalidArgument(f"{where} holds one vector per sample, not every token: give the pooling they were "
                                  f"made with ({', '.join(p for p in CAPTURE.pooling.choices if p != 'tokens')})")
        counts = summary.token_counts
        max_len = int(counts.max()) if counts is not None else \
            min(self.settings.default_max_len, model.max_positions or 1 << 30)
        spec = {**run_spec(model_digest=model.digest, dataset_digest=dataset.digest, num_layers=model.num_layers,
                           pooling=pooling, max_len=max(max_len, CAPTURE.max_len.minimum),
                           dtype=dtype or summary.default_storage),
                "source": {"import": summary.format, "digest": summary.digest}}
        key = run_key(spec)
        job_request = {"path": request.path, "model": model.digest, "dataset": dataset.digest,
                       "format": summary.format, "pooling": pooling, "dtype": spec["dtype"]}
        existing = self.catalog.runs.find(key)
        if existing is not None and existing.status == "committed":
            return self.jobs.record_finished("import", key, job_request, principal=principal)
        plan_path = str(server_path(request.path, "activations").resolve())
        with self.submissions:
            opened = None if self.jobs.live_for(key) else self._open(key, spec, summary, dataset)
            state, joined = self.jobs.start(
                "import", key, job_request,
                lambda job: self._import(job, plan_path, dataset.path, *(opened or self._open(key, spec, summary,
                                                                                              dataset))),
                principal=principal)
        return replace(state.snapshot, joined=joined)

    def _open(self, key: str, spec: dict, summary: SourceSummary, dataset) -> tuple[RunRecord, RunLayout, set[int]]:
        offsets = None
        rows = summary.n
        if spec["pooling"] == "tokens":
            offsets = [0, *summary.token_counts.cumsum().tolist()]
            rows = offsets[-1]
        layout = RunLayout.new(n=summary.n, rows=rows, num_states=summary.num_states, width=summary.width,
                               dtype=spec["dtype"], pooling=spec["pooling"], shard_rows=self.settings.shard_rows,
                               shard_mb=self.settings.shard_mb)
        data = ds.load_dataset(self.store.local(dataset.path))
        self.arrays.create_run(key, layout, data.sample_ids, data.labels, offsets, spec)
        record, recorded = self.catalog.runs.open(RunRecord(
            run_key=key, model_digest=spec["model"], dataset_digest=spec["dataset"], pooling=layout.pooling,
            dtype=layout.dtype, max_len=spec["max_len"], n=layout.n, rows=layout.rows,
            num_layers=layout.num_states - 1, width=layout.width, num_shards=layout.num_shards, status="running",
            spec=spec))
        return record, layout, recorded

    def _import(self, job: JobState, path: str, dataset_path: str, record: RunRecord, layout: RunLayout,
                recorded: set[int]) -> None:
        plan = ImportPlan(run_key=record.run_key, path=path, format=record.spec["source"]["import"],
                          dataset_path=dataset_path, pooling=layout.pooling, layout=layout)
        task = ray.remote(num_cpus=1)(import_shard).options(scheduling_strategy=self._here())
        figures = JobFigures(self.catalog, self.arrays, layout, [record])
        if not fill_shards(self.catalog, job, [record], layout, figures.restart([recorded]),
                           lambda shards, _keys: task.remote(self.store, plan, shards[0]),
                           self.settings.capture_concurrent_shards + 1, "an import task failed", "import",
                           measured=figures.add):
            raise Cancelled(f"import of run {record.run_key[:12]} cancelled; submit it again to resume")
        commit(self.catalog, self.arrays, record, figures.of(record.run_key))
