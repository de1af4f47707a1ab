"""The service layer: the object servicers are given, composing the parts of the server.

``ActStoreService`` owns construction, close and resume: the catalog (single writer), the store
handle, the job manager and the capture pool. A servicer calls the part that owns an operation,
one attribute deep (`service.PART.METHOD(...)`, never a part's own parts): `registrar`
(registration), `captures`, `imports`, `training`, `verifies` (the jobs of their modules), `jobs`
(follow, list, cancel any job), `queries` (the query engine: `answer` for every metric call),
`diagnostics` (its planner over the same parts), `names` (the runs' names in replies), `costs`
(dry runs), `readers` (a layer's rows, batches, SQL, locations). The methods here are the
operations no one part owns: the runs listed, described and deleted, the CKA matrix job, the
catalog's listings and tokens, backups and garbage collection.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from actstore.config import Settings
from actstore.errors import ActStoreError, FailedPrecondition
from actstore.options import duration_seconds
from actstore.server import auth, cka_job
from actstore.server.backup_schedule import BackupSchedule
from actstore.server.capture_job import CaptureJobs, CaptureRequest
from actstore.server.capture_pool import CapturePool
from actstore.server.gc import GarbageCollector, GcReport
from actstore.server.heap_upkeep import HeapUpkeep
from actstore.server.import_job import ImportJobs, ImportRequest
from actstore.server.jobs import JobManager, JobSnapshot
from actstore.server.planners.diagnostics import DiagnosticsPlanner
from actstore.server.planning import CostPlanner
from actstore.server.queries import QueryEngine
from actstore.server.readers import Readers
from actstore.server.registration import DatasetSource, LabelsSource, Registrar
from actstore.server.run_names import RunNames
from actstore.server.training_job import TrainingJobs, TrainRequest
from actstore.server.verify_job import VerifyJobs
from actstore.store.catalog import Catalog, ChunkHealth, DatasetRecord, LabelSetRecord, ModelRecord, RunRecord, backups
from actstore.store.handle import StoreHandle
from actstore.store.keys import site_of
from actstore.workers import cluster
from actstore.workers.store_faults import FaultTally

__all__ = ["ActStoreService", "CaptureRequest", "DatasetSource", "ImportRequest", "LabelsSource", "RunDescription",
           "TrainRequest"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunDescription:
    record: RunRecord
    health: ChunkHealth
    stored_bytes: int
    model_aliases: tuple[str, ...]
    dataset_aliases: tuple[str, ...]
    stats: dict | None = None  # per-layer running statistics (committed runs captured with them)
    rounding: dict | None = None  # a committed lossy run's error figures, one value per layer each


class ActStoreService:
    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self.heap = HeapUpkeep()
        self.faults = FaultTally()  # every process's object-store retries, counted for this server
        self.store = StoreHandle.from_settings(self.settings, self.faults)
        self.store.path.mkdir(parents=True, exist_ok=True)
        self.store.check()
        self.catalog = Catalog(self.settings.catalog_path, self.settings.catalog_memory_bytes)
        self._tokens_lock = threading.Lock()
        self.arrays = self.store.open()
        self.jobs = JobManager(self.catalog, self.settings.max_running_jobs, self.settings.finished_jobs_kept,
                               self.settings.job_progress_seconds, self.settings.principal_max_running_jobs,
                               self.settings.job_stall_seconds, self.faults.totals if self.store.is_remote else None)
        cluster.ensure_ray(self.settings.ray_address)
        self.capture_pool = CapturePool(self.store, self.settings)
        self.registrar = Registrar(self.catalog, self.store, self.settings)
        self.captures = CaptureJobs(self.catalog, self.store, self.jobs, self.capture_pool, self.settings)
        self.training = TrainingJobs(self.jobs, self.registrar, self.store)
        self.imports = ImportJobs(self.catalog, self.store, self.jobs, self.registrar, self.settings,
                                  self.captures.submissions)
        self.names = RunNames(self.catalog, self.settings.run_cache_entries)  # the runs' names in replies
        self.queries = QueryEngine(self.catalog, self.store, self.settings, self.names,
                                   self.capture_pool.release_idle_gpus)
        parts = self.queries.parts
        self.diagnostics = DiagnosticsPlanner(parts)
        self.costs = CostPlanner(self.catalog, self.captures, parts)  # dry runs
        self.readers = Readers(self.catalog, self.arrays, parts.checks, self.settings)
        self.verifies = VerifyJobs(self.catalog, self.store, self.jobs, self.settings, self.queries.forget)
        self.garbage = GarbageCollector(self.catalog, self.store, self.jobs, self.captures.submissions)
        if self.settings.resume_on_start:
            self.resume_interrupted()
        self.backups = BackupSchedule(self.catalog, self.settings.catalog_backup_seconds,
                                      self.settings.catalog_backups_kept)
        if self.settings.warm_models:
            threading.Thread(target=self._warm_models, name="warm-models", daemon=True).start()

    def _warm_models(self) -> None:
        """Start the replicas of `warm_models` (in the background: a server answers while they load)."""
        for name in self.settings.warm_models:
            try:
                model = self.catalog.models.get(name)
                started = time.perf_counter()
                self.capture_pool.warm(model.digest, model.path)
                log.info("capture replicas of model %s (%s) warm in %.1f s", name, model.digest[:12],
                         time.perf_counter() - started)
            except ActStoreError as exc:
                log.warning("ACTSTORE_WARM_MODELS: model %r is not warmed: %s (register it, or drop it from the "
                            "setting)", name, exc)

    def close(self) -> None:
        self.jobs.shutdown()
        self.capture_pool.shutdown()
        self.backups.stop()
        self.catalog.close()
        self.heap.stop()
        self.faults.stop()

    def store_faults(self) -> dict[str, int]:
        """The object-store calls retried and given up since this server started, in every process
        of its cluster (`workers.store_faults`)."""
        return self.faults.totals()

    def resume_interrupted(self) -> list[str]:
        """Restart jobs that a previous server left unfinished: captures compute only their missing
        shards, CKA matrix jobs continue from their stored partial accumulators."""
        resumed = []
        for job in self.catalog.jobs.all():
            if job.status in ("done", "failed", "cancelled"):
                continue
            if job.kind == "cka-matrix":
                records, key, options = cka_job.plan(self.queries.parts, **job.request)
                self.jobs.start("cka-matrix", key, job.request,
                                lambda state, r=records, k=key, o=options: cka_job.run(self.queries.parts, state,
                                                                                       r, k, o),
                                job_id=job.job_id, principal=job.principal)
                resumed.append(job.job_id)
            elif job.kind == "capture" and self.captures.resume(job):
                resumed.append(job.job_id)
        return resumed

    # ---- catalog ------------------------------------------------------------------------------
    def label_sets(self, dataset: str = "") -> list[LabelSetRecord]:
        """The label sets of one dataset (an alias or digest; empty: every dataset's)."""
        return self.catalog.label_sets.of(self.catalog.datasets.get(dataset).digest if dataset else None)

    def models(self) -> list[ModelRecord]:
        return self.catalog.models.all()

    def datasets(self) -> list[DatasetRecord]:
        return self.catalog.datasets.all()

    def runs(self, model: str = "", dataset: str = "", status: str = "", site: str = "") -> list[RunRecord]:
        model_digest = self.catalog.models.get(model).digest if model else None
        dataset_digest = self.catalog.datasets.get(dataset).digest if dataset else None
        runs = self.catalog.runs.all(model_digest, dataset_digest, status or None)
        return [r for r in runs if site_of(r.spec) == site] if site else runs

    def recorded_shards(self, record: RunRecord) -> int:
        """The shards of a run recorded so far: all of a committed run's (its commit checked them)."""
        if record.status == "committed":
            return record.num_shards
        return len(self.catalog.chunks.recorded_shards(record.run_key, record.num_layers))

    def describe_run(self, run: str) -> RunDescription:
        record = self.catalog.runs.get(run)
        health = self.catalog.chunks.health(record.run_key, record.num_layers)
        committed = record.status == "committed"
        stored = self.arrays.nbytes_stored(record.run_key) if committed else 0
        return RunDescription(record, health, stored, self.catalog.models.get(record.model_digest).aliases,
                              self.catalog.datasets.get(record.dataset_digest).aliases,
                              self.arrays.layer_stats(record.run_key) if committed else None,
                              self.arrays.error_figures(record.run_key) if committed else None)

    def delete_run(self, run: str) -> str:
        record = self.catalog.runs.get(run)
        live = self.jobs.live_for(record.run_key)
        if live is not None:
            raise FailedPrecondition(f"run {record.run_key[:12]} has a running capture job {live.snapshot.job_id}: "
                                     "cancel it first")
        self.catalog.runs.delete(record.run_key)
        self.arrays.delete_run(record.run_key)
        self.queries.forget()
        return record.run_key

    # ---- housekeeping (admin) ------------------------------------------------------------------
    def backup_catalog(self) -> tuple[Path, list[Path]]:
        """A catalog backup now: its path, and every backup kept (oldest first)."""
        made = self.backups.backup()
        return made, backups.list_backups(self.catalog.path)

    def collect_garbage(self, older_than: str, max_bytes: int | None, apply: bool = False) -> GcReport:
        """Cached results, partials and failed runs older than `older_than` (a duration such as 7d)
        or beyond `max_bytes`; the options are resolved at the boundary (the GC table)."""
        report = self.garbage.collect(duration_seconds(older_than), max_bytes, apply)
        if report.applied and report.items:
            self.queries.forget()
        return report

    # ---- the CKA matrix job -------------------------------------------------------------------
    def submit_cka_matrix(self, runs: list[str], refresh: bool = False, principal: str | None = None,
                          measure: str = "", options: dict | None = None, strict: bool = False) -> JobSnapshot:
        """The matrix job of linear CKA, or of a streamed `measure` with its `options` (`cka_job.plan`
        resolves them; `strict`: refuse one the measure does not take)."""
        records, key, planned = cka_job.plan(self.queries.parts, runs, measure, strict, **(options or {}))
        # what a resume replays: the runs, and the measure with its resolved options
        request = {"runs": [r.run_key for r in records],
                   **{name: value for name, value in planned.items() if name not in ("runs", "identifier")}}
        if not refresh and self.catalog.results.get_record(key) is not None:
            return self.jobs.record_finished("cka-matrix", key, request, principal=principal)
        state, joined = self.jobs.start("cka-matrix", key, request,
                                        lambda job: cka_job.run(self.queries.parts, job, records, key, planned),
                                        principal=principal)
        return replace(state.snapshot, joined=joined)

    # ---- tokens -------------------------------------------------------------------------------
    def create_token(self, name: str, role: str) -> str:
        return auth.create_token(self.catalog, name, role)

    def tokens(self) -> list[tuple[str, str]]:
        return self.catalog.principals.all()

    def revoke_token(self, name: str) -> None:
        """Revoke on the running server; never its last admin, which would leave nobody able to
        administer it until a restart (offline, `actstore token revoke --store DIR` still can)."""
        with self._tokens_lock:
            roles = dict(self.catalog.principals.all())
            if roles.get(name) == "admin" and list(roles.values()).count("admin") == 1:
                raise FailedPrecondition(
                    f"{name!r} holds this server's last admin token, and revoking it would leave nobody able to "
                    "administer the running server: create another admin token first (actstore token create "
                    "--name NAME --role admin), then revoke this one")
            self.catalog.principals.revoke(name)  # the next call with its token is refused: nothing is cached
