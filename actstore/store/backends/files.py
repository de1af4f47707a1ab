"""Folders of files that live in the store beside the arrays: registered models
(``models/<digest>``), datasets (``datasets/<digest>``) and training checkpoints
(``training/<run>/step-<k>``, see ``actstore.training.stored``), which every worker node reads.

A folder is written whole or not at all: on local disk through ``atomic_directory``; on an object
store by uploading every file and then a ``.complete`` marker, which readers require. A worker
reads a folder through ``local(ref)``: the folder itself on local disk, or a copy downloaded once
per node into a cache directory (models are loaded from files by torch and HF).
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

from actstore.errors import ActStoreError, DataLoss, NotFound
from actstore.store.atomic import atomic_directory, atomic_write_bytes
from actstore.store.backends.retries import RetryPolicy

COMPLETE_MARKER = ".complete"
RECORD_FILE = "record.json"  # a registered model's catalog record, kept in its folder
Build = Callable[[Path], None]  # creates the (absent) folder it is given, with its files


class StoreFiles(ABC):
    """What registration and workers need of the store's non-array files."""

    @abstractmethod
    def ref(self, key: str) -> str:
        """How the catalog names folder ``key`` (what ``local`` takes back)."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether folder ``key`` is complete."""

    @abstractmethod
    def write_folder(self, key: str, build: Build) -> str:
        """Make folder ``key`` with ``build`` unless it is complete already; returns its ref."""

    @abstractmethod
    def local(self, ref: str) -> Path:
        """A local folder holding the files of ``ref``."""

    @abstractmethod
    def folders(self, prefix: str) -> list[str]:
        """Keys of the complete folders directly under ``prefix`` (e.g. ``models``)."""

    @abstractmethod
    def read(self, key: str, name: str) -> bytes | None:
        """One file of folder ``key``, or None if it has none by that name."""

    @abstractmethod
    def write(self, key: str, name: str, data: bytes) -> None:
        """Replace one small file of folder ``key`` whole (a status file: readers see the old or
        the new bytes); it does not make the folder complete."""

    @abstractmethod
    def remove(self, key: str) -> None:
        """Remove folder ``key``: incomplete first (its marker goes before its files), then gone."""


class LocalFiles(StoreFiles):
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def ref(self, key: str) -> str:
        return str(self.root / key)

    def exists(self, key: str) -> bool:
        return (self.root / key).is_dir()

    def write_folder(self, key: str, build: Build) -> str:
        if not self.exists(key):
            (self.root / key).parent.mkdir(parents=True, exist_ok=True)
            build(self.root / key)
        return self.ref(key)

    def local(self, ref: str) -> Path:
        return Path(ref)

    def folders(self, prefix: str) -> list[str]:
        parent = self.root / prefix
        if not parent.is_dir():
            return []
        return sorted(f"{prefix}/{p.name}" for p in parent.iterdir() if p.is_dir() and not p.name.startswith("."))

    def read(self, key: str, name: str) -> bytes | None:
        path = self.root / key / name
        return path.read_bytes() if path.is_file() else None

    def write(self, key: str, name: str, data: bytes) -> None:
        atomic_write_bytes(self.root / key / name, data)

    def remove(self, key: str) -> None:
        shutil.rmtree(self.root / key, ignore_errors=True)


class ObjectFiles(StoreFiles):
    """Folders as objects under ``<url>/<key>/``; refs are keys, copies cached in ``cache_dir``.
    The backend of ``url`` gives the obstore store of its prefix (``objects``, a new one each
    call) and its errors as ours (``failure``: `Backend.failure`)."""

    def __init__(self, url: str, objects: Callable[[], object], failure: Callable[[BaseException, str], ActStoreError],
                 cache_dir: Path | None = None, retry: RetryPolicy | None = None) -> None:
        self.url = url
        self.objects, self.failure = objects, failure
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir(url)
        self.retry = retry or RetryPolicy()

    def _store(self):
        return self.objects()

    def _call(self, request: str, fn):
        """``fn()``, retried where it fails transiently (`store.backends.retries`)."""
        return self.retry.call(self.url, request, fn)

    def _names(self, store, prefix: str) -> list[str]:
        """Every key under ``prefix``: a listing cut short is listed again whole."""
        import obstore

        return self._call(f"LIST {prefix}", lambda: [meta["path"] for batch in obstore.list(store, prefix=prefix)
                                                     for meta in batch])

    def ref(self, key: str) -> str:
        return key

    def exists(self, key: str) -> bool:
        import obstore

        try:
            self._call(f"HEAD {key}/{COMPLETE_MARKER}", lambda: obstore.head(self._store(), f"{key}/{COMPLETE_MARKER}"))
            return True
        except FileNotFoundError:
            return False
        except Exception as exc:
            raise self.failure(exc, self.url) from None

    def write_folder(self, key: str, build: Build) -> str:
        import obstore

        if self.exists(key):
            return key
        store = self._store()
        with tempfile.TemporaryDirectory(prefix="actstore-upload-") as tmp:
            folder = Path(tmp) / "folder"
            build(folder)
            try:
                for path in sorted(p for p in folder.rglob("*") if p.is_file()):
                    name = f"{key}/{path.relative_to(folder).as_posix()}"
                    self._call(f"PUT {name}", lambda name=name, path=path: obstore.put(store, name, path))
                # last: the folder is whole
                self._call(f"PUT {key}/{COMPLETE_MARKER}", lambda: obstore.put(store, f"{key}/{COMPLETE_MARKER}", b""))
            except Exception as exc:
                raise self.failure(exc, self.url) from None
        return key

    def local(self, ref: str) -> Path:
        import obstore

        target = self.cache_dir / ref
        if target.is_dir():
            return target
        store = self._store()
        try:
            names = self._names(store, f"{ref}/")
        except Exception as exc:
            raise self.failure(exc, self.url) from None
        if f"{ref}/{COMPLETE_MARKER}" not in names:
            if names:
                raise DataLoss(f"the folder {ref} in {self.url} is incomplete (no {COMPLETE_MARKER} marker): "
                               "register it again")
            raise NotFound(f"no folder {ref} in {self.url}: was it registered against another store?")
        try:
            with atomic_directory(target) as staging:
                for name in names:
                    path = staging / name[len(ref) + 1:]
                    path.parent.mkdir(parents=True, exist_ok=True)
                    found = self._call(f"GET {name}", lambda name=name: obstore.get(store, name).bytes())
                    path.write_bytes(bytes(found))
        except FileExistsError:
            pass  # another task on this node downloaded it meanwhile
        except (FileNotFoundError, OSError) as exc:
            raise self.failure(exc, self.url) from None
        return target


    def folders(self, prefix: str) -> list[str]:
        try:
            names = self._names(self._store(), f"{prefix}/")
        except Exception as exc:
            raise self.failure(exc, self.url) from None
        marker = "/" + COMPLETE_MARKER
        return sorted(name.removesuffix(marker) for name in names
                      if name.endswith(marker) and name.count("/") == prefix.count("/") + 2)

    def read(self, key: str, name: str) -> bytes | None:
        import obstore

        try:
            return bytes(self._call(f"GET {key}/{name}", lambda: obstore.get(self._store(), f"{key}/{name}").bytes()))
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise self.failure(exc, self.url) from None

    def write(self, key: str, name: str, data: bytes) -> None:
        import obstore

        try:
            # an object is replaced whole
            self._call(f"PUT {key}/{name}", lambda: obstore.put(self._store(), f"{key}/{name}", data))
        except Exception as exc:
            raise self.failure(exc, self.url) from None

    def remove(self, key: str) -> None:
        import obstore

        store = self._store()
        try:
            # first: readers no longer take it
            self._call(f"DELETE {key}/{COMPLETE_MARKER}", lambda: obstore.delete(store, f"{key}/{COMPLETE_MARKER}"))
            names = self._names(store, f"{key}/")
            if names:
                self._call(f"DELETE {len(names)} objects under {key}/", lambda: obstore.delete(store, names))
        except FileNotFoundError:
            pass
        except Exception as exc:
            raise self.failure(exc, self.url) from None


def default_cache_dir(url: str) -> Path:
    """One cache per store URL and node, under the system temp directory."""
    return Path(tempfile.gettempdir()) / "actstore-cache" / hashlib.sha256(url.encode()).hexdigest()[:12]
