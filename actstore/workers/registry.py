"""Model registration, run as a Ray task: load, hash, and save a self-contained copy in the store.

The copy under `models/<digest>/` (weights, config, tokenizer and the lens head) is what every
capture worker loads, so a multi-node cluster needs only the shared store. It is written through
`atomic_directory`, so a model folder is complete or absent.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from actstore.metrics.lens_head import LensHead
from actstore.modeling.adapter import ModelAdapter
from actstore.modeling.sources import resolve_model_source
from actstore.store.atomic import atomic_directory
from actstore.store.backends.files import RECORD_FILE
from actstore.store.catalog import ModelRecord
from actstore.store.handle import StoreHandle

HEAD_FILE = "lens_head.npz"
CARRIED_FILES = ("exit_heads.safetensors", "exit_heads.json", "lineage.json")

# lens_head.npz: the LensHead arrays under their field names (absent when None), the other fields
# as 0-d arrays named "meta_<field>". The task is stored as "meta_type" (its name before LensHead
# was the stored type) and num_classes is written for readers of that format.
_HEAD_ARRAYS = ("norm_weight", "norm_bias", "weight", "bias", "pooler_weight", "pooler_bias")
_HEAD_META = {"norm": "norm", "eps": "eps", "pooler_activation": "pooler_activation",
              "position": "position", "task": "type", "arch": "arch", "digest": "digest"}


def save_lens_head(head: LensHead, path: Path) -> None:
    """Write ``head`` to ``path`` (an .npz file; arrays keep their dtype)."""
    arrays = {k: getattr(head, k) for k in _HEAD_ARRAYS if getattr(head, k) is not None}
    meta = {stored: getattr(head, field) for field, stored in _HEAD_META.items()
            if getattr(head, field) is not None}
    meta["num_classes"] = head.num_classes
    np.savez(path, **arrays, **{f"meta_{k}": np.asarray(v) for k, v in meta.items()})


def load_lens_head(model_path: str | Path) -> LensHead | None:
    """The head saved at registration (``ModelAdapter.lens_head``), or None for a model without."""
    path = Path(model_path) / HEAD_FILE
    if not path.exists():
        return None
    with np.load(path, allow_pickle=False) as saved:
        stored = {key: saved[key] for key in saved.files}
    fields = {k: stored[k] for k in _HEAD_ARRAYS if k in stored}
    for field, name in _HEAD_META.items():
        if f"meta_{name}" in stored:
            fields[field] = stored[f"meta_{name}"].item()
    fields.setdefault("norm_weight", None)
    fields.setdefault("norm_bias", None)
    fields.setdefault("eps", 0.0)  # a head without a norm stored no eps
    if fields.get("norm") != "none" and fields["norm_weight"] is None:
        # written before LensHead: a norm without a learned scale stored no weight
        width = (fields.get("pooler_weight") if fields.get("pooler_weight") is not None
                 else fields["weight"]).shape[1]
        fields["norm_weight"] = np.ones(width, dtype=np.float32)
    return LensHead(**fields)


def register_model(source: str, store: StoreHandle, stored: bool = False) -> ModelRecord:
    """Load the model at `source` (a folder or a builtin name; with `stored`, the key of a folder
    in the store's files area, such as a training checkpoint, read on whichever node this runs),
    store it under its digest with its lens head, and return its catalog record (lineage: the
    source) for the caller to add."""
    if stored:
        path = store.local(store.files.ref(source))
        source = f"{store.root.rstrip('/')}/{source}" if store.is_remote else str(path)
    else:
        path = resolve_model_source(source, store.cache_dir / "builtin-models")
    adapter = ModelAdapter.load(path, device="cpu")
    head = adapter.lens_head()
    description = {"digest": adapter.digest, "kind": adapter.kind, "arch": adapter.arch,
                   "num_layers": adapter.num_layers, "hidden_size": adapter.hidden_size,
                   "max_positions": adapter.max_positions, "has_head": head is not None,
                   "lineage": {"source": source}}

    def build(target: Path) -> None:
        try:
            with atomic_directory(target) as staging:
                adapter.save(staging)
                # the catalog record, so the store describes its models (`catalog rebuild`)
                (staging / RECORD_FILE).write_text(json.dumps(description, sort_keys=True))
                if head is not None:
                    save_lens_head(head, staging / HEAD_FILE)
                for extra in CARRIED_FILES:  # a multi-exit checkpoint's own classifiers, its lineage
                    if (path / extra).is_file():
                        shutil.copy2(path / extra, staging / extra)
        except FileExistsError:
            pass  # a concurrent registration of the same digest won the race: same content

    ref = store.files.write_folder(f"models/{adapter.digest}", build)
    return ModelRecord(**description, path=ref)
