"""Model registration, run as a Ray task: load, hash, and save a self-contained copy in the store.

The copy under `models/<digest>/` (weights, config, tokenizer and the lens head) is what every
capture worker loads, so a multi-node cluster needs only the shared store.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from actstore.store.catalog import ModelRecord
from actstore.workers.models import ModelAdapter, resolve_model_source

HEAD_FILE = "lens_head.npz"
CARRIED_FILES = ("exit_heads.safetensors", "exit_heads.json", "lineage.json")


def model_dir(store_root: Path, digest: str) -> Path:
    return store_root / "models" / digest


def save_lens_head(head: dict, path: Path) -> None:
    arrays = {k: np.asarray(v) for k, v in head.items() if isinstance(v, np.ndarray)}
    meta = {k: v for k, v in head.items() if not isinstance(v, np.ndarray) and v is not None}
    np.savez(path, **arrays, **{f"meta_{k}": np.asarray(v) for k, v in meta.items()})


def load_lens_head(model_path: str | Path) -> dict | None:
    """The head saved at registration (the dict of ``ModelAdapter.lens_head``), or None."""
    path = Path(model_path) / HEAD_FILE
    if not path.exists():
        return None
    head: dict = {}
    with np.load(path, allow_pickle=False) as saved:
        for key in saved.files:
            value = saved[key]
            if key.startswith("meta_"):
                head[key.removeprefix("meta_")] = value.item()
            else:
                head[key] = value
    for optional in ("norm_weight", "norm_bias", "pooler_weight", "pooler_bias", "bias"):
        head.setdefault(optional, None)
    return head


def register_model(source: str, store_root: str) -> ModelRecord:
    """Load the model at `source` (a folder or a builtin name), store it under its digest with its
    lens head, and return its catalog record (lineage: the source) for the caller to add."""
    root = Path(store_root)
    path = resolve_model_source(source, root / "cache" / "builtin-models")
    adapter = ModelAdapter.load(path, device="cpu")
    target = model_dir(root, adapter.digest)
    head = adapter.lens_head()
    if not (target / "config.json").exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
        adapter.save(staging)
        if head is not None:
            save_lens_head(head, staging / HEAD_FILE)
        for extra in CARRIED_FILES:  # a multi-exit checkpoint's own classifiers, its lineage
            if (path / extra).is_file():
                shutil.copy2(path / extra, staging / extra)
        try:
            os.rename(staging, target)
        except OSError:  # a concurrent registration of the same digest won the race
            shutil.rmtree(staging, ignore_errors=True)
    return ModelRecord(
        digest=adapter.digest,
        kind=adapter.kind,
        arch=adapter.arch,
        num_layers=adapter.num_layers,
        hidden_size=adapter.hidden_size,
        max_positions=adapter.max_positions,
        path=str(target),
        has_head=head is not None,
        lineage={"source": source},
    )
