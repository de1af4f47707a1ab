"""Contract suites a backend's tests subclass (as zarr-python's ``zarr.testing.store.StoreTests``):
`ArrayStoreContract` for an `ArrayStore` (`runs`, `upkeep`), `BackendTests` for a byte-store
backend (`backends`). They import pytest (and torch): only tests import this package."""

from actstore.store.testing.backends import BackendTests
from actstore.store.testing.runs import RunContract
from actstore.store.testing.upkeep import ArrayStoreContract

__all__ = ["ArrayStoreContract", "BackendTests", "RunContract"]
