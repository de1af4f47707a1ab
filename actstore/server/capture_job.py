"""Capture jobs: validate a request, open its run once, deal the missing shards to warm model
replicas through the windowed dispatcher, record each shard, and commit.

A capture of several sites (`--site resid_post,mlp_out`) is one job over one forward pass per
batch, writing one run per site (each laid out as a single-site run): the job reports every
site's run key (`JobSnapshot.run_keys`, in the order of `sites`).

A shard is recorded in the catalog only after its arrays were written, and the run is committed
only when every shard is recorded, so a crash at any moment leaves a run that a resubmitted (or,
at server start, resumed) capture finishes by computing only its missing shards.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, replace

import pyarrow as pa
import ray

from actstore.config import Settings
from actstore.errors import Cancelled, InvalidArgument, NotFound, Unavailable
from actstore.modeling.sites import RESID_POST, ResolvedSite, resolve_in_folder
from actstore.options import CAPTURE
from actstore.server.capture_pool import CapturePool
from actstore.server.dispatch import get_or_raise, run_windowed
from actstore.server.jobs import JobManager, JobSnapshot, JobState
from actstore.server.rounding import JobFigures
from actstore.server.runs import stored_ratio
from actstore.store import datasets as ds
from actstore.store.array_store import RunLayout, RunWriter
from actstore.store.catalog import (
    Catalog,
    DatasetRecord,
    JobRecord,
    ModelRecord,
    RunRecord,
)
from actstore.store.format.quantised import is_one_byte
from actstore.store.handle import StoreHandle
from actstore.store.keys import rounding_key, run_key, run_spec, site_of
from actstore.workers.capture import CapturePlan

log = logging.getLogger(__name__)

TOKEN_BATCHES_PER_TASK = 4  # full forward batches one token-level capture task runs (shards_per_task)
MAX_SITES = 16  # runs one capture writes from one forward pass (each shard holds all of them at once)


@dataclass(frozen=True)
class CaptureRequest:
    """A capture request as the server boundary reads it (`servicer.capture_request`): every option
    checked by the CAPTURE table once, the sites parsed. What depends on the model and the dataset
    is decided once, by `CaptureJobs.target`."""

    model: str
    dataset: str
    pooling: str | None = CAPTURE.pooling.default  # None: the model's (`model_pooling`)
    dtype: str = CAPTURE.dtype.default
    max_len: int | None = CAPTURE.max_len.default  # None: the server's default_max_len (within the model's)
    sites: tuple[str, ...] = CAPTURE.site.default
    max_cka_error: float | None = CAPTURE.max_cka_error.default


def model_pooling(model: ModelRecord) -> str:
    """The pooling of a capture or import of `model` that names none: last for a causal LM (its last
    token has seen the whole text), cls otherwise."""
    return "last" if model.kind == "causal-lm" else "cls"


@dataclass(frozen=True)
class OpenRun:
    """A run as its capture sees it: catalog record, array layout, shards already recorded."""

    record: RunRecord
    layout: RunLayout
    recorded: set[int]
    model: ModelRecord
    dataset: DatasetRecord


@dataclass(frozen=True)
class CaptureTarget:
    """A capture request resolved, once (`CaptureJobs.target`): its model and dataset, the options
    it runs with (pooling and max_len decided), and each site's run spec and key. Everything below
    reads these and checks nothing again."""

    model: ModelRecord
    dataset: DatasetRecord
    pooling: str
    dtype: str
    max_len: int
    sites: list[str]
    specs: list[dict]
    keys: list[str]


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

    def target(self, request: CaptureRequest) -> CaptureTarget:
        """Check a request against its model and dataset (InvalidArgument / NotFound), decide its
        pooling and max_len, and name the run of each of its sites."""
        model = self.catalog.models.get(request.model)
        dataset = self.catalog.datasets.get(request.dataset)
        pooling, max_len = self._options(request, model, dataset)
        if request.max_cka_error is not None and not is_one_byte(request.dtype):
            raise InvalidArgument(f"max_cka_error bounds the error of a lossy dtype, and {request.dtype} stores every "
                                  "value as the model computed it (to its own precision): capture with --dtype int8, "
                                  "or leave max_cka_error out")
        sites = self._sites(request.sites, model)
        specs = [run_spec(model_digest=model.digest, dataset_digest=dataset.digest, num_layers=model.num_layers,
                          pooling=pooling, max_len=max_len, dtype=request.dtype, site=site.site, modules=site.pattern,
                          max_cka_error=request.max_cka_error)
                 for site in sites]
        return CaptureTarget(model, dataset, pooling, request.dtype, max_len, [site.site for site in sites], specs,
                             [run_key(spec) for spec in specs])

    def submit(self, request: CaptureRequest, principal: str | None = None) -> JobSnapshot:
        target = self.target(request)
        model, dataset, specs, keys = target.model, target.dataset, target.specs, target.keys
        job_request = {"model": model.digest, "dataset": dataset.digest, "pooling": target.pooling,
                       "dtype": target.dtype, "max_len": target.max_len, "sites": target.sites, "run_keys": keys}
        todo = [(key, spec) for key, spec in zip(keys, specs)
                if (found := self.catalog.runs.find(key)) is None or found.status != "committed"]
        if not todo:
            return self.jobs.record_finished("capture", keys[0], job_request, principal=principal)
        for key, _ in todo:  # outside `submissions`: other requests go on meanwhile
            self.jobs.await_cancelled(key)
        with self.submissions:  # identical concurrent requests: the first opens the runs, the rest join
            live = [self.jobs.live_for(key) for key, _ in todo]
            if all(job is not None for job in live):  # every run this needs is being captured already
                return replace(live[0].snapshot, joined=True)
            # opened here, before the job is visible, so a failure to open is this call's error
            mine = [(key, spec) for (key, spec), job in zip(todo, live) if job is None]
            offsets: dict = {}
            opened = [self._open(key, spec, model, dataset, offsets) for key, spec in mine]
            if any(o.layout != opened[0].layout for o in opened):
                raise InvalidArgument("the sites' runs were created with different layouts (a changed shard "
                                      "size?): capture each of these sites on its own")
            state, joined = self.jobs.start("capture", mine[0][0], job_request,
                                            lambda job: self._capture(job, opened), principal=principal,
                                            also=tuple(key for key, _ in mine[1:]))
        return replace(state.snapshot, joined=joined)

    def resume(self, job: JobRecord) -> bool:
        """Continue an unfinished capture job of an earlier server; False if nothing is left."""
        runs = [self.catalog.runs.find(key) for key in job.request.get("run_keys") or [job.target]]
        left = [run for run in runs if run is not None and run.status != "committed"]
        if not left:
            self.catalog.jobs.update(job.job_id, status="done" if all(runs) else "failed")
            return False
        model = self.catalog.models.get(left[0].model_digest)
        dataset = self.catalog.datasets.get(left[0].dataset_digest)
        offsets: dict = {}
        opened = [self._open(run.run_key, run.spec, model, dataset, offsets) for run in left]
        self.jobs.start("capture", left[0].run_key, job.request, lambda state: self._capture(state, opened),
                        job_id=job.job_id, principal=job.principal, also=tuple(run.run_key for run in left[1:]))
        log.info("resuming capture job %s for run %s", job.job_id, left[0].run_key[:12])
        return True

    def _sites(self, requested: tuple[str, ...], model: ModelRecord) -> list[ResolvedSite]:
        """The requested sites (parsed by the table: resid_post when none), each resolved to its modules."""
        sites = list(requested)
        if len(sites) > MAX_SITES:
            raise InvalidArgument(f"{len(sites)} sites in one capture: at most {MAX_SITES} (each is a run written "
                                  "from the same forward pass); split them over several captures")
        if sites == [RESID_POST]:  # today's capture: no need to look inside the model
            return [ResolvedSite(RESID_POST, ())]
        return resolve_in_folder(self.store.local(model.path), sites)

    def _options(self, request: CaptureRequest, model: ModelRecord, dataset: DatasetRecord) -> tuple[str, int]:
        """The pooling and max_len the request runs with. The table checked both; what is left
        depends on the model: the pooling it defaults to, the positions it takes."""
        pooling = request.pooling or model_pooling(model)
        if pooling == "cls" and model.kind == "causal-lm":
            raise InvalidArgument("pooling 'cls' takes the first token, which in a causal LM sees only "
                                  "itself: use 'last', 'mean' or 'tokens'")
        if dataset.kind == "image" and model.kind != "vision":
            raise InvalidArgument(f"dataset {request.dataset!r} holds images but model {request.model!r} "
                                  f"is a {model.kind}: capture it with a vision model")
        if dataset.kind == "text" and model.kind == "vision":
            raise InvalidArgument(f"dataset {request.dataset!r} holds texts but model {request.model!r} is "
                                  "a vision model")
        max_len = request.max_len
        if max_len and model.max_positions and max_len > model.max_positions:
            raise InvalidArgument(f"max_len {max_len} is more than model {request.model!r} can take "
                                  f"({model.max_positions} positions): ask for at most {model.max_positions}")
        return pooling, max_len or min(self.settings.default_max_len, model.max_positions or 1 << 30)

    def _open(self, key: str, spec: dict, model: ModelRecord, dataset: DatasetRecord, offsets: dict) -> OpenRun:
        """Create (or find) the run's arrays and catalog row; the run is visible as running from now on.
        `offsets` keeps a token-level capture's offsets for the other sites' runs of the same pass."""
        try:
            layout = self.arrays.layout(key)
        except NotFound:
            layout = self._create_arrays(key, spec, model, dataset, offsets)
        record, recorded = self.catalog.runs.open(RunRecord(
            run_key=key, model_digest=model.digest, dataset_digest=dataset.digest, pooling=layout.pooling,
            dtype=layout.dtype, max_len=spec["max_len"], n=layout.n, rows=layout.rows,
            num_layers=model.num_layers, width=model.hidden_size, num_shards=layout.num_shards,
            status="running", spec=spec,
        ))
        return OpenRun(record, layout, recorded, model, dataset)

    def _create_arrays(self, key: str, spec: dict, model: ModelRecord, dataset: DatasetRecord,
                       known: dict) -> RunLayout:
        started = time.perf_counter()
        offsets = None
        rows = dataset.n
        if spec["pooling"] == "tokens":
            if "offsets" not in known:  # once for every site's run of the same pass: one tokenisation
                task = self.pool.token_rows(model.path, dataset.path, spec["max_len"])
                known["offsets"], known["spans"] = get_or_raise(task, lambda cause: Unavailable(
                    f"tokenising the dataset failed: {cause}"))
            offsets = known["offsets"]
            rows = int(offsets[-1])
        layout = RunLayout.new(n=dataset.n, rows=rows, num_states=model.num_layers + 1, width=model.hidden_size,
                               dtype=spec["dtype"], pooling=spec["pooling"], shard_rows=self.settings.shard_rows,
                               shard_mb=self.settings.shard_mb)
        data = ds.load_dataset(self.store.local(dataset.path))
        compress = self._compression_pays(model.digest, spec["dtype"])
        self.arrays.create_run(key, layout, data.sample_ids, data.labels, offsets, spec, compress)
        if offsets is not None and known["spans"] is not None:  # where each token lies in its text
            self.arrays.write_char_spans(key, known["spans"])
        log.info("run %s created in %.2f s (%d rows, %d shards)", key[:12], time.perf_counter() - started, rows,
                 layout.num_shards)
        return layout

    def _compression_pays(self, model_digest: str, dtype: str) -> bool:
        """Whether to compress a new run: Blosc costs a share of the write path while float16 and
        bfloat16 activations shrink ~3% (the first run of a dtype compresses, and measures it)."""
        minimum = self.settings.compress_min_saving
        measured = stored_ratio(self.catalog, self.arrays, model_digest, dtype) if minimum else None
        return measured is None or measured[0] <= 1 - minimum

    def _capture(self, job: JobState, opened: list[OpenRun]) -> None:
        first, layout = opened[0], opened[0].layout
        figures = JobFigures(self.catalog, self.arrays, layout, [o.record for o in opened])
        opened = [replace(o, recorded=recorded) for o, recorded in zip(opened, figures.restart([o.recorded
                                                                                                for o in opened]))]
        plan = CapturePlan(run_key=first.record.run_key, dataset_path=first.dataset.path, max_len=first.record.max_len,
                           batch_size=self.settings.capture_batch_size, layout=layout,
                           sites=tuple((site_of(o.record.spec), o.record.run_key) for o in opened),
                           rounding_keys=tuple((o.record.run_key, rounding_key(o.record.spec)) for o in opened
                                               if "max_cka_error" in o.record.spec),
                           store=self.store)
        started = time.perf_counter()
        actors, tasks_per_replica = self.pool.acquire(first.model.digest, first.model.path)
        ready = time.perf_counter()
        broken = True
        per_task = shards_per_task(layout, self.settings.capture_batch_size)
        try:
            # one more than a replica works on at once: the next task is already there when a slot frees
            complete = fill_shards(
                self.catalog, job, [o.record for o in opened], layout, [o.recorded for o in opened],
                ReplicaRouter(actors, plan), (tasks_per_replica + 1) * len(actors), "a capture worker failed",
                "capture", per_task, retries=len(actors), bugs_internal=True, measured=figures.add)
            kept = figures.over_tolerance() if complete else {}
            if kept:  # a second pass: the layers over max_cka_error, written exactly
                complete = self._keep_exact(job, opened, plan, kept, figures, actors, tasks_per_replica, per_task)
            broken = False
        finally:
            self.pool.release(first.model.digest, broken=broken)
        if not complete:
            raise Cancelled(f"capture of run {first.record.run_key[:12]} cancelled; submit it again to resume")
        written = time.perf_counter()
        for o in opened:
            commit(self.catalog, self.arrays, o.record, figures.of(o.record.run_key), figures.means(o.record.run_key))
        log.info("capture of run %s: %d shards x %d run(s); %d replica(s) ready in %.2f s, shards written in %.2f s, "
                 "committed in %.2f s", first.record.run_key[:12], layout.num_shards, len(opened), len(actors),
                 ready - started, written - ready, time.perf_counter() - written)


    def _keep_exact(self, job: JobState, opened: list[OpenRun], plan: CapturePlan, kept: dict[str, list[int]],
                    figures: JobFigures, actors: list, tasks_per_replica: int, per_task: int) -> bool:
        """The second pass of a capture with a tolerance: every shard computed again, and the layers
        of `kept` (per run key) written exactly into each run's `exact` array. False if cancelled."""
        records = [o.record for o in opened if o.record.run_key in kept]
        for record in records:
            self.arrays.create_exact(record.run_key, kept[record.run_key])
        named = "; ".join(f"run {key[:12]}: layers {', '.join(map(str, layers))}" for key, layers in kept.items())
        job.progress(0, plan.layout.num_shards, "shards", f"keeping exact (float32) the layers whose bound is over "
                     f"max_cka_error ({named}): every shard computed again")
        exact = replace(plan, exact=tuple((key, tuple(layers)) for key, layers in kept.items()))
        return fill_shards(self.catalog, job, records, plan.layout, [set() for _ in records],
                           ReplicaRouter(actors, exact), (tasks_per_replica + 1) * len(actors),
                           "a capture worker failed", "capture", per_task, retries=len(actors), bugs_internal=True,
                           measured=figures.add)


class ReplicaRouter:
    """Deals a capture's tasks over its replicas in turn. The dispatcher sends a task again only
    when its replica was lost (a node left, the actor died), so a task seen again marks the
    replica it went to as lost, and it and every later task go to the replicas not lost. When all
    are lost, tasks go where they first went, and fail saying why.

    In turn, not by a task's first shard: a task of an even number of shards (a token-level
    capture's) starts at an even shard, and two replicas dealt by shard number got every task on one."""

    def __init__(self, actors: list, plan: CapturePlan) -> None:
        self.actors = actors
        self.plan = plan
        self.sent: dict[tuple[int, ...], int] = {}
        self.lost: set[int] = set()
        self.dealt = 0

    def __call__(self, shards: tuple[int, ...], keys: tuple[str, ...]) -> ray.ObjectRef:
        if shards in self.sent:
            self.lost.add(self.sent[shards])
        live = [i for i in range(len(self.actors)) if i not in self.lost] or range(len(self.actors))
        replica = self.sent[shards] = live[self.dealt % len(live)]
        self.dealt += 1
        return self.actors[replica].capture.remote(self.plan, shards, keys)


def shards_per_task(layout: RunLayout, batch_size: int) -> int:
    """Consecutive shards one capture task computes, so its forward passes run full batches.

    A pooled shard holds `shard_rows` samples, so one shard fills a batch once shard_rows >=
    batch_size. A token-level shard holds `shard_rows` tokens: with ~26 tokens a review, a 256-token
    shard is ~10 prompts, and a task per shard ran batches of 10 (and recomputed the prompts that
    straddle its ends), at half the rate of 32-prompt batches (measured). A task then spans enough
    shards for `TOKEN_BATCHES_PER_TASK` full batches, and writes each shard whole as before."""
    prompts_per_shard = layout.shard_rows * layout.n / max(layout.rows, 1)
    wanted = batch_size * (TOKEN_BATCHES_PER_TASK if layout.pooling == "tokens" else 1)
    return max(1, math.ceil(wanted / prompts_per_shard))


def fill_shards(catalog: Catalog, job: JobState, records: list[RunRecord], layout: RunLayout,
                recorded: list[set[int]], submit, width: int, failure: str, what: str, per_task: int = 1,
                retries: int = 0, bugs_internal: bool = False, measured=None) -> bool:
    """Write the shards not yet recorded for every run of ``records`` (runs of one layout, such as
    the sites of one capture; ``recorded[i]`` holds run i's recorded shards) and record each task's
    shards as it finishes, at most ``width`` tasks in flight. ``submit(shards, keys)`` is the ref
    of a task that writes the consecutive ``shards`` (at most ``per_task``) of the runs ``keys``
    (those that lack them) and returns their chunk rows, one table per shard and run. False when
    the job was cancelled; a failure marks the runs failed (their stored shards stay: submitting
    the same request again resumes them). A task whose worker was lost is submitted again, up to
    ``retries`` times (``run_windowed``); its shards are recorded once, when one attempt returns.
    ``bugs_internal``: see `get_or_raise` (a capture's tasks: yes; an import's read a user's file).
    A task returns `ShardsWritten`; ``measured`` takes each (a lossy run's rounding of its shards)."""
    missing = sorted(set(range(layout.num_shards)) - set.intersection(*recorded))
    needs = {shard: tuple(r.run_key for r, have in zip(records, recorded) if shard not in have) for shard in missing}
    tasks: list[tuple[int, ...]] = []
    for shard in missing:  # runs of consecutive shards that the same runs lack
        last = tasks[-1] if tasks else ()
        if last and shard == last[-1] + 1 and needs[shard] == needs[last[0]] and len(last) < per_task:
            tasks[-1] = last + (shard,)
        else:
            tasks.append((shard,))
    done = layout.num_shards - len(missing)
    job.progress(done, layout.num_shards, "shards",
                 f"resuming: {done} of {layout.num_shards} shards already stored" if done else "")

    def collect(shards: tuple[int, ...], ref) -> None:
        nonlocal done
        which = f"shard {shards[0]}" if len(shards) == 1 else f"shards {shards[0]}-{shards[-1]}"
        written = get_or_raise(ref, lambda cause: Unavailable(
            f"{failure} ({which} of {layout.num_shards} not written): {cause}; the shards stored so far are kept: "
            f"submit the {what} again to resume"), bugs_internal=bugs_internal)
        tables = written.tables
        if measured is not None:
            measured(written)
        if tables:  # one insert for the whole task: a catalog transaction costs ~6 ms CPU, a shard's rows ~0.3
            catalog.chunks.insert(pa.table({column: [cell for rows in tables for cell in rows[column]]
                                           for column in tables[0]}))
        done += len(shards)
        job.progress(done, layout.num_shards, "shards")

    try:
        return run_windowed(tasks, lambda shards: submit(shards, needs[shards[0]]), width, collect,
                            job.cancel_requested, retries=retries)
    except Exception as exc:
        # the runs say so (not `running` forever), where the catalog can still be written
        if not isinstance(exc, Cancelled):
            for record in records:
                try:
                    catalog.runs.set_status(record.run_key, "failed")
                except Exception as also:
                    log.error("run %s not marked failed (%s): %s", record.run_key[:12], exc, also)
        raise


def commit(catalog: Catalog, arrays: RunWriter, record: RunRecord, figures: dict[str, list] | None = None,
           means: dict | None = None) -> None:
    """The layer means and statistics (and a lossy run's error figures; `means`: those of its layers
    kept exact), then the catalog's commit, then the store's marker: the store never claims more."""
    if figures is not None:
        arrays.write_error_figures(record.run_key, figures)
    arrays.write_means(record.run_key, means)
    arrays.write_layer_stats(record.run_key)
    catalog.runs.commit(record)
    arrays.mark_committed(record.run_key)
