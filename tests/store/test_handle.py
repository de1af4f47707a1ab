"""The store handle: one small picklable value that opens the same store in any process."""

from __future__ import annotations

import pickle

from actstore.config import Settings
from actstore.store.backends.files import LocalFiles, ObjectFiles
from actstore.store.format.arrays import ZarrArrayStore
from actstore.store.handle import StoreHandle


def test_a_local_handle_opens_the_directory_and_pickles(tmp_path):
    handle = StoreHandle.from_settings(Settings(store=str(tmp_path / "s")))
    assert pickle.loads(pickle.dumps(handle)) == handle
    assert handle.path == tmp_path / "s" and not handle.is_remote and handle.options is None
    assert isinstance(handle.open(), ZarrArrayStore) and handle.open() is handle.open()
    assert isinstance(handle.files, LocalFiles)


def test_an_s3_handle_carries_the_aws_configuration_but_never_prints_it(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key-id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "very-secret")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    handle = StoreHandle.from_settings(Settings(store="s3://bucket/team", server_dir=str(tmp_path)))
    assert handle.is_remote and handle.path == tmp_path
    assert dict(handle.options) == {"endpoint": "http://127.0.0.1:9", "access_key_id": "key-id",
                                      "secret_access_key": "very-secret", "region": "eu-west-1"}
    assert "very-secret" not in repr(handle)
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        monkeypatch.delenv(name)  # a worker without the variables still has them in the handle
    again = pickle.loads(pickle.dumps(handle))
    assert again == handle and isinstance(again.files, ObjectFiles)
    assert again.files.objects().config == {**dict(handle.options), "bucket": "bucket"}
