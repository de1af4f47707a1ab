"""The read-through cache (`store.backends.read_cache`) in front of the S3 server on loopback: the array-store
contract through it, what it must never do (serve a rewritten or deleted object's old bytes, keep
a damaged copy, grow past its limit), that a second read moves no object bytes, and the byte-level
requests (whole, ranges, absent) answered as the object store answers them."""

from __future__ import annotations

import boto3
import numpy as np
import obstore
import pytest
from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.buffer import default_buffer_prototype

from actstore.config import Settings
from actstore.errors import DataLoss
from actstore.event_loop import sync
from actstore.store.backends import read_cache
from actstore.store.backends.read_cache import ReadThroughCache
from actstore.store.format.arrays import ZarrArrayStore
from actstore.store.handle import StoreHandle
from actstore.store.testing.runs import key, make_values, pooled_layout
from tests.store import test_s3_array_store


class TestCachedS3ArrayStore(test_s3_array_store.TestS3ArrayStore):
    """Every contract and object-store test of the S3 store, through a read cache."""

    def make_store(self, tmp_path):
        return ZarrArrayStore(self.url, "lz4", read_cache=tmp_path.parent / f"{tmp_path.name}-cache")


@pytest.fixture
def written(s3_bucket, tmp_path):
    """A pooled run written to the bucket without a cache; a store reading it through one."""
    layout = pooled_layout()
    run = key("cached-run")
    writer = ZarrArrayStore(s3_bucket)
    writer.create_run(run, layout, [f"s{i}" for i in range(layout.n)], None, None)
    stored, _ = make_values(layout)
    for shard in range(layout.num_shards):
        start, stop = layout.shard_range(shard)
        writer.write_shard(run, shard, stored[start:stop], stored[start:stop].sum(0).astype(np.float64))
    reader = ZarrArrayStore(s3_bucket, read_cache=tmp_path / "cache")
    return run, layout, stored, writer, reader


class _Gets:
    """Counts the object bodies the cache fetches (obstore's own call, run through)."""

    def __init__(self, monkeypatch):
        self.calls = 0
        original = obstore.get

        def counted(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)
        monkeypatch.setattr(read_cache.obstore, "get", counted)


def _copies(tmp_path):
    return sorted(p for p in (tmp_path / "cache").rglob("*~*") if p.is_file())


def test_a_second_read_moves_no_object_bytes(written, tmp_path, monkeypatch):
    run, layout, stored, _, reader = written
    every = list(range(layout.num_states))
    first = reader.read_layers(run, every, 0, layout.rows)
    assert len(_copies(tmp_path)) == layout.num_shards
    gets = _Gets(monkeypatch)
    again = ZarrArrayStore(reader.root, read_cache=tmp_path / "cache")  # another process of the node
    np.testing.assert_array_equal(again.read_layers(run, every, 0, layout.rows), first)
    np.testing.assert_array_equal(again.read_layers(run, [1], 3, layout.rows - 2), first[1:2, 3:layout.rows - 2])
    assert gets.calls == 0
    np.testing.assert_array_equal(first, stored.astype(np.float32).transpose(1, 0, 2))


def test_a_rewritten_object_is_never_served_from_an_older_copy(written):
    run, layout, stored, writer, reader = written
    start, stop = layout.shard_range(0)
    reader.read_layers(run, [0], start, stop)
    writer.write_shard(run, 0, stored[start:stop] * 2, (stored[start:stop] * 2).sum(0).astype(np.float64))
    np.testing.assert_array_equal(reader.read_layers(run, [0], start, stop)[0],
                                  (stored[start:stop, 0] * 2).astype(np.float32))


def test_a_deleted_object_is_data_loss_and_its_copies_go(written, tmp_path, s3_bucket):
    run, layout, _, _, reader = written
    reader.read_layers(run, [0], 0, layout.rows)
    bucket, prefix = s3_bucket.removeprefix("s3://").split("/", 1)
    boto3.client("s3").delete_object(Bucket=bucket, Key=f"{prefix}/runs/{run}/acts/c/1/0/0")
    with pytest.raises(DataLoss, match="shard 1"):
        reader.read_layers(run, [0], 0, layout.rows)
    assert not any("/acts/c/1/" in str(p) for p in _copies(tmp_path))


def test_a_damaged_copy_is_read_again_from_the_object_store(written, tmp_path):
    run, layout, _, _, reader = written
    first = reader.read_layers(run, [0, 2], 0, layout.rows)
    copy = next(p for p in _copies(tmp_path) if "/acts/c/0/" in str(p))
    data = bytearray(copy.read_bytes())
    data[20] ^= 0x40
    copy.write_bytes(bytes(data))
    fresh = ZarrArrayStore(reader.root, read_cache=tmp_path / "cache")
    np.testing.assert_array_equal(fresh.read_layers(run, [0, 2], 0, layout.rows), first)
    assert next(p for p in _copies(tmp_path) if "/acts/c/0/" in str(p)).read_bytes() != bytes(data)


def test_the_cache_stays_within_its_limit(written, tmp_path):
    run, layout, _, _, _ = written
    tiny = ZarrArrayStore(written[3].root, read_cache=tmp_path / "cache", read_cache_bytes=1)
    tiny.read_layers(run, [0], 0, layout.rows)  # each copy passes a tenth of the limit: evicted down to 90%
    assert not _copies(tmp_path)
    roomy = ZarrArrayStore(written[3].root, read_cache=tmp_path / "cache", read_cache_bytes=1 << 30)
    roomy.read_layers(run, [0], 0, layout.rows)
    assert len(_copies(tmp_path)) == layout.num_shards


def test_byte_requests_answer_as_the_object_store(written, tmp_path):
    run, _, _, writer, reader = written
    shard = f"runs/{run}/acts/c/0/0/0"
    whole = bytes(obstore.get(writer._objects, shard).bytes())
    prototype = default_buffer_prototype()
    requests = [None, RangeByteRequest(5, 40), OffsetByteRequest(len(whole) - 9), SuffixByteRequest(24)]
    expected = [whole, whole[5:40], whole[-9:], whole[-24:]]
    cache = reader._zarr
    assert isinstance(cache, ReadThroughCache)
    # a suffix of an uncached object (an index, a trailer) moves alone and is not kept
    assert sync(cache.get(shard, prototype, SuffixByteRequest(24))).to_bytes() == whole[-24:]
    assert not _copies(tmp_path)
    for request, bytes_ in zip(requests, expected):
        assert sync(cache.get(shard, prototype, request)).to_bytes() == bytes_
    assert sync(cache.get(f"runs/{run}/acts/c/99/0/0", prototype)) is None
    assert sync(cache.get(f"runs/{run}/zarr.json", prototype)) is not None  # metadata: never cached
    assert all("zarr.json" not in str(p) for p in _copies(tmp_path))
    sync(cache.delete(shard))
    assert not any(str(p).startswith(str(tmp_path / "cache" / shard)) for p in _copies(tmp_path))


def test_the_setting_gives_every_handle_a_cache_of_a_remote_store_only(s3_bucket, tmp_path):
    remote = StoreHandle.from_settings(Settings(store=s3_bucket, read_cache=str(tmp_path / "c"), read_cache_gb=2))
    assert remote.read_cache == str(tmp_path / "c") and remote.read_cache_bytes == 2 << 30
    assert isinstance(remote.open()._zarr, ReadThroughCache)
    local = StoreHandle.from_settings(Settings(store=str(tmp_path / "store"), read_cache=str(tmp_path / "c")))
    assert local.read_cache == "" and not isinstance(local.open()._zarr, ReadThroughCache)
