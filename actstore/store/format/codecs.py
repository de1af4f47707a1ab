"""One chunk or shard object of a zarr array, encoded and decoded in the calling thread, from the
array's metadata document by the Zarr v3 specification (`store.format.zarr_spec`), not zarr-python's
internals.

Zarr's array calls (``array[a:b] = values``, ``array[a:b]``) run every request through its
sync-to-async bridge, its batched codec pipeline (a thread hop per Blosc chunk) and its indexing
machinery: on an object store that cost 4-5 ms of client CPU per shard read and 9-11 ms per shard
write, three to eight times a plain GET or PUT of the same bytes. A shard writer always writes a
whole shard and a reader knows which shard and layer it wants, so ``ZarrArrayStore`` moves the
bytes itself (one PUT or GET per object, through the zarr store interface) and codes them here:

  * the array's codecs (bytes, Blosc, crc32c) are coded as the specification defines them, Blosc
    through numcodecs' own codec object (the one zarr-python calls), so a Blosc frame is zarr's;
    a failed crc32c is the ValueError zarr's codec raises;
  * a shard is laid out as zarr-python's sharding codec lays it out (inner chunks in Morton
    order, then the index through the index codecs); zarr reads what is written here and this
    reads what zarr wrote (tests/store/test_codecs.py checks both, byte for byte;
    scripts/zarr_versions.sh runs it against other zarr releases), including inner chunks zarr
    left out because they held only the fill value.

A shard may also carry a ``trailer``: bytes between its inner chunks and its index, which no
index entry points at, so zarr reads the shard as if they were not there (the sharding spec lets
a shard hold unreferenced bytes: its append-only writers leave them). ``FixedBlock`` codes such
bytes: a block of values of a fixed shape, as an uncompressed zarr chunk with a crc32c, so it is
always as long and lies at a known distance from the object's end.

A shard's inner chunks keep their crc32c apart until they are laid end to end, once, into the
shard, and a Blosc inner chunk decodes straight into the caller's array: on a loaded 2-core
machine the copies zarr's codec objects make were a quarter of a shard's coding CPU.

Encoded objects are flat uint8 numpy arrays; decoding takes any bytes-like object (bytes, a
memoryview, a uint8 array) and slices of one, uncopied.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from actstore.store.format import zarr_spec as spec

if TYPE_CHECKING:
    import zarr

# the codecs of a FixedBlock, in the terms of a metadata document
_BLOCK_CODECS = ({"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"})


class FixedBlock:
    """Values of one shape and dtype coded as a chunk of an uncompressed zarr array with a crc32c
    (codecs ``bytes``, little-endian, then ``crc32c``): always ``nbytes`` long."""

    def __init__(self, shape: tuple[int, ...], dtype: str) -> None:
        self.shape, self.dtype = shape, np.dtype(dtype)
        self._chain = spec.CodecChain(_BLOCK_CODECS, shape, self.dtype)
        self.nbytes = self._chain.fixed_size()  # the values, then their crc32c

    @classmethod
    @lru_cache(maxsize=64)
    def of(cls, shape: tuple[int, ...], dtype: str) -> FixedBlock:
        """The block of ``shape`` and ``dtype``, made once."""
        return cls(shape, dtype)

    def describe(self) -> dict:
        """The block in zarr's own terms (what an array's metadata says of its chunks)."""
        return {"shape": list(self.shape), "data_type": self.dtype.name,
                "codecs": [dict(codec) for codec in _BLOCK_CODECS]}

    def encode(self, values: np.ndarray) -> np.ndarray:
        return self._chain.encode(np.asarray(values, dtype=self.dtype).reshape(self.shape))

    def decode(self, data) -> np.ndarray:
        """The values (the crc32c's ValueError; a ValueError too for a block of the wrong length)."""
        if len(data) != self.nbytes:
            raise ValueError(f"a block of {len(data)} bytes, not {self.nbytes}")
        return self._chain.decode(data)


class ChunkCodec:
    """The objects of one zarr array: ``key(coords)`` names one, ``encode`` makes its bytes from
    its values, ``decode`` turns them back. A sharded array's shard also reads in parts: its
    ``index`` (the last ``index_size`` bytes), then single inner chunks (``decode_inner``).
    ``attributes`` are the array's user attributes, as its metadata holds them."""

    def __init__(self, array: zarr.Array) -> None:
        self._read(array.path, array.metadata.to_dict())  # the array's metadata document (zarr.json)

    def _read(self, path: str, metadata: dict) -> None:
        if metadata.get("zarr_format") != 3 or metadata.get("storage_transformers"):
            raise TypeError("only Zarr v3 arrays without storage transformers are coded here")
        grid = metadata["chunk_grid"]
        if grid["name"] != "regular":
            raise TypeError(f"chunk grid {grid['name']!r} is not coded here")
        self.path = path
        self.attributes = dict(metadata.get("attributes") or {})
        self.shape = tuple(grid["configuration"]["chunk_shape"])  # of one object: the shard where sharded
        self.dtype = spec.data_type(metadata["data_type"])
        self.fill_value = spec.fill_value(metadata["fill_value"], self.dtype)
        self._key_encoding = metadata["chunk_key_encoding"]
        codecs = metadata["codecs"]
        self.sharded = len(codecs) == 1 and codecs[0]["name"] == "sharding_indexed"
        if not self.sharded:
            self._chunk = spec.CodecChain(codecs, self.shape, self.dtype)
            return
        config = codecs[0]["configuration"]
        if config.get("index_location", "end") != "end":
            raise TypeError("only shards with their index at the end are coded here")
        self.inner_shape = tuple(config["chunk_shape"])
        if any(s % i for s, i in zip(self.shape, self.inner_shape)) or len(self.shape) != len(self.inner_shape):
            raise TypeError(f"inner chunks {self.inner_shape} do not tile shards {self.shape}")
        self.per_shard = tuple(s // i for s, i in zip(self.shape, self.inner_shape))
        self._chunk = spec.CodecChain(config["codecs"], self.inner_shape, self.dtype)
        self._index = spec.index_chain(config["index_codecs"], self.per_shard)
        self.index_size = self._index.fixed_size()  # 16 bytes an inner chunk, + 4 for a crc32c

    def key(self, coords: tuple[int, ...]) -> str:
        """The store key of the object at chunk (or shard) grid coordinates ``coords``."""
        return f"{self.path}/{spec.chunk_key(self._key_encoding, coords)}"

    def padded(self, values: np.ndarray) -> np.ndarray:
        """``values`` (the leading part of one object, as the last one along an edge is) padded
        with the fill value to the object's full shape, in the stored dtype, as zarr stores it."""
        values = np.asarray(values, dtype=self.dtype)
        if values.shape == self.shape:
            return values
        full = np.full(self.shape, self.fill_value, dtype=self.dtype)
        full[tuple(slice(0, s) for s in values.shape)] = values
        return full

    def encode(self, values: np.ndarray, trailer: Sequence = (), checksums: dict | None = None) -> np.ndarray:
        """The bytes of one object holding ``values`` (every inner chunk of a shard is written,
        also one of only fill values: a written shard always exists as an object), and a shard's
        ``trailer`` blocks (bytes-like), in order, after its inner chunks, before its index (see
        the module's docstring). ``checksums``: the crc32c of inner chunks' values, by their grid
        coordinates in the shard, where the caller summed them already (a chain of the values'
        bytes and a crc32c then takes them, uncomputed; a padded shard's chunks are summed here)."""
        parts = self.encode_parts(values, trailer, checksums)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)  # the one copy

    def encode_parts(self, values: np.ndarray, trailer: Sequence = (), checksums: dict | None = None
                     ) -> list[np.ndarray]:
        """`encode`'s bytes as parts to lay end to end, uncopied: an uncompressed inner chunk is a
        view of ``values`` (a local file takes them one after another, with no copy of the shard)."""
        if values.shape != self.shape:
            checksums = None
        values = self.padded(values)
        if not self.sharded:
            if trailer:
                raise TypeError("only a shard carries a trailer")
            return self._chunk.encode_parts(values)
        index = spec.empty_index(self.per_shard)
        parts, offset = [], 0
        for coords in spec.morton_order(self.per_shard):
            encoded = self._chunk.encode_parts(values[self._inner(coords)], (checksums or {}).get(coords))
            size = sum(len(part) for part in encoded)
            parts += encoded
            index[coords] = (offset, size)
            offset += size
        parts += [np.frombuffer(block, dtype=np.uint8) for block in trailer]
        return parts + self._index.encode_parts(index)

    def decode(self, data) -> np.ndarray:
        """The whole object's values (the crc32c's ValueError, as for any part)."""
        if not self.sharded:
            return self._chunk.decode(data)
        index = self.index(data[len(data) - self.index_size:])
        out = np.empty(self.shape, dtype=self.dtype)
        for coords in spec.morton_order(self.per_shard):
            where = spec.chunk_range(index, coords)
            out[self._inner(coords)] = self.decode_inner(None if where is None else data[where[0]:where[1]])
        return out

    def index(self, data) -> np.ndarray:
        """A shard's index from its last ``index_size`` bytes (checksummed like the chunks): its
        (offset, nbytes) pairs, uint64, of shape (*per_shard, 2)."""
        if len(data) != self.index_size:
            raise ValueError(f"a shard index of {len(data)} bytes, not {self.index_size}")
        return self._index.decode(data)

    @staticmethod
    def chunk_range(index: np.ndarray, coords: tuple[int, ...]) -> tuple[int, int] | None:
        """The byte range [start, stop) of one inner chunk in its shard (None: zarr left it out,
        it held only the fill value)."""
        return spec.chunk_range(index, coords)

    def decode_inner(self, data) -> np.ndarray:
        """One inner chunk of a shard from its bytes (None: the fill value)."""
        out = np.empty(self.inner_shape, dtype=self.dtype)
        self.decode_inner_into(data, out)
        return out

    def decode_inner_into(self, data, out: np.ndarray) -> None:
        """``decode_inner`` into ``out``, of the chunk's shape and dtype and C-contiguous (Blosc
        refuses, with a ValueError, to decode into anything else)."""
        if data is None:
            out[...] = self.fill_value
        else:
            self._chunk.decode_into(data, out)

    def _inner(self, coords: tuple[int, ...]) -> tuple[slice, ...]:
        return tuple(slice(c * s, (c + 1) * s) for c, s in zip(coords, self.inner_shape))
