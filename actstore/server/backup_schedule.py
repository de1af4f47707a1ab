"""The catalog's backups on a schedule: every `catalog_backup_seconds`, and once more when the
server stops cleanly (`store.catalog.backups` says how a backup is made and why that way)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import duckdb

from actstore.errors import ActStoreError
from actstore.store.catalog import Catalog

log = logging.getLogger(__name__)


class BackupSchedule:
    def __init__(self, catalog: Catalog, seconds: float, keep: int) -> None:
        self.catalog, self.seconds, self.keep = catalog, seconds, keep
        self._stopping = threading.Event()
        self._thread = None
        if seconds > 0:
            self._thread = threading.Thread(target=self._loop, name="catalog-backups", daemon=True)
            self._thread.start()

    def backup(self) -> Path:
        """One backup now (also when the schedule is off: `actstore catalog backup`)."""
        return self.catalog.backup(self.keep)

    def _backup_logged(self) -> None:
        try:
            log.info("catalog backed up to %s", self.backup())
        except (OSError, duckdb.Error, ActStoreError) as exc:  # a full disk must not stop the server
            log.error("the catalog backup failed (the next one is tried on schedule): %s", exc)

    def _loop(self) -> None:
        while not self._stopping.wait(self.seconds):
            self._backup_logged()

    def stop(self) -> None:
        """End the schedule with a last backup (the catalog must still be open)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._backup_logged()
