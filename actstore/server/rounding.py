"""A lossy capture's error figures, gathered over its tasks (`metrics.rounding.ErrorFigures`).

Each capture or import task measures its own shards, where their exact values are, and returns
that with their chunk rows (`workers.capture.ShardsWritten`); the job merges the tasks' figures as
they finish and stores each run's at commit, with the run (`ArrayStore.write_error_figures`).

The exact values exist only while a task holds them, so a run's figures need every shard measured
in the job that commits it: a lossy run that an earlier job left unfinished (a crash, a
cancellation, a failed task) has its stored shards dropped and captured again, in full, by the job
that resumes it. Exact dtypes resume as before, from the shards they have.
"""

from __future__ import annotations

import logging
import threading

from actstore.metrics.rounding import ErrorFigures
from actstore.store.array_store import ArrayStore, RunLayout
from actstore.store.catalog import Catalog, RunRecord
from actstore.store.quantised import is_one_byte

log = logging.getLogger(__name__)


class JobFigures:
    """The figures of one job's runs (several sites: one each), merged as tasks finish."""

    def __init__(self, catalog: Catalog, arrays: ArrayStore, layout: RunLayout, records: list[RunRecord]) -> None:
        self.catalog = catalog
        self.arrays = arrays
        self.lossy = is_one_byte(layout.dtype)
        self.records = records
        self._figures: dict[str, ErrorFigures] = {}
        self._lock = threading.Lock()

    def restart(self, recorded: list[set[int]]) -> list[set[int]]:
        """The shards each run may keep: all it has for an exact dtype; none for a lossy one, whose
        stored shards (never measured by this job) are dropped first, from the store and the catalog."""
        if not self.lossy:
            return recorded
        for record, shards in zip(self.records, recorded):
            if shards:
                log.info("run %s is int8: its %d stored shards are captured again, so that its error figures "
                         "measure every shard's exact values", record.run_key[:12], len(shards))
                self.arrays.drop_shards(record.run_key, sorted(shards))
                self.catalog.chunks.drop_shards(record.run_key, sorted(shards), "running")
        return [set() for _ in recorded]

    def add(self, figures: dict[str, ErrorFigures]) -> None:
        """Merge a task's figures (by run key)."""
        with self._lock:  # a task's figures come as Ray's read-only buffers: merged into a state of ours
            for run_key, part in figures.items():
                if run_key not in self._figures:
                    self._figures[run_key] = ErrorFigures(len(part.moments), part.width)
                self._figures[run_key].merge(part)

    def of(self, run_key: str) -> dict[str, list] | None:
        """A run's figures per layer (None for an exact dtype)."""
        if not self.lossy:
            return None
        return self._figures[run_key].finalize()
