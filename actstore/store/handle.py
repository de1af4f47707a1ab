"""The store handle: one small picklable reference that opens the activation store anywhere.

The service, every Ray task and every actor receive a ``StoreHandle`` (never a path and a codec
string) and call ``open()``. The root is a local path (or ``file://`` URL), which opens the Zarr directory store, or an
``s3://bucket/prefix`` URL, which opens it on an S3-compatible object store (`objects`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from actstore.config import Settings
from actstore.store import objects
from actstore.store.array_store import ArrayStore
from actstore.store.arrays import ZarrArrayStore
from actstore.store.files import LocalFiles, ObjectFiles, StoreFiles, default_cache_dir
from actstore.store.retries import Observer, RetryPolicy

# One ArrayStore per handle and process: it caches run layouts, and tasks of one worker share it.
_OPENED: dict[StoreHandle, ArrayStore] = {}


@dataclass(frozen=True)
class StoreHandle:
    """Where the store lives (``root``: a local path, ``file://`` or ``s3://`` URL), how chunks
    are coded, and for an object store its S3 configuration (read from the AWS variables where
    the handle is made, so a worker on any node opens the same bucket)."""

    root: str
    compressor: str = "lz4"
    local_dir: str = ""  # with a URL root: the server's own directory (the catalog)
    s3_config: objects.S3Config | None = field(default=None, repr=False)  # credentials: never printed
    read_cache: str = ""  # with a URL root: each node's directory of the chunks it read (`store.read_cache`)
    read_cache_bytes: int = 0
    retry: RetryPolicy = RetryPolicy()  # how an object store's calls are retried (`store.retries`)

    @classmethod
    def from_settings(cls, settings: Settings, observer: Observer | None = None) -> StoreHandle:
        """The handle of the settings' store; ``observer`` is told of every object-store retry and
        call given up, in whichever process it happens (`retries.RetryPolicy`)."""
        url = objects.is_url(settings.store_root)
        config = objects.config_from_env() if url else None
        cache = settings.read_cache if url and settings.read_cache else ""
        return cls(settings.store_root, settings.compressor, str(settings.server_path), config, cache,
                   int(settings.read_cache_gb * (1 << 30)), RetryPolicy.from_settings(settings, observer))

    @property
    def is_url(self) -> bool:
        return objects.is_url(self.root)

    @property
    def path(self) -> Path:
        """The directory for everything but the arrays: registered models and datasets, training
        checkpoints, partial results of matrix jobs and, by default, the catalog. A local store
        keeps them beside its arrays."""
        return Path(self.local_dir or self.root.removeprefix("file://")).expanduser()

    @property
    def cache_dir(self) -> Path:
        """This node's cache: converted builtin models, and with a URL store the downloaded copies."""
        return default_cache_dir(self.root) if self.is_url else self.path / "cache"

    def check(self) -> None:
        """Fail fast, saying what to fix, when an object store cannot be reached."""
        if self.is_url:
            objects.check_reachable(self.root, self.s3_config, self.retry)

    @property
    def files(self) -> StoreFiles:
        """The store's folders of models and datasets (`store.files`)."""
        return ObjectFiles(self.root, config=self.s3_config, retry=self.retry) if self.is_url else LocalFiles(self.path)

    def local(self, ref: str) -> Path:
        """A local folder with the files of a model or dataset the catalog names ``ref``."""
        return self.files.local(ref)

    def open(self) -> ArrayStore:
        store = _OPENED.get(self)
        if store is None:
            root = self.root if self.is_url else self.path
            store = _OPENED[self] = ZarrArrayStore(root, self.compressor, self.s3_config, self.read_cache or None,
                                                   self.read_cache_bytes, self.retry)
        return store
