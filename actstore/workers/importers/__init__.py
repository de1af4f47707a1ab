"""Readers of activations made elsewhere, for ``actstore import`` (docs/import.md).

    arrays    a folder of layer_<k>.npy or layer_<k>.safetensors, or one .safetensors of layer.<k>
              tensors: pooled, (samples, width) per layer
    vllm      the <sample id>.safetensors files vLLM's extract_hidden_states writes: every token
    saelens   a SAELens cached-activations dataset (save_to_disk; one Array2D column per hook)

``open_source(path, format, dataset_ids)`` opens one (``format`` None: detected from the files)
and checks what it can without the model: float dtypes, layers 0..L with no gap, one width,
one row count. The import job checks the rest against the registered model and dataset.
"""

from __future__ import annotations

from pathlib import Path

from actstore.errors import InvalidArgument, NotFound
from actstore.store.datasets import is_dataset_folder
from actstore.workers.importers.arrays import ArraysSource
from actstore.workers.importers.base import FLOAT_DTYPES, ImportSource, pool_blocks
from actstore.workers.importers.saelens import SaeLensSource
from actstore.workers.importers.vllm import VllmSource

FORMATS = ("arrays", "vllm", "saelens")

__all__ = ["FLOAT_DTYPES", "FORMATS", "ImportSource", "detect_format", "open_source", "pool_blocks"]


def detect_format(path: Path) -> str:
    """The format the files at ``path`` are in: a save_to_disk folder is saelens, layer_<k> files
    or one .safetensors file are arrays, a folder of several .safetensors files is vllm."""
    if is_dataset_folder(path):
        return "saelens"
    if path.is_dir():
        names = [p.name for p in path.iterdir()]
        layered = any(p.startswith("layer") for p in names)
        sidecars = [n for n in names if n.endswith(".safetensors")]
        if not layered and len(sidecars) > 1:
            return "vllm"
    return "arrays"


def open_source(path: Path, fmt: str | None, dataset_ids: list[str], check: bool = True) -> ImportSource:
    """``check`` False: a source already checked when its import was submitted (a shard task), so
    a vllm folder's headers are not all read again."""
    if not path.exists():
        raise NotFound(f"{path}: not found on the server")
    fmt = fmt or detect_format(path)
    if fmt == "arrays":
        return ArraysSource(path)
    if fmt == "vllm":
        return VllmSource(path, dataset_ids, check)
    if fmt == "saelens":
        return SaeLensSource(path)
    raise InvalidArgument(f"unknown import format {fmt!r}: use one of {', '.join(FORMATS)}")

