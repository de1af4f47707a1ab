"""Storage backends, one module a scheme of store roots (as zarr-python's ``zarr/storage/``): `backend_for(root)`;
what they share: retried calls (`retries`), a node's read-through cache (`read_cache`), the files area (`files`)."""

from __future__ import annotations

import importlib
import pkgutil
from urllib.parse import urlparse

from actstore.errors import InvalidArgument
from actstore.store.backends.base import Backend, Options

__all__ = ["Backend", "Options", "backend_for", "register", "schemes"]

_BACKENDS: dict[str, Backend] = {}
# Every other module of the package registers its backend when imported (`register`), so a new
# scheme is one new module. These are not backends: the ABC and what backends share (retries,
# the read-through cache, the files area).
_NOT_BACKENDS = ("base", "retries", "read_cache", "files")


def register(backend: Backend) -> Backend:
    """Make ``backend`` the one for roots of its scheme (a backend module calls this when imported)."""
    _BACKENDS[backend.scheme] = backend
    return backend


def schemes() -> list[str]:
    """The schemes a store root may have (a plain path is ``file``)."""
    return sorted(_BACKENDS)


def backend_for(root: object) -> Backend:
    """The backend of ``root``: a ``scheme://`` URL's registered one, a plain path's the local one."""
    scheme = urlparse(str(root)).scheme if "://" in str(root) else "file"
    backend = _BACKENDS.get(scheme)
    if backend is None:
        # a server's store is one its Ray workers reach too (`spans_processes`): those are what to suggest
        known = schemes()
        served = [f"{name}://" for name in known if _BACKENDS[name].spans_processes]
        raise InvalidArgument(f"store {root}: no storage backend takes the scheme '{scheme}://' (the schemes "
                              f"known: {', '.join(f'{name}://' for name in known)}); give a directory or a "
                              f"root of {' or '.join(served)} (--store, ACTSTORE_STORE)")
    return backend


for _module in pkgutil.iter_modules(__path__):
    if _module.name not in _NOT_BACKENDS:
        importlib.import_module(f"{__name__}.{_module.name}")
