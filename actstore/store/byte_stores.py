"""The byte-level stores under the arrays, by the scheme of a store's root: zarr stores
(`zarr.abc.store.Store`: get, ranged get, set, list, delete), one per scheme, and a read-through
cache in front of a remote one where a node has a local directory for it (`store.read_cache`).

    file (a path or file:// URL)  zarr's LocalStore
    s3://bucket/prefix            zarr's ObjectStore over obstore's S3Store, its calls retried
                                  (`store.objects.RetryingStore`, `store.retries`)
    + read_cache=DIR              ReadThroughCache(that store, DIR): its chunks kept on local disk
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from zarr.abc.store import Store
from zarr.storage import LocalStore

from actstore.errors import InvalidArgument
from actstore.store import objects
from actstore.store.read_cache import ReadThroughCache
from actstore.store.retries import RetryPolicy

SCHEMES = {
    "file": lambda root, config, retry: LocalStore(Path(str(root).removeprefix("file://")).expanduser()),
    "s3": lambda root, config, retry: objects.zarr_store(str(root), config, retry),
}


def open_store(root: Path | str, s3_config: objects.S3Config | None = None, read_cache: str | Path | None = None,
               read_cache_bytes: int = 0, retry: RetryPolicy | None = None) -> Store:
    """The zarr store of ``root`` (see the module); ``read_cache`` only in front of a remote one;
    a remote one's calls retried by ``retry`` (`store.retries`)."""
    scheme = urlparse(str(root)).scheme if "://" in str(root) else "file"
    if scheme not in SCHEMES:
        raise InvalidArgument(f"store {root} has the scheme {scheme!r}; the store takes {sorted(SCHEMES)}")
    store = SCHEMES[scheme](root, s3_config, retry or RetryPolicy())
    if read_cache and scheme != "file":
        return ReadThroughCache(store, Path(read_cache).expanduser(), read_cache_bytes)
    return store
