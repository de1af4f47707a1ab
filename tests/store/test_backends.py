"""The backend contract (`actstore.store.testing.BackendTests`) for every registered
scheme, the array-store contract over memory://, and the registry's refusals."""

from __future__ import annotations

import uuid

import pytest

from actstore.config import Settings
from actstore.errors import FailedPrecondition, InvalidArgument
from actstore.store.backends import backend_for, schemes
from actstore.store.format.arrays import ZarrArrayStore
from actstore.store.handle import StoreHandle
from actstore.store.testing import ArrayStoreContract, BackendTests


class TestLocalBackend(BackendTests):
    @pytest.fixture
    def root(self, tmp_path):
        return str(tmp_path / "store")


class TestFileUrlBackend(BackendTests):
    @pytest.fixture
    def root(self, tmp_path):
        return f"file://{tmp_path / 'store'}"


class TestS3Backend(BackendTests):
    @pytest.fixture
    def root(self, s3_bucket):
        return s3_bucket


class TestMemoryBackend(BackendTests):
    @pytest.fixture
    def root(self):
        return f"memory://{uuid.uuid4().hex}"


class TestMemoryArrayStore(ArrayStoreContract):
    def make_store(self, tmp_path):  # one memory store a test: two calls in a test share it
        return ZarrArrayStore(f"memory://{tmp_path.as_posix().strip('/')}")


def test_an_unknown_scheme_is_refused_naming_the_schemes_taken():
    with pytest.raises(InvalidArgument, match="'gs://'") as refused:
        backend_for("gs://bucket/prefix")
    message = str(refused.value)
    assert all(f"{scheme}://" in message for scheme in schemes())
    # what to do next names only the schemes a server can serve (memory:// lives in one process)
    assert message.endswith("give a directory or a root of file:// or s3:// (--store, ACTSTORE_STORE)"), message
    assert {"file", "memory", "s3"} <= set(schemes())


def test_a_server_refuses_a_store_that_lives_in_one_process(tmp_path):
    settings = Settings(store="memory://team", server_dir=str(tmp_path))
    with pytest.raises(FailedPrecondition, match="live in one process.*use a directory or s3://"):
        StoreHandle.from_settings(settings)
    with pytest.raises(FailedPrecondition, match="no files area"):
        StoreHandle("memory://team").local("models/m")
