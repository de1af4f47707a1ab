"""store.format.codecs codes zarr's objects from the Zarr v3 specification: what it writes is, byte for
byte, the object zarr-python writes for the same values (zarr reads it), and it reads what zarr
wrote (also shards zarr left inner chunks out of).

zarr-python here is only the reference: it writes arrays through its public API into a real
LocalStore, and the objects are the files. The module needs nothing but zarr, numcodecs, crc32c
and pytest, so `scripts/zarr_versions.sh` runs it unchanged against other zarr (and numcodecs)
releases in throwaway virtual environments: the oldest and newest the store supports. Arrays those
releases wrote (tests/store/data/zarr-*, by make_zarr_fixtures.py there) are read here in any run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec, TransposeCodec, ZstdCodec
from zarr.storage import LocalStore

from actstore.store.format.codecs import ChunkCodec, FixedBlock
from actstore.store.format.zarr_spec import morton_order

ROWS, STATES, WIDTH = 8, 3, 16
# the store's dtypes: bfloat16 is kept as the upper 16 bits of float32, in a uint16 array
DTYPES = ["float16", "uint16", "float32"]


def blosc(itemsize: int) -> list:  # as ZarrArrayStore makes its arrays
    return [BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle", typesize=itemsize), Crc32cCodec()]


CHAINS = {"Blosc + crc32c": blosc, "crc32c only": lambda itemsize: [Crc32cCodec()]}


@pytest.fixture
def root(tmp_path) -> Path:
    return tmp_path


def sharded(root: Path, dtype="float16", rows=3 * ROWS - 5, chain="Blosc + crc32c", name="acts") -> zarr.Array:
    return zarr.create_array(LocalStore(root), name=name, shape=(rows, STATES, WIDTH), chunks=(ROWS, 1, WIDTH),
                             shards=(ROWS, STATES, WIDTH), dtype=dtype,
                             compressors=CHAINS[chain](np.dtype(dtype).itemsize), fill_value=0)


def stored(root: Path, key: str) -> bytes:
    return (root / key).read_bytes()


def put(root: Path, key: str, data) -> None:
    (root / key).parent.mkdir(parents=True, exist_ok=True)
    (root / key).write_bytes(bytes(data))


def values(rows=ROWS, dtype="float16", seed=0) -> np.ndarray:
    numbers = np.random.default_rng(seed).standard_normal((rows, STATES, WIDTH)) * 3
    if dtype == "uint16":  # bfloat16 bits: the upper half of float32's
        return (numbers.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return numbers.astype(dtype)


@pytest.mark.parametrize("chain", list(CHAINS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_shard_is_the_object_zarr_writes(root, dtype, chain):
    array = sharded(root, dtype, chain=chain)
    codec = ChunkCodec(array)
    assert codec.key((1, 0, 0)) == "acts/c/1/0/0" and codec.index_size == 16 * STATES + 4
    shard = values(dtype=dtype)
    array[ROWS:2 * ROWS] = shard
    assert bytes(codec.encode(shard)) == stored(root, "acts/c/1/0/0")
    last = values(ROWS - 5, dtype, seed=1)  # the last shard is partial: padded with the fill value
    array[2 * ROWS:] = last
    assert bytes(codec.encode(last)) == stored(root, "acts/c/2/0/0")


@pytest.mark.parametrize("chain", list(CHAINS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_zarr_reads_what_is_coded_here_and_this_reads_what_zarr_wrote(root, dtype, chain):
    array = sharded(root, dtype, chain=chain)
    codec = ChunkCodec(array)
    shards = [values(dtype=dtype, seed=s) for s in range(2)] + [values(ROWS - 5, dtype, seed=2)]
    for s, shard in enumerate(shards):
        put(root, codec.key((s, 0, 0)), codec.encode(shard))
    np.testing.assert_array_equal(zarr.open_array(LocalStore(root), path="acts", mode="r")[:], np.concatenate(shards))
    other = sharded(root, dtype, chain=chain, name="by_zarr")
    other[:] = np.concatenate(shards)[::-1]
    read = np.concatenate([ChunkCodec(other).decode(stored(root, f"by_zarr/c/{s}/0/0")) for s in range(3)])
    np.testing.assert_array_equal(read[:3 * ROWS - 5], np.concatenate(shards)[::-1])
    assert not read[3 * ROWS - 5:].any()


@pytest.mark.parametrize("grid", [(3, 5), (2, 3, 2), (4, 4)])
def test_inner_chunks_lie_in_zarrs_order_in_any_grid(root, grid):
    inner = (2, 3, 4)[:len(grid)]
    shape = tuple(g * i for g, i in zip(grid, inner))
    array = zarr.create_array(LocalStore(root), name="grid", shape=shape, chunks=inner, shards=shape, dtype="float32",
                              compressors=[Crc32cCodec()], fill_value=0)
    numbers = np.random.default_rng(4).standard_normal(shape).astype(np.float32) + 10  # no chunk of fill values
    array[...] = numbers
    codec = ChunkCodec(array)
    key = "grid/c/" + "/".join("0" * len(grid))
    assert bytes(codec.encode(numbers)) == stored(root, key)
    index = codec.index(stored(root, key)[-codec.index_size:])
    starts = [codec.chunk_range(index, coords)[0] for coords in morton_order(grid)]
    assert starts == sorted(starts)  # the chunks lie in Morton order; the index is in C order
    put(root, key, codec.encode(numbers[::-1].copy()))
    np.testing.assert_array_equal(zarr.open_array(LocalStore(root), path="grid", mode="r")[...], numbers[::-1])


def test_morton_order_interleaves_the_bits_each_dimension_needs():
    assert morton_order((2, 2)) == ((0, 0), (1, 0), (0, 1), (1, 1))
    assert morton_order((1, 3, 1)) == ((0, 0, 0), (0, 1, 0), (0, 2, 0))
    # (3, 2): dimension 0 needs two bits, dimension 1 one; codes 0..7 keep the six inside
    assert morton_order((3, 2)) == ((0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (2, 1))


def test_inner_chunks_read_alone_and_left_out_ones_are_the_fill_value(root):
    array = sharded(root)
    codec = ChunkCodec(array)
    shard = values()
    shard[:, 1] = 0  # zarr leaves an inner chunk of only fill values out of the shard
    array[:ROWS] = shard
    data = stored(root, "acts/c/0/0/0")
    assert len(data) < len(codec.encode(shard))  # ours keeps it (a written shard always exists)
    index = codec.index(data[len(data) - codec.index_size:])
    assert codec.chunk_range(index, (0, 1, 0)) is None
    for layer in range(STATES):
        where = codec.chunk_range(index, (0, layer, 0))
        part = None if where is None else data[where[0]:where[1]]
        np.testing.assert_array_equal(codec.decode_inner(part)[:, 0], shard[:, layer])
    np.testing.assert_array_equal(codec.decode(data), shard)


def test_a_left_out_chunk_reads_as_a_special_fill_value(root):
    array = zarr.create_array(LocalStore(root), name="nan", shape=(ROWS, 2), chunks=(ROWS, 1), shards=(ROWS, 2),
                              dtype="float32", compressors=blosc(4), fill_value=float("nan"))
    array[:, 0] = np.arange(ROWS, dtype=np.float32)
    codec = ChunkCodec(array)
    read = codec.decode(stored(root, "nan/c/0/0"))
    np.testing.assert_array_equal(read[:, 0], np.arange(ROWS))
    assert np.isnan(read[:, 1]).all() and np.isnan(codec.fill_value)


def test_unsharded_chunks_are_zarrs_too(root):
    sums = zarr.create_array(LocalStore(root), name="sums", shape=(3, STATES, WIDTH), chunks=(1, STATES, WIDTH),
                             dtype="float64", compressors=blosc(8), fill_value=0)
    codec = ChunkCodec(sums)
    row = np.random.default_rng(0).standard_normal((STATES, WIDTH))
    sums[2] = row
    assert codec.key((2, 0, 0)) == "sums/c/2/0/0"
    assert bytes(codec.encode(row[None])) == stored(root, "sums/c/2/0/0")
    np.testing.assert_array_equal(codec.decode(stored(root, "sums/c/2/0/0"))[0], row)
    ids = zarr.create_array(LocalStore(root), name="ids", shape=(2 * ROWS - 3,), chunks=(ROWS,), dtype="int64",
                            compressors=blosc(8), fill_value=-1)
    ids[ROWS:] = np.arange(ROWS - 3)
    assert bytes(ChunkCodec(ids).encode(np.arange(ROWS - 3))) == stored(root, "ids/c/1")
    assert ChunkCodec(ids).decode(stored(root, "ids/c/1"))[-1] == -1  # padded with the fill value
    dotted = zarr.create_array(LocalStore(root), name="dotted", shape=(4, 4), chunks=(2, 2), dtype="int32",
                               chunk_key_encoding={"name": "v2", "separator": "."}, fill_value=0)
    dotted[2:, :2] = np.arange(4).reshape(2, 2)
    assert ChunkCodec(dotted).key((1, 0)) == "dotted/1.0"
    assert bytes(ChunkCodec(dotted).encode(np.arange(4).reshape(2, 2))) == stored(root, "dotted/1.0")


def test_a_flipped_byte_fails_the_crc32c_of_its_chunk_or_the_index(root):
    codec = ChunkCodec(sharded(root))
    data = bytearray(codec.encode(values()))
    good = codec.index(bytes(data[-codec.index_size:]))
    start, stop = codec.chunk_range(good, (0, 2, 0))
    data[(start + stop) // 2] ^= 0xFF
    damaged = memoryview(bytes(data))
    with pytest.raises(ValueError, match="checksum"):
        codec.decode_inner(damaged[start:stop])
    with pytest.raises(ValueError, match="checksum"):
        codec.decode(damaged)
    other = codec.chunk_range(good, (0, 1, 0))
    assert codec.decode_inner(damaged[other[0]:other[1]]).shape == (ROWS, 1, WIDTH)  # the others still read
    data[-10] ^= 0xFF
    with pytest.raises(ValueError, match="checksum"):
        codec.index(bytes(data[-codec.index_size:]))
    with pytest.raises(ValueError, match="index of"):
        codec.index(bytes(data[-codec.index_size - 1:]))


def test_zarr_reads_a_shard_with_a_trailer_as_if_it_were_not_there(root):
    array = sharded(root)
    codec = ChunkCodec(array)
    block = FixedBlock.of((STATES, WIDTH), "float64")
    shard = values()
    sums = shard.sum(axis=0, dtype=np.float64)
    data = codec.encode(shard, [block.encode(sums)])
    assert len(data) == len(codec.encode(shard)) + block.nbytes
    put(root, codec.key((0, 0, 0)), data)
    np.testing.assert_array_equal(zarr.open_array(LocalStore(root), path="acts", mode="r")[:ROWS], shard)
    np.testing.assert_array_equal(codec.decode(data), shard)
    tail = data[len(data) - codec.index_size - block.nbytes:]  # what a suffix request of the reader gets
    np.testing.assert_array_equal(block.decode(tail[:block.nbytes]), sums)
    flat = zarr.create_array(LocalStore(root), name="flat", shape=(4,), dtype="int64")
    with pytest.raises(TypeError, match="only a shard"):
        ChunkCodec(flat).encode(np.arange(4), [tail])


def test_a_fixed_block_is_a_checksummed_zarr_chunk_of_fixed_size(root):
    block = FixedBlock.of((STATES, WIDTH), "float64")
    assert FixedBlock.of((STATES, WIDTH), "float64") is block and block.nbytes == 8 * STATES * WIDTH + 4
    plain = zarr.create_array(LocalStore(root), name="plain", shape=(STATES, WIDTH), dtype="float64",
                              compressors=[Crc32cCodec()], fill_value=0)
    sums = np.random.default_rng(3).standard_normal((STATES, WIDTH))
    plain[:] = sums
    assert bytes(block.encode(sums)) == stored(root, "plain/c/0/0")  # what zarr writes for such an array
    described = block.describe()
    assert described["codecs"] == [codec for codec in plain.metadata.to_dict()["codecs"]]
    assert described["data_type"] == "float64" and described["shape"] == [STATES, WIDTH]
    data = bytearray(block.encode(sums))
    data[100] ^= 0x01
    with pytest.raises(ValueError, match="checksum"):
        block.decode(bytes(data))
    with pytest.raises(ValueError, match="not"):
        block.decode(bytes(data[:-8]))


@pytest.mark.parametrize("codecs", [[Crc32cCodec()], [BloscCodec(cname="zstd", clevel=1, shuffle="shuffle")], [],
                                    [GzipCodec(level=3), Crc32cCodec()], [ZstdCodec(level=2, checksum=True)]],
                         ids=["crc32c only", "Blosc without crc32c", "no codecs", "gzip", "zstd"])
def test_other_codec_chains_code_as_zarr_does(root, codecs):
    array = zarr.create_array(LocalStore(root), name="other", shape=(ROWS, STATES, WIDTH), chunks=(ROWS, 1, WIDTH),
                              shards=(ROWS, STATES, WIDTH), dtype="float32", compressors=codecs, fill_value=0)
    codec = ChunkCodec(array)
    shard = values(dtype="float32")
    array[:] = shard
    data = stored(root, "other/c/0/0/0")
    assert bytes(codec.encode(shard)) == data
    index = codec.index(data[len(data) - codec.index_size:])
    for layer in range(STATES):
        start, stop = codec.chunk_range(index, (0, layer, 0))
        np.testing.assert_array_equal(codec.decode_inner(data[start:stop])[:, 0], shard[:, layer])


def test_a_codec_this_does_not_code_is_a_type_error(root):
    array = zarr.create_array(LocalStore(root), name="transposed", shape=(4, 4), chunks=(2, 2), dtype="int32",
                              filters=[TransposeCodec(order=(1, 0))], fill_value=0)
    with pytest.raises(TypeError, match="bytes"):
        ChunkCodec(array)


def test_a_chunk_decodes_in_place_only_into_an_array_of_its_size(root):
    codec = ChunkCodec(sharded(root))
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


# ---- arrays other zarr releases wrote (tests/store/data/make_zarr_fixtures.py) ---------------------
FIXTURES = sorted((Path(__file__).parent / "data").glob("zarr-*"))


@pytest.mark.parametrize("name", ["f16", "bf16"])
@pytest.mark.parametrize("written_by", FIXTURES, ids=[path.name for path in FIXTURES])
def test_what_other_zarr_releases_wrote_reads_here_and_codes_again(written_by, name):
    from tests.store.data.make_zarr_fixtures import fixture_values

    expected = fixture_values(name)
    array = zarr.open_array(LocalStore(written_by, read_only=True), path=name, mode="r")
    np.testing.assert_array_equal(array[:], expected)  # plain zarr here reads that release's objects
    codec = ChunkCodec(array)
    objects = [stored(written_by, codec.key((shard, 0, 0))) for shard in range(3)]
    read = np.concatenate([codec.decode(data) for data in objects])
    np.testing.assert_array_equal(read[:len(expected)], expected)
    assert not read[len(expected):].any()  # the last shard's padding: the fill value
    for shard, data in enumerate(objects):
        ours = codec.encode(expected[shard * ROWS:(shard + 1) * ROWS])
        if name == "bf16":  # uncompressed, so the bytes do not depend on the Blosc build: the same bytes
            assert bytes(ours) == data
        else:  # Blosc frames may differ between Blosc builds; what they code may not
            np.testing.assert_array_equal(codec.decode(ours), codec.decode(data))
    index = codec.index(objects[0][-codec.index_size:])
    assert (codec.chunk_range(index, (0, 1, 0)) is None) == (name == "f16")  # f16's chunk of zeros: left out
