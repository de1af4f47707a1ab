"""The store handle: one small picklable reference that opens the activation store anywhere.

The service, every Ray task and every actor receive a ``StoreHandle`` (never a path and a codec
string) and call ``open()``. The root's scheme picks its backend (`store.backends`: a local path
or ``file://`` URL, an ``s3://bucket/prefix`` URL, ...), which opens the arrays' byte store and
the files area; the handle carries the backend's options, read where the handle is made.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from actstore.config import Settings
from actstore.errors import FailedPrecondition
from actstore.store.array_store import ArrayStore
from actstore.store.backends import Backend, Options, backend_for
from actstore.store.backends.files import StoreFiles
from actstore.store.backends.retries import Observer, RetryPolicy
from actstore.store.format.arrays import ZarrArrayStore

# One ArrayStore per handle and process: it caches run layouts, and tasks of one worker share it.
_OPENED: dict[StoreHandle, ArrayStore] = {}


@dataclass(frozen=True)
class StoreHandle:
    """Where the store lives (``root``: a local path or a URL of a registered scheme), how chunks
    are coded, and its backend's options (for an object store its S3 configuration, read from the
    AWS variables where the handle is made, so a worker on any node opens the same bucket)."""

    root: str
    compressor: str = "lz4"
    local_dir: str = ""  # with a remote root: the server's own directory (the catalog)
    options: Options | None = field(default=None, repr=False)  # may hold credentials: never printed
    # with a remote root: each node's directory of the chunks it read (`store.backends.read_cache`)
    read_cache: str = ""
    read_cache_bytes: int = 0
    retry: RetryPolicy = RetryPolicy()  # how an object store's calls are retried (`store.backends.retries`)

    @classmethod
    def from_settings(cls, settings: Settings, observer: Observer | None = None) -> StoreHandle:
        """The handle of the settings' store; ``observer`` is told of every object-store retry and
        call given up, in whichever process it happens (`retries.RetryPolicy`). A store that no
        other process can open is refused: the server's work runs in Ray workers."""
        backend = backend_for(settings.store_root)
        if not backend.spans_processes:
            raise FailedPrecondition(f"the store {settings.store} cannot be served: {backend.scheme}:// stores live in "
                                     "one process, and the server's Ray workers run in others; use a directory or "
                                     "s3://bucket/prefix (ACTSTORE_STORE, --store)")
        cache = settings.read_cache if backend.is_remote and settings.read_cache else ""
        return cls(settings.store_root, settings.compressor, str(settings.server_path), backend.options(), cache,
                   int(settings.read_cache_gb * (1 << 30)), RetryPolicy.from_settings(settings, observer))

    @property
    def backend(self) -> Backend:
        return backend_for(self.root)

    @property
    def is_remote(self) -> bool:
        """Whether the arrays and files live elsewhere (an object store: `Backend.is_remote`)."""
        return self.backend.is_remote

    @property
    def path(self) -> Path:
        """The directory for everything but the arrays: registered models and datasets, training
        checkpoints, partial results of matrix jobs and, by default, the catalog. A local store
        keeps them beside its arrays."""
        directory = Path(self.local_dir).expanduser() if self.local_dir else self.backend.directory(self.root)
        if directory is None:
            raise FailedPrecondition(f"the store {self.root} keeps no files on this machine: give its handle a "
                                     "local_dir (the server's ACTSTORE_SERVER_DIR)")
        return directory

    @property
    def cache_dir(self) -> Path:
        """This node's cache: converted builtin models, and with a remote store the downloaded copies."""
        return self.backend.cache_dir(self.root)

    def check(self) -> None:
        """Fail fast, saying what to fix, when the store cannot be reached."""
        self.backend.check(self.root, self.options, self.retry)

    @property
    def files(self) -> StoreFiles:
        """The store's folders of models and datasets (`store.backends.files`)."""
        files = self.backend.files(self.root, self.options, self.retry)
        if files is None:
            raise FailedPrecondition(f"the store {self.root} has no files area for models, datasets and checkpoints: "
                                     "use a directory or s3://bucket/prefix")
        return files

    def local(self, ref: str) -> Path:
        """A local folder with the files of a model or dataset the catalog names ``ref``."""
        return self.files.local(ref)

    def open(self) -> ArrayStore:
        store = _OPENED.get(self)
        if store is None:
            store = _OPENED[self] = ZarrArrayStore(self.root, self.compressor, self.options, self.read_cache or None,
                                                   self.read_cache_bytes, self.retry)
        return store
