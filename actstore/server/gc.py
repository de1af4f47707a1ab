"""Garbage collection (`actstore gc`): what the store and catalog hold that nothing needs any more.

Four kinds, each listed with its bytes and why it goes:
- cached results older than the age, then the oldest beyond the size budget (recomputed when asked);
- matrix-job partials (`<server dir>/partials/<result key>/`, see `cka_job`) of a job whose runs
  were deleted (at any age), or of a finished, failed or cancelled job (or one with no job row)
  older than the age; never those of a live job or of one an earlier server left unfinished,
  which the next start resumes;
- run folders in the store with no catalog row (what a deletion cut short left behind);
- `failed` runs created longer ago than the age: their arrays and catalog rows.
Never removed: a committed run's arrays. A run folder with a commit marker but no catalog row
is reported and kept: its catalog row was lost (a catalog restored from an older backup), and
`actstore catalog rebuild` recovers it; a deletion removes the marker first, so it is never one.
Dry-run unless `apply`.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from actstore.records import GarbageItem
from actstore.server.jobs import JobManager
from actstore.store.catalog import Catalog
from actstore.store.handle import StoreHandle

FINISHED = ("done", "failed", "cancelled")


@dataclass
class GcReport:
    items: list[GarbageItem] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # found, looked like garbage, kept on purpose
    applied: bool = False

    @property
    def total_bytes(self) -> int:
        return sum(item.bytes for item in self.items)


def _age_text(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def _folder_size_and_age(folder: Path) -> tuple[int, float]:
    """Bytes of the files below ``folder`` and the age of the newest one (or of the folder)."""
    files = [p for p in folder.rglob("*") if p.is_file()]
    newest = max([p.stat().st_mtime for p in files] + [folder.stat().st_mtime])
    return sum(p.stat().st_size for p in files), time.time() - newest


class GarbageCollector:
    def __init__(self, catalog: Catalog, store: StoreHandle, jobs: JobManager, submissions: threading.Lock) -> None:
        self.catalog = catalog
        self.store = store
        self.arrays = store.open()
        self.jobs = jobs
        self.submissions = submissions  # held by capture submission while it creates a run's folder

    def collect(self, older_than: float, max_bytes: int | None, apply: bool) -> GcReport:
        report = GcReport(applied=apply)
        removals: list[tuple[GarbageItem, Callable[[], bool]]] = []
        removals += self._results(older_than, max_bytes)
        removals += self._partials(older_than)
        removals += self._runs(older_than, report)
        for item, remove in removals:
            if not apply or remove():
                report.items.append(item)
        return report

    # ---- cached results --------------------------------------------------------------------------
    def _results(self, older_than: float, max_bytes: int | None) -> list[tuple[GarbageItem, Callable[[], bool]]]:
        rows = self.catalog.results.cached()
        remaining = sum(nbytes for _, _, nbytes, _ in rows)
        found = []
        for key, metric, nbytes, age in rows:  # oldest first
            if age >= older_than:
                reason = f"cached {metric} result, {_age_text(age)} old"
            elif max_bytes is not None and remaining > max_bytes:
                reason = f"cached {metric} result, the oldest beyond the {max_bytes}-byte budget"
            else:
                continue
            remaining -= nbytes
            found.append((GarbageItem("result", key, nbytes, reason), lambda k=key: self._remove_result(k)))
        return found

    def _remove_result(self, key: str) -> bool:
        self.catalog.results.delete([key])
        return True

    # ---- matrix-job partials ---------------------------------------------------------------------
    def _partials(self, older_than: float) -> list[tuple[GarbageItem, Callable[[], bool]]]:
        root = self.store.path / "partials"
        found = []
        for folder in sorted(root.iterdir()) if root.is_dir() else []:
            if not folder.is_dir() or self.jobs.live_for(folder.name) is not None:
                continue
            nbytes, age = _folder_size_and_age(folder)
            job = self.catalog.jobs.latest(folder.name)
            runs = job.request.get("runs", []) if job else []
            deleted = [r for r in runs if self.catalog.runs.find(r) is None]
            if deleted:
                reason = f"matrix-job partials of deleted run(s) {', '.join(r[:12] for r in deleted)}"
            elif age < older_than:
                continue
            elif job is None:
                reason = f"matrix-job partials with no job, {_age_text(age)} old"
            elif job.status in FINISHED:
                reason = f"partials of matrix job {job.job_id} ({job.status}), {_age_text(age)} old"
            else:
                continue  # an unfinished job of an earlier server: the next start resumes it
            found.append((GarbageItem("partials", folder.name, nbytes, reason),
                          lambda f=folder: self._remove_partials(f)))
        return found

    def _remove_partials(self, folder: Path) -> bool:
        if self.jobs.live_for(folder.name) is not None:  # resubmitted meanwhile
            return False
        shutil.rmtree(folder, ignore_errors=True)
        return True

    # ---- run folders -----------------------------------------------------------------------------
    def _runs(self, older_than: float, report: GcReport) -> list[tuple[GarbageItem, Callable[[], bool]]]:
        found = []
        known = {r.run_key for r in self.catalog.runs.all()}
        for key in self.arrays.group_keys():
            if key in known or self.jobs.live_for(key) is not None:
                continue
            if self.arrays.is_committed(key):
                report.kept.append(f"run {key}: committed in the store but not in the catalog (restored from an "
                                   "older backup?): `actstore catalog rebuild` recovers it")
                continue
            found.append((GarbageItem("orphaned-run", key, self.arrays.group_nbytes(key),
                                      "run folder with no catalog row (left by a deletion)"),
                          lambda k=key: self._remove_run(k, None)))
        for key in self.catalog.runs.failed_keys(older_than):
            if self.jobs.live_for(key) is None:
                found.append((GarbageItem("failed-run", key, self.arrays.group_nbytes(key),
                                          f"failed run, created over {_age_text(older_than)} ago"),
                              lambda k=key: self._remove_run(k, "failed")))
        return found

    def _remove_run(self, key: str, status: str | None) -> bool:
        """Delete a run's folder (and its catalog rows) if it is still what it was when listed;
        under the submission lock, so no capture is creating it meanwhile."""
        with self.submissions:
            record = self.catalog.runs.find(key)
            if self.jobs.live_for(key) is not None or (record.status if record else None) != status:
                return False
            if record is not None:
                self.catalog.runs.delete(key)
            self.arrays.delete_run(key)
        return True
