"""Format ``arrays``: pooled activations as one 2-D array (samples x width) per layer.

Three layouts (docs/import.md):

- a folder of ``layer_<k>.npy`` (``layer_0.npy``, ``layer_00.npy``, ``layer-3.npy`` ...), one per
  layer k = 0..L, read memory-mapped (no pickles);
- a folder of ``layer_<k>.safetensors``, each holding one tensor;
- one ``.safetensors`` file (the path itself, or the only one in the folder) with a tensor
  ``layer.<k>`` per layer.

Row i is sample i of the dataset. A ``sample_ids.json`` (a JSON list of strings) beside the
arrays names the rows; the import then checks it equals the dataset's ids, in order.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import torch

from actstore.errors import InvalidArgument
from actstore.workers.importers.base import (
    ImportSource,
    as_float32,
    check_float,
    check_layers,
    check_shapes,
    dtype_name,
    numbered,
)

LAYER_FILE = r"layer[_-]?(\d+)\.{ext}"
LAYER_KEY = re.compile(r"layer\.(\d+)")
IDS_FILE = "sample_ids.json"
# safetensors dtype codes as numpy/torch names
SAFETENSORS_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64", "I8": "int8",
                      "I16": "int16", "I32": "int32", "I64": "int64", "U8": "uint8", "BOOL": "bool"}


def safetensors_failure(path: Path, exc: Exception) -> InvalidArgument:
    text = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
    return InvalidArgument(f"cannot read {path} as safetensors ({text}): write it again with safetensors' save_file "
                           "(docs/import.md)")


class ArraysSource(ImportSource):
    format = "arrays"

    def __init__(self, path: Path) -> None:
        self.path = path
        folder = path if path.is_dir() else path.parent
        listing = sorted(folder.iterdir()) if path.is_dir() else [path]
        npy = numbered(listing, LAYER_FILE.format(ext="npy"))
        single = numbered(listing, LAYER_FILE.format(ext="safetensors"))
        if npy and single:
            raise InvalidArgument(f"{path} holds both layer_<k>.npy and layer_<k>.safetensors files: keep one kind")
        if npy:
            self._arrays = {k: self._npy(p) for k, p in npy.items()}
            self.files = [npy[k] for k in sorted(npy)]
        elif single:
            self._arrays = {k: self._one_tensor(p) for k, p in single.items()}
            self.files = [single[k] for k in sorted(single)]
        else:
            combined = [p for p in listing if p.suffix == ".safetensors"]
            if len(combined) != 1:
                raise InvalidArgument(f"{path}: no layer_<k>.npy or layer_<k>.safetensors files, nor one .safetensors "
                                      "file with tensors layer.<k> (see docs/import.md)")
            self._arrays = self._keyed(combined[0])
            self.files = combined
        layers = check_layers(self._arrays, str(path))
        self.n, self.width = check_shapes({k: tuple(self._shape(self._arrays[k])) for k in layers}, str(path))
        dtypes = {k: self._dtype(a) for k, a in self._arrays.items()}
        for k in layers:
            check_float(dtypes[k], f"{path}: layer {k}")
        if len(set(dtypes.values())) > 1:
            raise InvalidArgument(f"{path}: the layers mix dtypes ({', '.join(sorted(set(dtypes.values())))}): "
                                  "save every layer in one dtype")
        self.dtype = dtypes[0]
        self.num_states = len(layers)
        ids_file = folder / IDS_FILE
        if ids_file.is_file():
            self.sample_ids = _read_ids(ids_file)
            self.files.append(ids_file)

    def _npy(self, p: Path) -> np.ndarray:
        try:
            with open(p, "rb") as f:
                magic = f.read(len(np.lib.format.MAGIC_PREFIX))
        except OSError as exc:
            raise InvalidArgument(f"cannot read {p} as .npy: {exc}") from None
        if magic != np.lib.format.MAGIC_PREFIX:  # np.load takes anything else for a pickle
            raise InvalidArgument(f"{p} is not a .npy file (it does not start with the \\x93NUMPY header that "
                                  "numpy.save writes)")
        try:
            return np.load(p, mmap_mode="r", allow_pickle=False)
        except ValueError as exc:
            if "pickle" in str(exc).lower() or "python objects" in str(exc).lower():
                raise InvalidArgument(f"{p} holds an object array, which is not loaded (no pickles): save floats") \
                    from None
            raise InvalidArgument(f"cannot read {p} as .npy ({_npy_trouble(p, exc)}): {NPY_AGAIN}") from None
        except OSError as exc:
            raise InvalidArgument(f"cannot read {p} as .npy ({exc}): {NPY_AGAIN}") from None

    def _open(self, p: Path):
        from safetensors import SafetensorError, safe_open

        try:
            return safe_open(str(p), framework="pt")  # closed with the source (no context needed)
        except (SafetensorError, OSError) as exc:
            raise safetensors_failure(p, exc) from None

    def _one_tensor(self, p: Path):
        opened = self._open(p)
        keys = list(opened.keys())
        if len(keys) != 1:
            raise InvalidArgument(f"{p} holds {len(keys)} tensors; a layer_<k>.safetensors file holds exactly one")
        return opened.get_slice(keys[0])

    def _keyed(self, p: Path) -> dict:
        opened = self._open(p)
        found = {}
        for key in opened.keys():
            match = LAYER_KEY.fullmatch(key)
            if match is None:
                raise InvalidArgument(f"{p}: tensor {key!r} is not named layer.<k>: name one tensor per layer "
                                      "layer.0 .. layer.L")
            found[int(match.group(1))] = opened.get_slice(key)
        return found

    @staticmethod
    def _shape(array) -> tuple[int, ...]:
        return tuple(array.shape) if isinstance(array, np.ndarray) else tuple(array.get_shape())

    @staticmethod
    def _dtype(array) -> str:
        if isinstance(array, np.ndarray):
            return dtype_name(array.dtype)
        code = array.get_dtype()
        return SAFETENSORS_DTYPES.get(code, code.lower())

    def pooled_rows(self, start: int, stop: int) -> torch.Tensor:
        layers = [as_float32(self._arrays[k][start:stop], f"{self.path}: layer {k}") for k in range(self.num_states)]
        return torch.stack(layers, dim=1)

    def describe(self) -> str:
        return (f"{self.path} ({len(self.files)} files, {self.num_states} layers of {self.n} x {self.width} "
                f"{self.dtype})")


NPY_AGAIN = "write it again with numpy.save (docs/import.md)"


def _npy_trouble(path: Path, exc: Exception) -> str:
    """What is wrong with a .npy file np.load refused: the size its header declares against the
    file's (a cut-short file; numpy says only 'mmap length is greater than file size'), or numpy's
    own words when the header itself does not parse."""
    try:
        with open(path, "rb") as f:
            read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                           (2, 0): np.lib.format.read_array_header_2_0}[np.lib.format.read_magic(f)]
            shape, _, dtype = read_header(f)
            header = f.tell()
        declared = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    except (ValueError, OSError, OverflowError, KeyError):
        return f"its header is damaged: {str(exc).splitlines()[0][:120]}"
    size = path.stat().st_size
    if size < declared:
        return f"its header declares {shape} {dtype} ({declared} bytes) but the file holds {size}: cut short?"
    return str(exc).splitlines()[0][:120]


def _read_ids(path: Path) -> list[str]:
    try:
        ids = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"cannot read {path} ({str(exc).splitlines()[0][:120]}): it must be a JSON list of "
                              "sample id strings, one per sample, in the dataset's order") from None
    if not isinstance(ids, list) or not all(isinstance(s, str) for s in ids):
        raise InvalidArgument(f"{path} must be a JSON list of sample id strings")
    return ids
