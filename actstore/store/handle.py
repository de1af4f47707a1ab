"""The store handle: one small picklable reference that opens the activation store anywhere.

The service, every Ray task and every actor receive a ``StoreHandle`` (never a path and a codec
string) and call ``open()``. The root is a URL-shaped string so that other backends plug in here:
a local path or ``file://`` URL opens the Zarr directory store.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from actstore.config import Settings
from actstore.store.arrays import ArrayStore, ZarrArrayStore

# One ArrayStore per handle and process: it caches run layouts, and tasks of one worker share it.
_OPENED: dict[StoreHandle, ArrayStore] = {}


@dataclass(frozen=True)
class StoreHandle:
    """Where the store lives (``root``: a local path or ``file://`` URL) and how chunks are coded."""

    root: str
    compressor: str = "lz4"

    @classmethod
    def from_settings(cls, settings: Settings) -> StoreHandle:
        return cls(str(settings.store_path), settings.compressor)

    @property
    def path(self) -> Path:
        """The store's local directory (datasets, models, partial results and the catalog live
        beside the arrays)."""
        return Path(self.root.removeprefix("file://")).expanduser()

    def open(self) -> ArrayStore:
        store = _OPENED.get(self)
        if store is None:
            store = _OPENED[self] = ZarrArrayStore(self.path, self.compressor)
        return store
