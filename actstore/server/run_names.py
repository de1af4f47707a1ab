"""The names of an answer's runs, for its reply: each run's model and dataset by an alias, its
pooling and site (`records.RunName`), so a notebook shows "minilm-l6 / rotten-tomatoes" instead of
a run key.

Kept per run key in an LRU, so a reply pays a dictionary lookup per run, not catalog queries: a
cached answer is served at thousands a second. What is kept is forgotten when any model or dataset
alias is set (the catalog counts those writes: `version`) or a run is deleted (`forget`); a reply
kept whole (`replies.KeptReplies`) is rebuilt then too.
"""

from __future__ import annotations

import threading

from cachetools import LRUCache

from actstore.errors import NotFound
from actstore.records import RunName
from actstore.store.catalog import Catalog
from actstore.store.keys import site_of


def display_alias(aliases: tuple[str, ...]) -> str:
    """The alias to show: a training checkpoint's own NAME@stepK (its bare NAME follows the newest
    checkpoint), else the first in order; "" for none."""
    own = [alias for alias in aliases if "@step" in alias]
    return (own or list(aliases) or [""])[0]


class RunNames:
    def __init__(self, catalog: Catalog, entries: int) -> None:
        self.catalog = catalog
        self._lock = threading.Lock()
        self._names: LRUCache[str, RunName] = LRUCache(entries)
        self._version = self.version()

    def version(self) -> tuple[int, int]:
        """Changes whenever a model or dataset alias is set."""
        return self.catalog.models.alias_writes, self.catalog.datasets.alias_writes

    def forget(self) -> None:
        with self._lock:
            self._names.clear()

    def of(self, run_keys: list[str]) -> list[RunName]:
        """The name of each run key, in order (only the key for a run the catalog no longer has)."""
        version = self.version()
        with self._lock:
            if version != self._version:
                self._names.clear()
                self._version = version
            known = [self._names.get(key) for key in run_keys]
        if all(known):
            return known
        names = [name or self._lookup(key) for name, key in zip(known, run_keys)]
        with self._lock:
            if self._version == version:
                self._names.update(zip(run_keys, names))
        return names

    def _lookup(self, run_key: str) -> RunName:
        try:
            run = self.catalog.runs.get(run_key)
            model = display_alias(self.catalog.models.get(run.model_digest).aliases)
            dataset = display_alias(self.catalog.datasets.get(run.dataset_digest).aliases)
        except NotFound:
            return RunName(run_key)
        return RunName(run_key, model, dataset, run.pooling, site_of(run.spec))
