"""What every import format shares: the source object, the checks on its tensors, the pooling of
token sources, and the digest of the files an import read (part of the run key).

A source is either *pooled* (one vector per sample and layer: ``pooled_rows``) or holds every
token of every sample (``token_counts`` and ``token_blocks``), which an import pools (cls = the
first token, last, mean) or keeps (``tokens``). Values come back as float32 torch tensors of shape
(rows, L+1, d); a source's float64 is narrowed to float32, the widest storage dtype.
"""

from __future__ import annotations

import hashlib
import re
import struct
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from actstore.errors import InvalidArgument

# source dtypes an import accepts, and the storage dtype each keeps by default
FLOAT_DTYPES = {"float16": "float16", "bfloat16": "bfloat16", "float32": "float32", "float64": "float32"}
_BLOCK = 8 << 20


class ImportSource(ABC):
    """Activations made elsewhere, opened read-only. Subclasses set the fields in ``__init__``."""

    format: str
    path: Path
    n: int  # samples
    num_states: int  # L + 1 (layers 0..L)
    width: int
    dtype: str  # the source's float dtype (a FLOAT_DTYPES key)
    files: list[Path]  # every file the import reads, in a fixed order (digested)
    sample_ids: list[str] | None = None  # what the source says about its rows, in row order

    per_token: bool = False  # holds every token of every sample (token_counts, token_blocks)

    def token_counts(self) -> np.ndarray | None:
        """Tokens of each sample (int64, n) for a source that holds every token; None if pooled."""
        return None

    def pooled_rows(self, start: int, stop: int) -> torch.Tensor:
        """(stop - start, L+1, d) float32: samples [start, stop) of a pooled source."""
        raise NotImplementedError

    def token_blocks(self, start: int, stop: int) -> list[tuple[torch.Tensor, np.ndarray | None]]:
        """Samples [start, stop) of a per-token source: each (T_i, L+1, d) float32 and its token ids."""
        raise NotImplementedError

    @abstractmethod
    def describe(self) -> str:
        """One line for messages: the format and what it found."""

    def digest(self) -> str:
        """sha256 over the format and every file read (name relative to the source, then bytes)."""
        h = hashlib.sha256(f"actstore-import-v1:{self.format}".encode())
        root = self.path if self.path.is_dir() else self.path.parent
        for f in self.files:
            name = str(f.relative_to(root)).encode()
            h.update(struct.pack("<Q", len(name)) + name + struct.pack("<Q", f.stat().st_size))
            with open(f, "rb") as stream:
                while block := stream.read(_BLOCK):
                    h.update(block)
        return h.hexdigest()


def pool_blocks(blocks: Sequence[tuple[torch.Tensor, np.ndarray | None]], pooling: str) -> torch.Tensor:
    """One vector per sample and layer from per-token blocks: cls (first token), last or mean
    (over the sample's tokens, in float64)."""
    pooled = []
    for values, _ in blocks:
        if pooling == "cls":
            pooled.append(values[0])
        elif pooling == "last":
            pooled.append(values[-1])
        else:
            pooled.append(values.double().mean(dim=0).float())
    return torch.stack(pooled)


def as_float32(values, where: str) -> torch.Tensor:
    """A float tensor or array as a float32 torch tensor (float64 narrowed)."""
    check_float(dtype_name(values.dtype), where)
    # a copy of a numpy slice: memory-mapped sources are read-only, which torch does not wrap
    # (in native byte order: torch takes no other)
    tensor = values if isinstance(values, torch.Tensor) else torch.from_numpy(
        np.array(values, dtype=values.dtype.newbyteorder("=")))
    return tensor.float()


def dtype_name(dtype) -> str:
    """'float16', 'bfloat16', 'int64', ... of a numpy or torch dtype (a numpy dtype's byte order
    aside: '>f4' is float32)."""
    return dtype.name if isinstance(dtype, np.dtype) else str(dtype).removeprefix("torch.")


def check_float(name: str, where: str) -> str:
    if name not in FLOAT_DTYPES:
        raise InvalidArgument(f"{where} holds {name} values: activations must be floats ({', '.join(FLOAT_DTYPES)}); "
                              "convert them before importing")
    return name


def check_layers(found: dict[int, object], where: str, unit: str = "layer") -> list[int]:
    """The layer numbers in order, refused unless they are exactly 0..L with no gap."""
    if not found:
        raise InvalidArgument(f"{where}: no {unit}s found (see docs/import.md for the layout)")
    layers = sorted(found)
    if layers != list(range(len(layers))):
        missing = sorted(set(range(layers[-1] + 1)) - set(layers))
        raise InvalidArgument(f"{where}: layers must be 0..L with no gap; {unit} {missing[0]} is missing "
                              f"(found {', '.join(map(str, layers))})")
    return layers


def check_shapes(shapes: dict[int, tuple[int, ...]], where: str, rows_name: str = "samples") -> tuple[int, int]:
    """(rows, width) of per-layer (rows, width) shapes that all agree; InvalidArgument naming the odd one."""
    first = shapes[0]
    for layer, shape in shapes.items():
        if len(shape) != 2:
            raise InvalidArgument(f"{where}: layer {layer} has shape {tuple(shape)}; each layer must be "
                                  f"({rows_name}, width)")
    for layer, shape in shapes.items():
        if shape[1] != first[1]:
            raise InvalidArgument(f"{where}: mixed widths: layer 0 is {first[1]} wide, layer {layer} is {shape[1]}; "
                                  "every layer must have the model's width")
        if shape[0] != first[0]:
            raise InvalidArgument(f"{where}: layer 0 has {first[0]} {rows_name}, layer {layer} has {shape[0]}; "
                                  "every layer must have one row per sample")
    return int(first[0]), int(first[1])


def numbered(paths: Sequence[Path], pattern: str) -> dict[int, Path]:
    """{k: path} of the file names matching ``pattern`` (one group: the number); a repeat is refused."""
    found: dict[int, Path] = {}
    for p in paths:
        match = re.fullmatch(pattern, p.name)
        if match is None:
            continue
        k = int(match.group(1))
        if k in found:
            raise InvalidArgument(f"{p.parent}: {found[k].name} and {p.name} are both layer {k}")
        found[k] = p
    return found
