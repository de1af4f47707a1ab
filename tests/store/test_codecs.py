"""store.codecs: objects coded through zarr's own codec objects are the objects zarr itself writes,
byte for byte, and zarr's objects decode here (also shards zarr left inner chunks out of)."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec
from zarr.core.buffer import default_buffer_prototype
from zarr.storage import MemoryStore

from actstore.store.codecs import ChunkCodec, FixedBlock

ROWS, STATES, WIDTH = 8, 3, 16


def compressors(itemsize: int) -> list:  # as ZarrArrayStore makes its arrays
    return [BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle", typesize=itemsize), Crc32cCodec()]


@pytest.fixture
def store():
    return MemoryStore()


def sharded(store, dtype="float16", rows=3 * ROWS - 5) -> zarr.Array:
    return zarr.create_array(store, name="acts", shape=(rows, STATES, WIDTH), chunks=(ROWS, 1, WIDTH),
                             shards=(ROWS, STATES, WIDTH), dtype=dtype,
                             compressors=compressors(np.dtype(dtype).itemsize), fill_value=0)


def stored(store, key: str) -> bytes:
    return store._store_dict[key].to_bytes()


def values(rows=ROWS, dtype="float16", seed=0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((rows, STATES, WIDTH)) * 3).astype(dtype)


@pytest.mark.parametrize("dtype", ["float16", "float32", "uint16"])
def test_a_shard_is_the_object_zarr_writes(store, dtype):
    array = sharded(store, dtype)
    codec = ChunkCodec(array)
    assert codec.key((1, 0, 0)) == "acts/c/1/0/0" and codec.index_size == 16 * STATES + 4
    shard = values(dtype=dtype)
    array[ROWS:2 * ROWS] = shard
    assert codec.encode(shard).to_bytes() == stored(store, "acts/c/1/0/0")
    last = values(ROWS - 5, dtype, seed=1)  # the last shard is partial: padded with the fill value
    array[2 * ROWS:] = last
    assert codec.encode(last).to_bytes() == stored(store, "acts/c/2/0/0")


def test_zarr_reads_what_is_coded_here_and_back(store):
    array = sharded(store)
    codec = ChunkCodec(array)
    shards = [values(seed=s) for s in range(2)] + [values(ROWS - 5, seed=2)]
    for s, shard in enumerate(shards):
        store._store_dict[codec.key((s, 0, 0))] = codec.encode(shard)
    np.testing.assert_array_equal(array[:], np.concatenate(shards))
    whole = codec.decode(store._store_dict["acts/c/2/0/0"])
    np.testing.assert_array_equal(whole[:ROWS - 5], shards[2])
    assert not whole[ROWS - 5:].any()


def test_inner_chunks_read_alone_and_left_out_ones_are_the_fill_value(store):
    array = sharded(store)
    codec = ChunkCodec(array)
    shard = values()
    shard[:, 1] = 0  # zarr leaves an inner chunk of only fill values out of the shard
    array[:ROWS] = shard
    data = store._store_dict["acts/c/0/0/0"]
    assert len(data) < len(codec.encode(shard))  # ours keeps it (a written shard always exists)
    index = codec.index(data[len(data) - codec.index_size:])
    assert codec.chunk_range(index, (0, 1, 0)) is None
    for layer in range(STATES):
        where = codec.chunk_range(index, (0, layer, 0))
        part = None if where is None else data[where[0]:where[1]]
        np.testing.assert_array_equal(codec.decode_inner(part)[:, 0], shard[:, layer])
    np.testing.assert_array_equal(codec.decode(data), shard)


def test_unsharded_chunks_are_zarrs_too(store):
    sums = zarr.create_array(store, name="sums", shape=(3, STATES, WIDTH), chunks=(1, STATES, WIDTH),
                             dtype="float64", compressors=compressors(8), fill_value=0)
    codec = ChunkCodec(sums)
    row = np.random.default_rng(0).standard_normal((STATES, WIDTH))
    sums[2] = row
    assert codec.key((2, 0, 0)) == "sums/c/2/0/0"
    assert codec.encode(row[None]).to_bytes() == stored(store, "sums/c/2/0/0")
    np.testing.assert_array_equal(codec.decode(store._store_dict["sums/c/2/0/0"])[0], row)
    ids = zarr.create_array(store, name="ids", shape=(2 * ROWS - 3,), chunks=(ROWS,), dtype="int64",
                            compressors=compressors(8), fill_value=-1)
    ids[ROWS:] = np.arange(ROWS - 3)
    assert ChunkCodec(ids).encode(np.arange(ROWS - 3)).to_bytes() == stored(store, "ids/c/1")


def test_a_flipped_byte_fails_the_crc32c_of_its_chunk_or_the_index(store):
    codec = ChunkCodec(sharded(store))
    data = bytearray(codec.encode(values()).to_bytes())
    prototype = default_buffer_prototype()
    good = codec.index(prototype.buffer.from_bytes(bytes(data[-codec.index_size:])))
    start, stop = codec.chunk_range(good, (0, 2, 0))
    data[(start + stop) // 2] ^= 0xFF
    damaged = prototype.buffer.from_bytes(bytes(data))
    with pytest.raises(ValueError, match="checksum"):
        codec.decode_inner(damaged[start:stop])
    with pytest.raises(ValueError, match="checksum"):
        codec.decode(damaged)
    other, _ = codec.chunk_range(good, (0, 1, 0)), None
    assert codec.decode_inner(damaged[other[0]:other[1]]).shape == (ROWS, 1, WIDTH)  # the others still read
    data[-10] ^= 0xFF
    with pytest.raises(ValueError, match="checksum"):
        codec.index(prototype.buffer.from_bytes(bytes(data[-codec.index_size:])))


def test_zarr_reads_a_shard_with_a_trailer_as_if_it_were_not_there(store):
    array = sharded(store)
    codec = ChunkCodec(array)
    block = FixedBlock.of((STATES, WIDTH), "float64")
    shard = values()
    sums = shard.sum(axis=0, dtype=np.float64)
    data = codec.encode(shard, [block.encode(sums)])
    assert len(data) == len(codec.encode(shard)) + block.nbytes
    store._store_dict[codec.key((0, 0, 0))] = data
    np.testing.assert_array_equal(array[:ROWS], shard)  # zarr's own reader
    np.testing.assert_array_equal(codec.decode(data), shard)
    tail = data[len(data) - codec.index_size - block.nbytes:]  # what a suffix request of the reader gets
    np.testing.assert_array_equal(block.decode(tail[:block.nbytes]), sums)
    with pytest.raises(TypeError, match="only a shard"):
        ChunkCodec(zarr.create_array(store, name="flat", shape=(4,), dtype="int64")).encode(np.arange(4), [tail])


def test_a_fixed_block_is_a_checksummed_zarr_chunk_of_fixed_size(store):
    block = FixedBlock.of((STATES, WIDTH), "float64")
    assert FixedBlock.of((STATES, WIDTH), "float64") is block and block.nbytes == 8 * STATES * WIDTH + 4
    plain = zarr.create_array(store, name="plain", shape=(STATES, WIDTH), dtype="float64", compressors=[Crc32cCodec()],
                              fill_value=0)
    sums = np.random.default_rng(3).standard_normal((STATES, WIDTH))
    plain[:] = sums
    assert block.encode(sums).to_bytes() == stored(store, "plain/c/0/0")  # what zarr writes for such an array
    assert [c["name"] for c in block.describe()["codecs"]] == ["bytes", "crc32c"]
    data = bytearray(block.encode(sums).to_bytes())
    data[100] ^= 0x01
    prototype = default_buffer_prototype()
    with pytest.raises(ValueError, match="checksum"):
        block.decode(prototype.buffer.from_bytes(bytes(data)))
    with pytest.raises(ValueError, match="not"):
        block.decode(prototype.buffer.from_bytes(bytes(data[:-8])))


@pytest.mark.parametrize("codecs", [[Crc32cCodec()], [BloscCodec(cname="zstd", clevel=1, shuffle="shuffle")], []],
                         ids=["crc32c only", "Blosc without crc32c", "no codecs"])
def test_other_codec_chains_code_as_zarr_does(store, codecs):
    array = zarr.create_array(store, name="other", shape=(ROWS, STATES, WIDTH), chunks=(ROWS, 1, WIDTH),
                              shards=(ROWS, STATES, WIDTH), dtype="float32", compressors=codecs, fill_value=0)
    codec = ChunkCodec(array)
    shard = values(dtype="float32")
    array[:] = shard
    data = store._store_dict["other/c/0/0/0"]
    assert codec.encode(shard).to_bytes() == data.to_bytes()
    index = codec.index(data[len(data) - codec.index_size:])
    for layer in range(STATES):
        start, stop = codec.chunk_range(index, (0, layer, 0))
        np.testing.assert_array_equal(codec.decode_inner(data[start:stop])[:, 0], shard[:, layer])


def test_a_chunk_decodes_in_place_only_into_an_array_of_its_size(store):
    codec = ChunkCodec(sharded(store))
    shard = values()
    data = codec.encode(shard)
    index = codec.index(data[len(data) - codec.index_size:])
    start, stop = codec.chunk_range(index, (0, 1, 0))
    answer = np.zeros((2, ROWS, WIDTH), np.float16)
    codec.decode_inner_into(data[start:stop], answer[1, :, None])
    np.testing.assert_array_equal(answer[1], shard[:, 1])
    assert not answer[0].any()
    with pytest.raises(ValueError, match="Blosc frame"):
        codec.decode_inner_into(data[start:stop], np.empty((ROWS + 1, 1, WIDTH), np.float16))
    with pytest.raises(ValueError, match="contiguous"):
        codec.decode_inner_into(data[start:stop], np.empty((ROWS, 2, WIDTH), np.float16)[:, :1])
