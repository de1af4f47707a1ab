"""The backend contract (`actstore.store.backends.testing.BackendTests`) for every registered
scheme, and the registry's refusals."""

from __future__ import annotations

import pytest

from actstore.errors import InvalidArgument
from actstore.store.backends import backend_for, schemes
from actstore.store.backends.testing import BackendTests


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


def test_an_unknown_scheme_is_refused_naming_the_schemes_taken():
    with pytest.raises(InvalidArgument, match="'gs'") as refused:
        backend_for("gs://bucket/prefix")
    assert all(repr(scheme) in str(refused.value) for scheme in schemes())
