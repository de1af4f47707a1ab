"""Whole chunks and whole shards encoded with an array's own codecs, outside zarr's async write path.

A capture writes every shard whole, so it needs none of zarr's read-modify-write machinery, and
zarr's pipeline (an event-loop round trip, a worker thread per codec call, per-chunk bookkeeping)
cost ~5 of the ~7 ms CPU of a 256 x 7 x 384 float16 shard; the codecs themselves cost ~0.6 ms.
`encode_chunk` and `encode_shard` apply the codecs recorded in the array's metadata (bytes,
Blosc through numcodecs, crc32c (the same CRC-32C zarr computes with google-crc32c)) and lay a shard
out as the sharding codec does (inner chunks in its order, then the index of (offset, length)
pairs with its own codecs). The bytes are zarr's own (tests/store/test_shard_codec.py compares
them for every dtype and compressor); what this module does not reproduce, it declines (None),
and the caller writes through zarr: another codec, big-endian data, values that need a cast, and
any chunk equal to the fill value (zarr leaves such chunks out, or the whole object).
"""

from __future__ import annotations

import itertools

import crc32c
import numpy as np
from numcodecs import Blosc
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, ShardingCodec
from zarr.codecs.sharding import ShardingCodecIndexLocation
from zarr.core.indexing import morton_order_iter

__all__ = ["encode_chunk", "encode_shard", "whole_chunk"]

_SHUFFLE = {"noshuffle": Blosc.NOSHUFFLE, "shuffle": Blosc.SHUFFLE, "bitshuffle": Blosc.BITSHUFFLE}
_BLOSC: dict[tuple, Blosc] = {}  # codec settings -> the numcodecs compressor (made once)


def _blosc(codec: BloscCodec) -> Blosc:
    settings = (codec.cname.value, codec.clevel, _SHUFFLE[codec.shuffle.value], codec.blocksize, codec.typesize)
    found = _BLOSC.get(settings)
    if found is None:
        found = _BLOSC[settings] = Blosc(*settings)
    return found


def _supported(codecs) -> bool:
    """An array -> bytes codec that is little-endian bytes, then only Blosc and crc32c."""
    return (len(codecs) >= 1 and isinstance(codecs[0], BytesCodec)
            and (codecs[0].endian is None or codecs[0].endian.value == "little")
            and all(isinstance(c, (BloscCodec, Crc32cCodec)) for c in codecs[1:])
            and all(c.typesize is not None and c.shuffle is not None
                    for c in codecs[1:] if isinstance(c, BloscCodec)))


def _encoded(codecs, chunk: np.ndarray) -> bytes:
    data = np.ascontiguousarray(chunk).view(np.uint8).ravel()
    for codec in codecs[1:]:
        if isinstance(codec, BloscCodec):
            data = np.frombuffer(_blosc(codec).encode(data), np.uint8)
        else:
            data = np.append(data, np.array([crc32c.crc32c(data)], "<u4").view(np.uint8))
    return data.tobytes()


def _empty(chunk: np.ndarray, fill) -> bool:
    """Whether zarr would leave the chunk out (every value equal to the fill value; a float fill of
    zero compares bit patterns, so -0.0 is not empty)."""
    if fill == 0:
        return not chunk.view(np.uint8).any()
    return bool(np.array_equal(chunk, np.full_like(chunk, fill), equal_nan=chunk.dtype.kind == "f"))


def _usable(values: np.ndarray, dtype: np.dtype, shape: tuple[int, ...]) -> bool:
    return values.dtype == dtype and values.dtype.byteorder in "=|<" and tuple(values.shape) == tuple(shape)


def encode_chunk(metadata, values: np.ndarray) -> bytes | None:
    """The stored bytes of one whole chunk of an unsharded array (``array.metadata``), or None."""
    codecs = metadata.codecs
    if (not _supported(codecs) or not _usable(values, metadata.dtype.to_native_dtype(),
                                          metadata.chunk_grid.chunk_shape)
            or _empty(values, metadata.fill_value)):
        return None
    return _encoded(codecs, values)


def encode_shard(metadata, values: np.ndarray) -> bytes | None:
    """The stored bytes of one whole shard of a sharded array (``array.metadata``; ``values`` the
    shard's full shape, not an edge shard cut short by the array's end), or None."""
    sharding = metadata.codecs[0] if len(metadata.codecs) == 1 else None
    if (not isinstance(sharding, ShardingCodec) or sharding.index_location != ShardingCodecIndexLocation.end
            or not _supported(sharding.codecs) or not _supported(sharding.index_codecs)
            or not _usable(values, metadata.dtype.to_native_dtype(),
                                          metadata.chunk_grid.chunk_shape)):
        return None
    inner = sharding.chunk_shape
    per_shard = tuple(s // c for s, c in zip(values.shape, inner))
    parts = []
    for coords in morton_order_iter(per_shard):
        chunk = values[tuple(slice(i * c, (i + 1) * c) for i, c in zip(coords, inner))]
        if _empty(chunk, metadata.fill_value):
            return None
        parts.append(_encoded(sharding.codecs, chunk))
    index = np.empty(per_shard + (2,), "<u8")
    offset = 0
    for coords, part in zip(morton_order_iter(per_shard), parts):
        index[coords] = (offset, len(part))
        offset += len(part)
    return b"".join(itertools.chain(parts, [_encoded(sharding.index_codecs, index)]))


def whole_chunk(array, index: int, values: np.ndarray) -> tuple[str, bytes] | None:
    """(store key, stored bytes) of chunk ``index`` along the first axis of ``array`` (a zarr
    array whose chunks, or shards, span every other axis), holding ``values`` (the chunk without
    its first axis when that is 1, as a layer-sums row), or None where zarr must write it."""
    metadata = array.metadata
    shape = metadata.chunk_grid.chunk_shape
    values = np.asarray(values)
    if values.ndim == len(shape) - 1 and shape[0] == 1:
        values = values[None]
    sharded = isinstance(metadata.codecs[0], ShardingCodec) if metadata.codecs else False
    blob = (encode_shard if sharded else encode_chunk)(metadata, values)
    coords = (index,) + (0,) * (len(shape) - 1)
    return None if blob is None else (f"{array.path}/{metadata.encode_chunk_key(coords)}", blob)
