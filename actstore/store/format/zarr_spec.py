"""The parts of the Zarr v3 specification the store codes itself, from an array's metadata
document (its ``zarr.json``, as the specification defines it) and public libraries only: data
types and fill values, chunk keys, codec chains and the sharding codec's binary shard format.

Codecs (https://zarr-specs.readthedocs.io/en/latest/v3/codecs/): ``bytes`` (the values in C order,
in the endianness it names), then any of ``blosc``, ``gzip``, ``zstd`` (numcodecs' own codec
objects, the ones zarr-python calls) and ``crc32c`` (the sum of the bytes before it, appended as a
little-endian uint32). Anything else (``transpose``, a nested ``sharding_indexed``, a codec a
plugin registers) raises TypeError naming it: this store never writes one.

A shard (``sharding_indexed``, https://zarr-specs.readthedocs.io/en/latest/v3/codecs/sharding-indexed/):
its inner chunks, each coded by the inner codecs, laid end to end, then its index: a uint64 array
of shape (*chunks per shard, 2) in C order of the inner chunks' grid coordinates, holding each
inner chunk's (offset, nbytes) in the shard, both 2^64 - 1 for an inner chunk not stored (read as
the fill value), coded by the index codecs. The specification leaves the chunks' order to the
writer; zarr-python writes them in Morton order (``morton_order``), and so do we, so a shard coded
here is byte for byte the shard zarr-python writes for the same values.
"""

from __future__ import annotations

import inspect
import itertools
import math
from collections.abc import Sequence
from functools import lru_cache

import crc32c
import numpy as np
from numcodecs import Blosc, GZip, Zstd, blosc

# an index entry (offset and nbytes alike) of an inner chunk the shard does not hold
EMPTY = 2**64 - 1
# numcodecs 0.16 takes Blosc's typesize from the codec's settings; before, from the buffer's item
# size, which is 1 for the bytes a ``bytes`` codec makes. zarr-python passes it where numcodecs
# takes it (zarr.codecs.blosc, 3.1-3.4), so a Blosc frame coded here is the frame zarr codes.
_BLOSC_TYPESIZE = "typesize" in inspect.signature(Blosc.__init__).parameters
_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}
_DATA_TYPES = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
               "float16", "float32", "float64", "complex64", "complex128"}


def data_type(name: object) -> np.dtype:
    """The numpy dtype of a ``data_type`` of the specification's core set."""
    if not isinstance(name, str) or name not in _DATA_TYPES:
        raise TypeError(f"data type {name!r} is not coded here (only {sorted(_DATA_TYPES)})")
    return np.dtype(name)


def fill_value(value: object, dtype: np.dtype) -> np.generic:
    """A ``fill_value`` as the specification writes it in JSON: a number (a bool), or for floats
    "NaN", "Infinity", "-Infinity" or "0x..." (the value's bits as an unsigned integer)."""
    if dtype.kind in "fc" and isinstance(value, str):
        special = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
        if value in special:
            return dtype.type(special[value])
        if value.startswith("0x"):
            bits = np.array(int(value, 16), dtype=f"<u{dtype.itemsize}")
            return bits.view(f"<{dtype.kind}{dtype.itemsize}").astype(dtype)[()]
    if dtype.kind == "c" and isinstance(value, list):
        return dtype.type(complex(*(fill_value(part, np.dtype(f"f{dtype.itemsize // 2}")) for part in value)))
    return np.array(value, dtype=dtype)[()]


def chunk_key(encoding: dict, coords: Sequence[int]) -> str:
    """The key of a chunk (a shard where sharded) below its array, by ``chunk_key_encoding``."""
    name, config = encoding["name"], encoding.get("configuration") or {}
    if name == "default":
        return config.get("separator", "/").join(["c", *map(str, coords)])
    if name == "v2":
        return config.get("separator", ".").join(map(str, coords)) if len(coords) else "0"
    raise TypeError(f"chunk key encoding {name!r} is not coded here")


@lru_cache(maxsize=64)
def morton_order(grid: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """The coordinates of a grid of ``grid`` inner chunks in zarr-python's write order: Morton
    (Z) order, by a code that interleaves the coordinates' bits, lowest first, dimension after
    dimension, each dimension giving only the (n - 1).bit_length() bits its extent needs (so a
    dimension of one chunk takes none and a short one drops out of the higher bits). Zarr visits
    codes 0, 1, 2, ... and keeps those inside the grid; sorting the grid by the code is the same."""
    bits = [(n - 1).bit_length() for n in grid]

    def code(coords: tuple[int, ...]) -> int:
        z = position = 0
        for bit in range(max(bits, default=0)):
            for dim, width in enumerate(bits):
                if bit < width:
                    z |= ((coords[dim] >> bit) & 1) << position
                    position += 1
        return z

    return tuple(sorted(itertools.product(*(range(n) for n in grid)), key=code))


def _uint8(data) -> np.ndarray:
    """Any bytes-like object (bytes, a memoryview, a numpy array) as a flat uint8 array, uncopied."""
    if isinstance(data, np.ndarray):
        return data.reshape(-1).view(np.uint8)
    return np.frombuffer(data, dtype=np.uint8)


def checked(data: np.ndarray) -> np.ndarray:
    """The bytes a last crc32c covers, after checking it (the ValueError and message zarr-python's
    codec raises); the ``crc32c`` library sums 2.5x faster than zarr's google_crc32c call here
    (48 vs 123 us for a 1.4 MB shard) and lets the process's other threads run meanwhile."""
    if len(data) < 4:
        raise ValueError(f"a chunk of {len(data)} bytes has no room for its crc32c")
    stored, computed = int.from_bytes(data[-4:].tobytes(), "little"), crc32c.crc32c(data[:-4])
    if computed != stored:
        raise ValueError(f"Stored and computed checksum do not match. Stored: {stored:#010x}. "
                         f"Computed: {computed:#010x}.")
    return data[:-4]


def _crc32c_of(data: np.ndarray) -> np.ndarray:
    return np.array([crc32c.crc32c(data)], dtype="<u4").view(np.uint8)


class _Compressor:
    """A bytes -> bytes codec through a numcodecs codec object."""

    def __init__(self, codec) -> None:
        self.codec = codec

    def encode(self, data: np.ndarray) -> np.ndarray:
        return _uint8(self.codec.encode(data))

    def decode(self, data: np.ndarray) -> np.ndarray:
        return _uint8(self.codec.decode(data))


class _Crc32c:
    def encode(self, data: np.ndarray) -> np.ndarray:
        return np.concatenate([data, _crc32c_of(data)])

    def decode(self, data: np.ndarray) -> np.ndarray:
        return checked(data)


def _bytes_codec(spec: dict, itemsize: int):
    name, config = spec["name"], spec.get("configuration") or {}
    if name == "crc32c":
        return _Crc32c()
    if name == "blosc":
        settings = {"cname": config["cname"], "clevel": config["clevel"], "shuffle": _SHUFFLE[config["shuffle"]],
                    "blocksize": config.get("blocksize", 0)}
        if _BLOSC_TYPESIZE:
            settings["typesize"] = config.get("typesize", itemsize)
        return _Compressor(Blosc(**settings))
    if name == "gzip":
        return _Compressor(GZip(level=config["level"]))
    if name == "zstd":
        return _Compressor(Zstd(level=config["level"], checksum=config.get("checksum", False)))
    raise TypeError(f"codec {name!r} is not coded here (bytes, blosc, gzip, zstd and crc32c are)")


class CodecChain:
    """A chunk's codecs (a ``codecs`` list of a metadata document): values of ``shape`` and
    ``dtype`` to bytes and back."""

    def __init__(self, codecs: Sequence[dict], shape: Sequence[int], dtype: np.dtype) -> None:
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        if not codecs or codecs[0]["name"] != "bytes":
            names = [c["name"] for c in codecs]
            raise TypeError(f"codecs {names}: only chains that start with 'bytes' are coded here")
        endian = (codecs[0].get("configuration") or {}).get("endian")
        self._stored = self.dtype.newbyteorder("<" if endian == "little" else ">") \
            if endian is not None and self.dtype.itemsize > 1 else self.dtype
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize
        self._codecs = [_bytes_codec(spec, self.dtype.itemsize) for spec in codecs[1:]]
        self._checksum_last = bool(self._codecs) and isinstance(self._codecs[-1], _Crc32c)
        # the bytes in this machine's order, then Blosc: a frame decompresses into the values
        self._blosc_second = (bool(self._codecs) and isinstance(self._codecs[0], _Compressor)
                              and isinstance(self._codecs[0].codec, Blosc) and self._stored.isnative)

    def fixed_size(self) -> int:
        """The length of every encoded chunk (TypeError for a chain that compresses: a shard index's
        must not)."""
        if not all(isinstance(codec, _Crc32c) for codec in self._codecs):
            raise TypeError("a chain with a compressor codes chunks of varying length")
        return self.nbytes + 4 * len(self._codecs)

    def _bytes(self, values: np.ndarray) -> np.ndarray:
        # C order, in the stored byte order (zarr's ``bytes`` codec: swapped only where it differs)
        return np.ascontiguousarray(values, dtype=self._stored).reshape(-1).view(np.uint8)

    def encode(self, values: np.ndarray) -> np.ndarray:
        parts = self.encode_parts(values)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    @property
    def checksums_values(self) -> bool:
        """Whether the chain is the values' bytes as they lie in memory, then a crc32c: the crc32c
        of a chunk's values is then its codec's."""
        return self._stored.isnative and len(self._codecs) == 1 and self._checksum_last

    def encode_parts(self, values: np.ndarray, checksum: int | None = None) -> list[np.ndarray]:
        """The encoded bytes as parts to lay end to end: a last crc32c apart from the bytes it
        covers (one copy less where a shard lays its chunks end to end anyway). ``checksum``: the
        crc32c of the values' bytes where the caller has it and the chain `checksums_values`."""
        data = self._bytes(values)
        if checksum is not None and self.checksums_values:
            return [data, np.array([checksum], dtype="<u4").view(np.uint8)]
        for codec in self._codecs[:-1] if self._checksum_last else self._codecs:
            data = codec.encode(data)
        return [data, _crc32c_of(data)] if self._checksum_last else [data]

    def _unwrapped(self, data, codecs) -> np.ndarray:
        data = _uint8(data)
        for codec in reversed(codecs):
            data = codec.decode(data)
        return data

    def decode(self, data) -> np.ndarray:
        """The values (C-contiguous, this machine's byte order); ValueError for bytes that fail
        their crc32c or are not a chunk's length."""
        data = self._unwrapped(data, self._codecs)
        if len(data) != self.nbytes:
            raise ValueError(f"a chunk decodes to {len(data)} bytes, not {self.nbytes}")
        values = data.view(self._stored).reshape(self.shape)
        return values if self._stored.isnative else values.astype(self.dtype)

    def decode_into(self, data, out: np.ndarray) -> None:
        """``decode`` into ``out`` (C-contiguous, the chunk's dtype and size): straight from Blosc
        where the chain allows (numcodecs' Blosc decompresses into a given array; a Blosc frame
        carries its own settings), after the checks of the codecs after it."""
        if not self._blosc_second:
            out[...] = self.decode(data).reshape(out.shape)
            return
        frame = self._unwrapped(data, self._codecs[1:])
        size = int.from_bytes(frame[4:8].tobytes(), "little")  # the Blosc header's uncompressed size
        if size != out.nbytes:  # Blosc fills a larger destination only in part
            raise ValueError(f"a Blosc frame of {size} bytes for a chunk of {out.nbytes}")
        blosc.decompress(frame, out)


def index_chain(codecs: Sequence[dict], grid: tuple[int, ...]) -> CodecChain:
    """The chain of a shard index of ``grid`` inner chunks (``index_codecs``)."""
    return CodecChain(codecs, (*grid, 2), np.dtype("uint64"))


def empty_index(grid: tuple[int, ...]) -> np.ndarray:
    return np.full((*grid, 2), EMPTY, dtype=np.uint64)


def chunk_range(index: np.ndarray, coords: tuple[int, ...]) -> tuple[int, int] | None:
    """The byte range [start, stop) of one inner chunk in its shard, from the shard's decoded
    index (None: not stored, the fill value)."""
    offset, nbytes = (int(v) for v in index[coords])
    if (offset, nbytes) == (EMPTY, EMPTY):
        return None
    return offset, offset + nbytes
