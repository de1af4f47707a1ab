"""The catalog's jobs: every job submitted, with its progress and outcome (`Catalog.jobs`)."""

from __future__ import annotations

import json

from actstore.errors import InvalidArgument, NotFound
from actstore.store.catalog.family import Family
from actstore.store.catalog.schema import JobRecord

JOB_STATUSES = ("queued", "running", "done", "failed", "cancelled", "interrupted")


class Jobs(Family):
    def add(self, job: JobRecord) -> None:
        self._catalog.execute(
            "INSERT INTO jobs (job_id, kind, target, status, request, done, total, error, principal) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [job.job_id, job.kind, job.target, job.status, json.dumps(job.request), job.done,
             job.total, job.error, job.principal],
        )

    def update(self, job_id: str, *, status: str | None = None, done: int | None = None,
               total: int | None = None, error: str | None = None) -> None:
        """Set the fields given (the others keep their values) and the update time."""
        self._catalog.execute(
            "UPDATE jobs SET status = coalesce(?, status), done = coalesce(?, done), "
            "total = coalesce(?, total), error = coalesce(?, error), updated_at = now() "
            "WHERE job_id = ?",
            [status, done, total, error, job_id],
        )

    def get(self, job_id: str) -> JobRecord:
        rows = self._catalog.rows(
            "SELECT job_id, kind, target, status, request, done, total, error, principal FROM jobs WHERE job_id = ?",
            [job_id],
        )
        if not rows:
            raise NotFound(f"unknown job {job_id!r}: list jobs with `actstore jobs`")
        r = rows[0]
        return JobRecord(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5], r[6], r[7], r[8])

    def latest(self, target: str) -> JobRecord | None:
        """The newest job for ``target`` (a run key or result key), if any."""
        rows = self._catalog.rows("SELECT job_id FROM jobs WHERE target = ? ORDER BY created_at DESC LIMIT 1",
                                  [target])
        return self.get(rows[0][0]) if rows else None

    def all(self, status: str | None = None) -> list[JobRecord]:
        """Every job, oldest first, or those with ``status``."""
        if status is not None and status not in JOB_STATUSES:
            raise InvalidArgument(f"job status {status!r} is not one of {', '.join(JOB_STATUSES)}")
        ids = self._catalog.rows(
            "SELECT job_id FROM jobs WHERE (? IS NULL OR status = ?) ORDER BY created_at", [status, status]
        )
        return [self.get(r[0]) for r in ids]

    def finished_captures(self, limit: int) -> list[tuple[dict, float]]:
        """(request, seconds from submit to done) of the newest `limit` capture jobs that computed
        something (a cache hit is recorded done at once and never updated)."""
        rows = self._catalog.rows(
            "SELECT request, epoch(updated_at - created_at) FROM jobs WHERE kind = 'capture' "
            "AND status = 'done' AND updated_at > created_at ORDER BY updated_at DESC LIMIT ?", [limit])
        return [(json.loads(r[0]), float(r[1])) for r in rows]
