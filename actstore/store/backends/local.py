"""Local stores: a directory, given as a path or a ``file://`` URL. zarr's LocalStore holds the
arrays; the files area (models, datasets, checkpoints) is the directory itself (`LocalFiles`),
and the array store reads and writes the keys' files directly (`Backend.directory`)."""

from __future__ import annotations

from pathlib import Path

from zarr.storage import LocalStore

from actstore.store.backends import register
from actstore.store.backends.base import Backend, Options
from actstore.store.backends.files import LocalFiles
from actstore.store.backends.retries import RetryPolicy


class LocalBackend(Backend):
    scheme = "file"

    def directory(self, root: str) -> Path:
        return Path(str(root).removeprefix("file://")).expanduser()

    def open(self, root: str, options: Options | None, retry: RetryPolicy) -> LocalStore:
        return LocalStore(self.directory(root))

    def files(self, root: str, options: Options | None, retry: RetryPolicy) -> LocalFiles:
        return LocalFiles(self.directory(root))


register(LocalBackend())
