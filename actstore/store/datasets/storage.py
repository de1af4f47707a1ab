"""The on-disk format of a dataset in the store: ``save_dataset`` writes it, ``load_dataset`` reads it.

Layout of a dataset directory: ``data.npz`` (``np.savez``, no pickles: ``images`` or
``texts_utf8`` + ``texts_offsets``, ``labels``, ``groups``, ``ids_utf8`` + ``ids_offsets``) and
``meta.json`` (format, kind, n, digest, label_names, source).
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from actstore.errors import AlreadyExists, DataLoss, InvalidArgument, NotFound
from actstore.store.atomic import atomic_directory
from actstore.store.datasets.core import DatasetData, dataset_digest

STORE_FORMAT = 1
_NPZ_NAME = "data.npz"
_META_NAME = "meta.json"


def _pack_strings(strings: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    encoded = [s.encode("utf-8", "surrogatepass") for s in strings]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    return np.frombuffer(b"".join(encoded), dtype=np.uint8), offsets


def _unpack_strings(blob: np.ndarray, offsets: np.ndarray) -> list[str]:
    raw = blob.tobytes()
    off = offsets.tolist()
    return [raw[off[i] : off[i + 1]].decode("utf-8", "surrogatepass") for i in range(len(off) - 1)]


def save_dataset(data: DatasetData, directory: str | os.PathLike) -> str:
    """Write ``data`` into ``directory`` (created; its parent must exist or is created) atomically.

    Strings are stored as concatenated UTF-8 bytes plus int64 offsets rather than a numpy unicode
    array: a ``U`` array pads every string to the longest one (4 bytes a character) and silently
    drops trailing NUL characters, which would change the digest.

    The files are written through ``atomic_directory``, so a reader sees either nothing or the
    whole dataset. Saving the same dataset again is a no-op; if ``directory`` already holds a
    different dataset, ``AlreadyExists`` is raised. Returns the dataset digest.
    """
    target = Path(directory)
    digest = dataset_digest(data)
    if target.exists():
        return _existing_matches(target, digest)

    arrays: dict[str, np.ndarray] = {}
    if data.kind == "text":
        arrays["texts_utf8"], arrays["texts_offsets"] = _pack_strings(data.texts or [])
    else:
        assert data.images is not None
        arrays["images"] = data.images
    arrays["ids_utf8"], arrays["ids_offsets"] = _pack_strings(data.sample_ids)
    if data.labels is not None:
        arrays["labels"] = data.labels
    if data.groups is not None:
        arrays["groups"] = data.groups
    meta = {
        "format": STORE_FORMAT,
        "kind": data.kind,
        "n": data.n,
        "digest": digest,
        "label_names": data.label_names,
        "source": data.source,
    }
    try:
        meta_text = json.dumps(meta, indent=1, sort_keys=True, default=_json_default)
    except (TypeError, ValueError) as e:
        raise InvalidArgument(f"dataset source must be JSON-serialisable: {e}") from None

    try:
        with atomic_directory(target) as staging:
            with open(staging / _NPZ_NAME, "wb") as f:
                np.savez(f, **arrays)
            (staging / _META_NAME).write_text(meta_text, encoding="utf-8")
    except FileExistsError:  # somebody else won the race: fine if it is the same dataset
        return _existing_matches(target, digest)
    return digest


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON-serialisable")


def _existing_matches(target: Path, digest: str) -> str:
    try:
        meta = json.loads((target / _META_NAME).read_text(encoding="utf-8"))
        stored = meta.get("digest")
    except (OSError, ValueError, AttributeError):
        stored = None
    if stored == digest:
        return digest
    raise AlreadyExists(
        f"{target} already exists and holds a different dataset "
        f"(digest {stored or 'unreadable'}, not {digest}): save into a new directory"
    )


def load_dataset(directory: str | os.PathLike) -> DatasetData:
    """Read a dataset written by ``save_dataset``; the digest is checked (``DataLoss`` if not)."""
    d = Path(directory)
    if not d.is_dir():
        raise NotFound(f"no dataset directory at {d}")
    meta_path, npz_path = d / _META_NAME, d / _NPZ_NAME
    for p in (meta_path, npz_path):
        if not p.is_file():
            raise DataLoss(
                f"dataset directory {d} has no {p.name}: it is incomplete; save it again"
            )
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if meta.get("format") != STORE_FORMAT:
            raise DataLoss(
                f"{meta_path} has format {meta.get('format')!r}, expected {STORE_FORMAT}"
            )
        with np.load(npz_path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        if meta["kind"] == "text":
            texts = _unpack_strings(arrays["texts_utf8"], arrays["texts_offsets"])
            images = None
        else:
            texts, images = None, arrays["images"]
        ids = _unpack_strings(arrays["ids_utf8"], arrays["ids_offsets"])
        data = DatasetData(
            kind=meta["kind"],
            texts=texts,
            images=images,
            labels=arrays.get("labels"),
            label_names=meta.get("label_names"),
            sample_ids=ids,
            groups=arrays.get("groups"),
            source=meta.get("source") or {},
        )
    except DataLoss:
        raise
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, InvalidArgument) as e:
        raise DataLoss(
            f"dataset in {d} is corrupt ({type(e).__name__}: {e}); save it again"
        ) from None
    got = dataset_digest(data)
    if got != meta.get("digest"):
        raise DataLoss(
            f"dataset in {d} does not match its recorded digest ({got} != {meta.get('digest')}): "
            "the files are corrupt; save it again"
        )
    return data
