"""The `Backend` ABC: what the store needs of one scheme of store roots (`store.backends`).

A backend is one registered object (no state of its own: every call names the root), so a
`StoreHandle` carries only the root and the backend's options to a Ray worker, and the worker
finds the same backend by the root's scheme. Its capabilities are attributes that the store
reads instead of testing a scheme or a zarr store's type:

    is_remote        the bytes are elsewhere (an object store): the catalog and the server's
                     files need a local server directory, chunks may be kept by a node's read-through
                     cache (`store.backends.read_cache`), and training runs in a scratch folder it uploads
    spans_processes  every process (a Ray worker on any node) that opens the root sees the same
                     bytes; a server, whose work runs in Ray workers, refuses a store without it
    errors           the exceptions of its byte store that `failure` turns into ours
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

from zarr.abc.store import Store

from actstore.errors import ActStoreError, Unavailable
from actstore.store.backends.files import StoreFiles, default_cache_dir
from actstore.store.backends.retries import RetryPolicy

# A backend's configuration, opaque to the rest of the store: read where a handle is made
# (`Backend.options`), carried by the handle to every worker, so it is hashable and picklable
# (and may hold credentials: the handle never prints it).
Options = tuple[tuple[str, str], ...]


class Backend(ABC):
    """One scheme of store roots (``scheme://...``; the local backend also takes plain paths)."""

    scheme: str
    is_remote: bool = False
    spans_processes: bool = True
    errors: tuple[type[BaseException], ...] = ()

    def __repr__(self) -> str:
        return f"<{self.scheme}:// store backend>"

    def options(self) -> Options | None:
        """The configuration this process's environment gives; None: the backend takes none."""
        return None

    @abstractmethod
    def open(self, root: str, options: Options | None, retry: RetryPolicy) -> Store:
        """The zarr store (get, ranged get, set, list, delete) of ``root``; ``options`` None: this
        process's own (`options`); a remote one's calls retried by ``retry`` (`store.backends.retries`)."""

    def directory(self, root: str) -> Path | None:
        """The local directory whose files are the root's keys (``<directory>/<key>``), for the
        array store's direct file reads and writes; None: its keys are not files on this machine."""
        return None

    def objects(self, store: Store) -> object | None:
        """The obstore store under ``store`` (what `open` gave), for the array store's blocking
        whole-object calls and the read cache's versioned reads; None: it has none."""
        return None

    def failure(self, exc: BaseException, root: str) -> ActStoreError:
        """Our error for one of `errors` raised by the store of ``root``, saying what to do."""
        first_line = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        return Unavailable(f"the store {root} did not answer ({first_line}): check that it is reachable, then retry")

    def files(self, root: str, options: Options | None, retry: RetryPolicy) -> StoreFiles | None:
        """The root's files area (models, datasets, checkpoints: `store.backends.files`); None: it has none."""
        return None

    def check(self, root: str, options: Options | None, retry: RetryPolicy) -> None:
        """Fail fast, saying what to fix, when the root cannot be reached."""
        return None  # nothing to reach: a backend with a server behind it checks it

    def cache_dir(self, root: str) -> Path:
        """This node's cache for the root (converted builtin models, downloaded folders): beside
        its files where they are on this machine, else one a root under the system temp directory."""
        directory = self.directory(root)
        return directory / "cache" if directory is not None else default_cache_dir(root)
