"""The array-store contract on an S3-compatible object store (moto's server on loopback), plus
what only an object store can do wrong: a vanished or changed object, a missing bucket, a server
that is gone."""

from __future__ import annotations

import boto3
import numpy as np
import pytest

from actstore.errors import DataLoss, FailedPrecondition, Unavailable
from actstore.store.format.arrays import ZarrArrayStore
from actstore.store.handle import StoreHandle
from actstore.store.testing import ArrayStoreContract
from actstore.store.testing.runs import key, make_values, pooled_layout


class TestS3ArrayStore(ArrayStoreContract):
    @pytest.fixture(autouse=True)
    def _bucket(self, s3_bucket):
        self.url = s3_bucket

    def make_store(self, tmp_path):
        return ZarrArrayStore(self.url, "lz4")

    def _objects(self):
        bucket, prefix = self.url.removeprefix("s3://").split("/", 1)
        client = boto3.client("s3")
        listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
        return client, bucket, [o["Key"] for o in listed]

    def _written_run(self, store):
        layout = pooled_layout()
        run = key("s3-run")
        store.create_run(run, layout, [f"s{i}" for i in range(layout.n)], None, None)
        stored, _ = make_values(layout)
        for shard in range(layout.num_shards):
            start, stop = layout.shard_range(shard)
            store.write_shard(run, shard, stored[start:stop], stored[start:stop].sum(0).astype(np.float64))
        return run, layout

    def test_nothing_is_written_to_local_disk(self, tmp_path):
        store = self.make_store(tmp_path)
        self._written_run(store)
        assert not any(tmp_path.iterdir())
        _, _, keys = self._objects()
        assert any("/acts/c/" in k for k in keys)

    def test_a_vanished_shard_is_data_loss_naming_it(self, tmp_path):
        store = self.make_store(tmp_path)
        run, layout = self._written_run(store)
        client, bucket, keys = self._objects()
        client.delete_object(Bucket=bucket, Key=next(k for k in keys if k.endswith("/acts/c/1/0/0")))
        with pytest.raises(DataLoss, match="shard 1"):
            store.read_layers(run, [0], 0, layout.rows)

    def test_a_changed_shard_is_data_loss(self, tmp_path):
        store = self.make_store(tmp_path)
        run, layout = self._written_run(store)
        client, bucket, keys = self._objects()
        shard_key = next(k for k in keys if k.endswith("/acts/c/0/0/0"))
        body = bytearray(client.get_object(Bucket=bucket, Key=shard_key)["Body"].read())
        body[len(body) // 4] ^= 0xFF
        client.put_object(Bucket=bucket, Key=shard_key, Body=bytes(body))
        with pytest.raises(DataLoss):
            store.read_layers(run, [0, 1, 2, 3], 0, layout.shard_rows)


def test_a_missing_bucket_says_so(s3_server):
    with pytest.raises(FailedPrecondition, match="does not exist"):
        StoreHandle("s3://no-such-bucket-here/x").check()


def test_wrong_credentials_name_the_variables(s3_bucket, monkeypatch):
    # moto accepts any key unless told otherwise; a refused signature reads the same to us
    from actstore.store.backends.s3 import failure

    error = failure(RuntimeError("<Error><Code>InvalidAccessKeyId</Code></Error>"), s3_bucket)
    assert isinstance(error, FailedPrecondition) and "AWS_ACCESS_KEY_ID" in str(error)


def test_an_unreachable_endpoint_is_unavailable_without_hanging(monkeypatch):
    import socket
    import time

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    started = time.monotonic()
    with pytest.raises(Unavailable, match="AWS_ENDPOINT_URL"):
        StoreHandle("s3://bucket/prefix").check()
    assert time.monotonic() - started < 60
