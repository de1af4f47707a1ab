"""Verify jobs (`actstore verify`): a scrub of the named runs, and the repair of what it finds.

The job reads every chunk of every run in Ray tasks (a group of one run's shards each, through
the windowed dispatcher, so progress counts shards and a cancel stops submitting), checks the
run-wide arrays here, and compares the catalog's chunk rows with the shards present. Its report
(per run: ok or damaged, what is damaged and why, whether it must be recaptured) is stored in the
catalog's results table under the job's target, so it outlives the job and the server.

A repair drops the damaged shards (their bytes and chunk rows), the layer means and the commit
marker, and marks the run failed: submitting the same capture again recaptures only those shards
(`capture_job` resumes failed runs). Damage to what a run's creation writes once (group metadata,
sample ids, labels, offsets, and any array's metadata object, its zarr.json) cannot be mended shard
by shard: such a run is deleted, and the same capture then captures it whole.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict

import ray

from actstore.config import Settings
from actstore.errors import ActStoreError, Cancelled, FailedPrecondition, InvalidArgument, NotFound, Unavailable
from actstore.records import Damage
from actstore.server.dispatch import get_or_raise, run_windowed
from actstore.server.jobs import JobManager, JobSnapshot, JobState
from actstore.store.array_store import RunLayout
from actstore.store.catalog import Catalog, RunRecord
from actstore.store.handle import StoreHandle
from actstore.store.keys import result_key
from actstore.store.upkeep.scrub import METADATA, WHOLE, check_run, created_once
from actstore.workers import cluster
from actstore.workers.metric_tasks import deal
from actstore.workers.verify_tasks import verify_shards

KINDS = ("verify", "repair")
TASKS_PER_CPU = 4  # shard groups per CPU and run: progress moves often, a task is never the whole run


class VerifyJobs:
    def __init__(self, catalog: Catalog, store: StoreHandle, jobs: JobManager, settings: Settings,
                 forget) -> None:
        self.catalog = catalog
        self.store = store
        self.arrays = store.open()
        self.jobs = jobs
        self.settings = settings
        self.forget = forget  # the query engine's memory of runs, cleared after a repair

    def submit(self, runs: list[str], all_runs: bool, repair: bool, principal: str | None = None) -> JobSnapshot:
        if all_runs == bool(runs):
            raise InvalidArgument("name the runs to verify, or ask for all of them (--all), not both")
        records = self.catalog.runs.all() if all_runs else [self.catalog.runs.get(run) for run in runs]
        records = list({r.run_key: r for r in records}.values())
        keys = [r.run_key for r in records]
        kind = KINDS[repair]
        # every verify is fresh (the bytes may have changed since the last): a key of its own
        target = result_key(kind, 1, {"nonce": uuid.uuid4().hex}, keys)
        state, _ = self.jobs.start(kind, target, {"runs": keys, "repair": repair},
                                   lambda job: self._run(job, records, repair, target), principal=principal)
        return state.snapshot

    def report(self, job_id: str) -> dict:
        job = self.jobs.snapshot(job_id)
        if job.kind not in KINDS:
            raise InvalidArgument(f"job {job_id} is a {job.kind} job, not a verify job")
        if not job.finished:
            raise FailedPrecondition(f"verify job {job_id} is still {job.status}: watch it to its end first")
        stored = self.catalog.results.get(job.target)
        if stored is None:
            raise NotFound(f"verify job {job_id} ended {job.status} without a report ({job.error or 'no error'}): "
                           "submit it again")
        return json.loads(stored[0])

    # ---- the job --------------------------------------------------------------------------------
    def _run(self, job: JobState, records: list[RunRecord], repair: bool, target: str) -> None:
        started = time.perf_counter()
        findings: dict[str, list[Damage]] = {}
        plans: dict[str, dict[int, dict[int, int]]] = {}
        for record in records:
            findings[record.run_key], plans[record.run_key] = self._plan(record)
        total = sum(len(p) for p in plans.values())
        done = 0
        job.progress(done, total, "shards")
        parts = max(1, cluster.cluster_cpus() * TASKS_PER_CPU)
        # a token-level run of a text model has a token id for every row
        ids_expected = {r.run_key: r.pooling == "tokens" and self.catalog.models.get(r.model_digest).kind != "vision"
                        for r in records}
        items = [(key, dict(group), ids_expected[key]) for key, plan in plans.items()
                 for group in deal(sorted(plan.items()), parts) if group]
        task = ray.remote(num_cpus=1)(verify_shards)

        def collect(item, ref) -> None:
            nonlocal done
            key, group, _ = item
            findings[key].extend(get_or_raise(ref, lambda cause: Unavailable(
                f"a verify task failed: {cause}; submit the verify again")))
            done += len(group)
            job.progress(done, total, "shards")

        complete = run_windowed(items, lambda item: task.remote(self.store, *item), cluster.cluster_cpus(),
                                collect, job.cancel_requested)
        if not complete:
            raise Cancelled(f"verify cancelled after {done} of {total} shards: submit it again")
        verdicts = [self._verdict(r, findings[r.run_key], len(plans[r.run_key])) for r in records]
        if repair:
            verdicts = [self._repair(r, v) for r, v in zip(records, verdicts)]
        report = {"job_id": job.snapshot.job_id, "repair": repair, "runs": verdicts}
        self.catalog.results.put(target, KINDS[repair], 1, {"repair": repair}, [r.run_key for r in records],
                                json.dumps(report).encode(), time.perf_counter() - started)

    def _plan(self, record: RunRecord) -> tuple[list[Damage], dict[int, dict[int, int]]]:
        """The run-wide findings, and the shards to read with the crc32c of each recorded layer;
        the catalog's chunk rows are compared with the shards the run should have here."""
        try:
            shard_rows = self.arrays.layout(record.run_key).shard_rows
        except ActStoreError:  # damaged or missing metadata (check_run says which): as the capture laid it out
            shard_rows = RunLayout.new(record.n, record.rows, record.num_layers + 1, record.width, record.dtype,
                                       record.pooling, self.settings.shard_rows, self.settings.shard_mb).shard_rows
        layout = RunLayout(n=record.n, rows=record.rows, num_states=record.num_layers + 1, width=record.width,
                           dtype=record.dtype, pooling=record.pooling, shard_rows=shard_rows)
        committed = record.status == "committed"
        findings = check_run(self.arrays, record.run_key, layout, committed, record.spec)
        if any(f.array in ("group", layout.array_name + METADATA) for f in findings):
            return findings, {}  # the shards cannot be read without the run's or the array's metadata
        recorded = self.catalog.chunks.checksums(record.run_key)
        plan = {}
        for shard in range(record.num_shards):
            rows = recorded.get(shard, {})
            if not rows and not committed:
                continue  # not captured yet: the capture writes it
            start, stop = layout.shard_range(shard)
            if len(rows) != layout.num_states:
                findings.append(Damage("catalog", shard, WHOLE, f"has chunk rows for {len(rows)} of "
                                                                f"{layout.num_states} layers"))
            elif any(count != stop - start for count, _ in rows.values()):
                findings.append(Damage("catalog", shard, WHOLE, f"its chunk rows count rows other than "
                                                                f"{stop - start}"))
            plan[shard] = {layer: checksum for layer, (_, checksum) in rows.items()}
        return findings, plan

    @staticmethod
    def _verdict(record: RunRecord, findings: list[Damage], shards: int) -> dict:
        findings = list(dict.fromkeys(findings))  # damaged metadata: the same finding from every shard's task
        damaged_shards = sorted({f.shard for f in findings if f.shard != WHOLE})
        status = "damaged" if findings else ("ok" if record.status == "committed" else "incomplete")
        return {"run_key": record.run_key, "status": status, "shards": shards,
                "damage": [asdict(f) for f in sorted(findings, key=lambda f: (f.shard, f.array, f.layer))],
                "damaged_shards": damaged_shards, "recapture": status != "ok", "run_status": record.status}

    def _repair(self, record: RunRecord, verdict: dict) -> dict:
        key = record.run_key
        if verdict["status"] != "damaged":
            return verdict
        if self.jobs.live_for(key) is not None:
            busy = Damage("run", WHOLE, WHOLE, "a capture of the run is running: not repaired; verify it when it ends")
            return {**verdict, "damage": [*verdict["damage"], asdict(busy)]}
        if any(created_once(d["array"]) for d in verdict["damage"]):
            self.catalog.runs.delete(key)
            self.arrays.delete_run(key)
            run_status = "deleted"
        else:
            self.arrays.drop_shards(key, verdict["damaged_shards"])
            self.catalog.chunks.drop_shards(key, verdict["damaged_shards"], "failed")
            run_status = "failed"
        self.forget()
        return {**verdict, "status": "repaired", "run_status": run_status}
