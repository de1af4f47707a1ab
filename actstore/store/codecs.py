"""One chunk or shard object of a zarr array, encoded and decoded in the calling thread through
the array's own zarr codec objects.

Zarr's array calls (``array[a:b] = values``, ``array[a:b]``) run every request through its
sync-to-async bridge, its batched codec pipeline (a thread hop per Blosc chunk) and its indexing
machinery: on an object store that cost 4-5 ms of client CPU per shard read and 9-11 ms per shard
write, three to eight times a plain GET or PUT of the same bytes. A shard writer always writes a
whole shard and a reader knows which shard and layer it wants, so ``ZarrArrayStore`` moves the
bytes itself (one PUT or GET per object, through the zarr store interface) and codes them here:

  * the array's codecs (bytes, Blosc, crc32c) are zarr's own objects, called through their
    synchronous methods (zarr's ``SupportsSyncCodec``), so a failed crc32c is zarr's ValueError;
  * a shard is laid out as zarr's ``ShardingCodec`` lays it out (inner chunks in Morton order,
    then the index through the index codecs, with zarr's ``_ShardIndex``); zarr reads what is
    written here and this reads what zarr wrote (tests/store/test_codecs.py checks both, byte for
    byte), including inner chunks zarr left out because they held only the fill value.

A shard may also carry a ``trailer``: bytes between its inner chunks and its index, which no
index entry points at, so zarr reads the shard as if they were not there (the sharding spec lets
a shard hold unreferenced bytes: its append-only writers leave them). ``FixedBlock`` codes such
bytes: a block of values of a fixed shape, as an uncompressed zarr chunk with a crc32c, so it is
always as long and lies at a known distance from the object's end.

Two steps skip a copy that zarr's codec objects make, with the same bytes (the tests compare):
a shard's inner chunks take their crc32c apart (zarr's codec appends it to a copy of the chunk)
and are laid end to end once, into the shard; and a Blosc inner chunk decodes straight into the
caller's array (numcodecs' Blosc: a Blosc frame carries its own settings; zarr's codec returns a
new array). On a loaded 2-core machine the copies were a quarter of a shard's coding CPU.

The shard layout comes from zarr's private sharding helpers (``_ShardIndex``, the codec's
``_get_chunk_spec`` and the like, as of zarr 3.1): a zarr release that changes them fails those
tests, not silently.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from functools import lru_cache

import crc32c
import numpy as np
import zarr
from numcodecs import blosc
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec
from zarr.codecs.sharding import ShardingCodec, ShardingCodecIndexLocation, _ShardIndex
from zarr.core.array_spec import ArrayConfig, ArraySpec
from zarr.core.buffer import Buffer, default_buffer_prototype
from zarr.core.buffer.cpu import NDBuffer
from zarr.core.dtype import parse_data_type
from zarr.core.indexing import morton_order_iter


class _Pipeline:
    """A codec chain (array -> bytes -> bytes), with the spec each codec sees resolved once."""

    def __init__(self, codecs: Sequence, spec: ArraySpec) -> None:
        self.codecs = tuple(codecs)
        # zarr's `SupportsSyncCodec` protocol (zarr.abc.codec), asked by its two methods so that
        # nothing here depends on the protocol's name being exported
        unsupported = [type(c).__name__ for c in self.codecs
                       if not (hasattr(c, "_encode_sync") and hasattr(c, "_decode_sync"))]
        if unsupported:
            raise TypeError(f"codecs without a synchronous path: {unsupported}")
        self.specs = []
        for codec in self.codecs:
            self.specs.append(spec)
            spec = codec.resolve_metadata(spec)
        self._checksum_last = isinstance(self.codecs[-1], Crc32cCodec)
        # bytes in this machine's byte order, then Blosc: Blosc's output is the values as they lie
        # in memory, so a frame decompresses into an array of the chunk's dtype
        self._blosc_second = (len(self.codecs) >= 2 and isinstance(self.codecs[0], BytesCodec)
                              and isinstance(self.codecs[1], BloscCodec)
                              and getattr(self.codecs[0].endian, "value", None) in (None, sys.byteorder))

    def encode(self, values: np.ndarray) -> Buffer:
        data = NDBuffer.from_numpy_array(values)
        for codec, spec in zip(self.codecs, self.specs):
            data = codec._encode_sync(data, spec)
        return data

    def encode_parts(self, values: np.ndarray) -> list[np.ndarray]:
        """The bytes ``encode`` makes, as parts to lay end to end: a last crc32c apart from the
        bytes it covers (little-endian uint32, as zarr's codec writes it)."""
        if not self._checksum_last:
            return [self.encode(values).as_numpy_array()]
        data = NDBuffer.from_numpy_array(values)
        for codec, spec in zip(self.codecs[:-1], self.specs[:-1]):
            data = codec._encode_sync(data, spec)
        covered = data.as_numpy_array()
        return [covered, np.array([crc32c.crc32c(covered)], dtype="<u4").view(np.uint8)]

    def decode(self, data: Buffer) -> np.ndarray:
        for codec, spec in zip(reversed(self.codecs), reversed(self.specs)):
            if isinstance(codec, Crc32cCodec):
                data = spec.prototype.buffer.from_array_like(_checked(data.as_numpy_array()))
            else:
                data = codec._decode_sync(data, spec)
        return data.as_numpy_array()

    def decode_into(self, data: Buffer, out: np.ndarray) -> None:
        """``decode`` into ``out`` (C-contiguous, the chunk's dtype and size): straight from Blosc
        where the chain allows, after the checks of the codecs after it (crc32c: no copy)."""
        if not self._blosc_second:
            out[...] = self.decode(data).reshape(out.shape)
            return
        frame = data.as_numpy_array()
        for codec, spec in zip(reversed(self.codecs[2:]), reversed(self.specs[2:])):
            if isinstance(codec, Crc32cCodec):
                frame = _checked(frame)
            else:
                frame = codec._decode_sync(spec.prototype.buffer.from_array_like(frame), spec).as_numpy_array()
        size = int.from_bytes(frame[4:8].tobytes(), "little")  # the Blosc header's uncompressed size
        if size != out.nbytes:  # Blosc fills a larger destination only in part
            raise ValueError(f"a Blosc frame of {size} bytes for a chunk of {out.nbytes}")
        blosc.decompress(frame, out)


def _checked(data: np.ndarray) -> np.ndarray:
    """The bytes (uint8) a last crc32c covers, after checking it: zarr's ``Crc32cCodec`` check
    (its ValueError, its message; the sum is little-endian uint32, as zarr writes it), through
    the ``crc32c`` library, which zarr's own ``google_crc32c`` call is 2.5x slower than here
    (123 vs 48 us for a 1.4 MB shard) and which, unlike that one, lets the process's other
    threads run while it sums."""
    stored, computed = int.from_bytes(data[-4:].tobytes(), "little"), crc32c.crc32c(data[:-4])
    if computed != stored:
        raise ValueError(f"Stored and computed checksum do not match. Stored: {stored:#010x}. "
                         f"Computed: {computed:#010x}.")
    return data[:-4]


class FixedBlock:
    """Values of one shape and dtype coded as a chunk of an uncompressed zarr array with a crc32c
    (codecs ``bytes``, little-endian, then ``crc32c``): always ``nbytes`` long."""

    def __init__(self, shape: tuple[int, ...], dtype: str) -> None:
        self.shape, self.dtype = shape, np.dtype(dtype)
        self.codecs = (BytesCodec(endian="little"), Crc32cCodec())
        spec = ArraySpec(shape=shape, dtype=parse_data_type(dtype, zarr_format=3), fill_value=0,
                         config=ArrayConfig.from_dict({}), prototype=default_buffer_prototype())
        self._pipeline = _Pipeline(self.codecs, spec)
        self.nbytes = int(np.prod(shape)) * self.dtype.itemsize + 4  # the values, then their crc32c

    @classmethod
    @lru_cache(maxsize=64)
    def of(cls, shape: tuple[int, ...], dtype: str) -> FixedBlock:
        """The block of ``shape`` and ``dtype``, made once (resolving the codecs' specs is not free)."""
        return cls(shape, dtype)

    def describe(self) -> dict:
        """The block in zarr's own terms (what an array's metadata says of its chunks)."""
        return {"shape": list(self.shape), "data_type": self.dtype.name,
                "codecs": [codec.to_dict() for codec in self.codecs]}

    def encode(self, values: np.ndarray) -> Buffer:
        return self._pipeline.encode(np.ascontiguousarray(values, dtype=self.dtype).reshape(self.shape))

    def decode(self, data: Buffer) -> np.ndarray:
        """The values (zarr's ValueError for a failed crc32c; a ValueError too for a block of the
        wrong length)."""
        if len(data) != self.nbytes:
            raise ValueError(f"a block of {len(data)} bytes, not {self.nbytes}")
        return self._pipeline.decode(data).view(self.dtype).reshape(self.shape)


class ChunkCodec:
    """The objects of one zarr array: ``key(coords)`` names one, ``encode`` makes its bytes from
    its values, ``decode`` turns them back. A sharded array's shard also reads in parts: its
    ``index`` (the last ``index_size`` bytes), then single inner chunks (``decode_inner``).
    ``attributes`` are the array's user attributes, as its metadata holds them."""

    def __init__(self, array: zarr.Array) -> None:
        metadata = array.metadata
        self.path = array.path
        self.attributes = dict(metadata.attributes)
        self.shape = tuple(metadata.chunk_grid.chunk_shape)  # of one object: the shard where sharded
        self.fill_value = metadata.fill_value
        self.dtype = metadata.dtype.to_native_dtype()
        spec = ArraySpec(shape=self.shape, dtype=metadata.dtype, fill_value=metadata.fill_value,
                         config=array.config, prototype=default_buffer_prototype())
        self._encode_key = metadata.encode_chunk_key
        codecs = metadata.codecs
        self.sharding = codecs[0] if len(codecs) == 1 and isinstance(codecs[0], ShardingCodec) else None
        if self.sharding is None:
            self._chunk = _Pipeline(codecs, spec)
            return
        if self.sharding.index_location != ShardingCodecIndexLocation.end:
            raise TypeError("only shards with their index at the end are coded here")
        self.per_shard = self.sharding._get_chunks_per_shard(spec)
        self.inner_shape = tuple(self.sharding.chunk_shape)
        self._chunk = _Pipeline(self.sharding.codecs, self.sharding._get_chunk_spec(spec))
        self._index = _Pipeline(self.sharding.index_codecs, self.sharding._get_index_chunk_spec(self.per_shard))
        self.index_size = self.sharding._shard_index_size(self.per_shard)

    def key(self, coords: tuple[int, ...]) -> str:
        """The store key of the object at chunk (or shard) grid coordinates ``coords``."""
        return f"{self.path}/{self._encode_key(coords)}"

    def padded(self, values: np.ndarray) -> np.ndarray:
        """``values`` (the leading part of one object, as the last one along an edge is) padded
        with the fill value to the object's full shape, in the stored dtype, as zarr stores it."""
        values = np.asarray(values, dtype=self.dtype)
        if values.shape == self.shape:
            return values
        full = np.full(self.shape, self.fill_value, dtype=self.dtype)
        full[tuple(slice(0, s) for s in values.shape)] = values
        return full

    def encode(self, values: np.ndarray, trailer: Sequence[Buffer] = ()) -> Buffer:
        """The bytes of one object holding ``values`` (every inner chunk of a shard is written,
        also one of only fill values: a written shard always exists as an object), and a shard's
        ``trailer`` blocks, in order, after its inner chunks, before its index (see the module's
        docstring)."""
        values = self.padded(values)
        if self.sharding is None:
            if trailer:
                raise TypeError("only a shard carries a trailer")
            return self._chunk.encode(values)
        index = _ShardIndex.create_empty(self.per_shard)
        parts, offset = [], 0
        for coords in morton_order_iter(self.per_shard):
            encoded = self._chunk.encode_parts(values[self._inner(coords)])
            size = sum(len(part) for part in encoded)
            parts += encoded
            index.set_chunk_slice(coords, slice(offset, offset + size))
            offset += size
        parts += [block.as_numpy_array() for block in trailer]
        parts.append(self._index.encode(index.offsets_and_lengths).as_numpy_array())
        return default_buffer_prototype().buffer.from_array_like(np.concatenate(parts))  # the one copy

    def decode(self, data: Buffer) -> np.ndarray:
        """The whole object's values (zarr's ValueError for a failed crc32c, as for any part)."""
        if self.sharding is None:
            return self._chunk.decode(data).reshape(self.shape)
        index = self.index(data[len(data) - self.index_size:])
        out = np.empty(self.shape, dtype=self.dtype)
        for coords in morton_order_iter(self.per_shard):
            where = index.get_chunk_slice(coords)
            out[self._inner(coords)] = self.decode_inner(None if where is None else data[where[0]:where[1]])
        return out

    def index(self, data: Buffer) -> _ShardIndex:
        """A shard's index from its last ``index_size`` bytes (checksummed like the chunks)."""
        return _ShardIndex(self._index.decode(data).reshape(*self.per_shard, 2))

    @staticmethod
    def chunk_range(index: _ShardIndex, coords: tuple[int, ...]) -> tuple[int, int] | None:
        """The byte range [start, stop) of one inner chunk in its shard (None: zarr left it out,
        it held only the fill value)."""
        return index.get_chunk_slice(coords)

    def decode_inner(self, data: Buffer | None) -> np.ndarray:
        """One inner chunk of a shard from its bytes (None: the fill value)."""
        out = np.empty(self.inner_shape, dtype=self.dtype)
        self.decode_inner_into(data, out)
        return out

    def decode_inner_into(self, data: Buffer | None, out: np.ndarray) -> None:
        """``decode_inner`` into ``out``, of the chunk's shape and dtype and C-contiguous (Blosc
        refuses, with a ValueError, to decode into anything else)."""
        if data is None:
            out[...] = self.fill_value
        else:
            self._chunk.decode_into(data, out)

    def _inner(self, coords: tuple[int, ...]) -> tuple[slice, ...]:
        return tuple(slice(c * s, (c + 1) * s) for c, s in zip(coords, self.inner_shape))
