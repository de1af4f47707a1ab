"""Token-level run layouts: how many token rows each prompt of a dataset owns, and where each token
lies in its text, from the model's tokenizer alone.

The texts come from `store.datasets`, the tokenizer from `modeling.tokens` (transformers'
AutoTokenizer, which imports torch: a `TokenLayouts` process's first layout takes ~2 s here).

A layout is computed once per (tokenizer, dataset, max_len) and kept in the store's files area as a
content-addressed folder (`layouts/<sha256>/layout.npz`): under the digest of the tokenizer's
files (every file of the model folder but its weights and the store's record of it), the dataset,
max_len, whether spans are kept and the transformers/tokenizers releases; and under the same for
the model's own folder, so
that a server finds the layout of a model it has laid out before without a `TokenLayouts` process
(`stored_layout`), and a new model with a known tokenizer (a training checkpoint) skips the
tokenisation. A stored layout that does not read back whole (npz members carry a CRC-32) or does
not fit together is removed and computed again.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import io
import logging
import zipfile
from pathlib import Path

import numpy as np
from cachetools import LRUCache

from actstore.errors import InvalidArgument
from actstore.modeling.tokens import LOAD_HINT, load_tokenizer, token_layout
from actstore.store.backends.files import COMPLETE_MARKER, RECORD_FILE, StoreFiles
from actstore.store.datasets import load_dataset
from actstore.store.handle import StoreHandle

log = logging.getLogger(__name__)

TOKENIZERS_KEPT = 8  # models whose tokenizer a `TokenLayouts` keeps loaded
LAYOUT_FILE = "layout.npz"
LAYOUT_FORMAT = "1"  # part of every key: a change of what a layout holds gets new keys
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".h5", ".msgpack", ".onnx")

Layout = tuple[np.ndarray, "np.ndarray | None"]  # (offsets (n+1,) int64, spans (rows, 2) int32 or None)


def _key(kind: str, *parts: str) -> str:
    versions = [_version("transformers"), _version("tokenizers")]  # a new release may tokenise otherwise
    digest = hashlib.sha256("\0".join([LAYOUT_FORMAT, kind, *versions, *parts]).encode()).hexdigest()
    return f"layouts/{digest}"


def _version(package: str) -> str:
    try:
        return md.version(package)
    except md.PackageNotFoundError:
        return "-"


def model_layout_key(model_path: str, dataset_path: str, max_len: int, spans: bool) -> str:
    """The key of a layout by the model's own folder (refs are content-addressed)."""
    return _key("model", model_path, dataset_path, str(max_len), str(spans))


def tokenizer_layout_key(model_dir: Path, dataset_path: str, max_len: int, spans: bool) -> str:
    """The key of a layout by the bytes of the tokenizer's files (all of the folder but weights and the
    store's own record of the model, which names its digest)."""
    files = hashlib.sha256()
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file() and not p.name.endswith(WEIGHT_SUFFIXES)
                       and p.name not in (COMPLETE_MARKER, RECORD_FILE)):
        files.update(f"{path.relative_to(model_dir)}\0{path.stat().st_size}\0".encode())
        files.update(path.read_bytes())
    return _key("tokenizer", files.hexdigest(), dataset_path, str(max_len), str(spans))


def stored_layout(files: StoreFiles, key: str) -> Layout | None:
    """The layout kept under `key`, or None (none kept, or one that does not read back whole: it is
    removed, to be computed again)."""
    if not files.exists(key):
        return None
    try:
        data = files.read(key, LAYOUT_FILE)
        if data is None:
            raise ValueError(f"{LAYOUT_FILE} is missing")
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            offsets = npz["offsets"]
            spans = npz["spans"] if "spans" in npz.files else None
        if offsets.ndim != 1 or offsets.dtype != np.int64 or len(offsets) < 1 or offsets[0] != 0 \
                or np.any(np.diff(offsets) < 0):
            raise ValueError("its offsets are not a layout")
        if spans is not None and (spans.dtype != np.int32 or spans.shape != (int(offsets[-1]), 2)):
            raise ValueError("its spans do not fit its offsets")
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        log.warning("the token layout kept as %s does not read back (%s): computing it again", key, exc)
        files.remove(key)
        return None
    return offsets, spans


def keep_layout(files: StoreFiles, key: str, layout: Layout) -> None:
    offsets, spans = layout
    arrays = {"offsets": offsets} if spans is None else {"offsets": offsets, "spans": spans}

    def build(folder: Path) -> None:
        folder.mkdir(parents=True)
        with open(folder / LAYOUT_FILE, "wb") as f:
            np.savez(f, **arrays)

    files.write_folder(key, build)


class TokenLayouts:
    """Token-level run layouts, from one warm process per Ray job (an actor of no logical CPU, that
    `server.capture_pool` starts and every server of the process shares): the tokenizers it loaded
    stay loaded, so a layout costs its tokenisation alone, and the next server of the process (a
    notebook's reopened client, the next test's server) does not pay its start (~2.5 CPU-s) again.
    As a one-CPU Ray task, a layout ran on whichever worker was free, and right after a capture
    that was a shard writer that had never tokenised: it paid the tokenizer's imports first (0.8 s
    on this 2-core machine; 7.5 s, and once over 50 s, on a 16-core GPU node), and it needed a free
    CPU, which the writers may all hold. Each call names its store: the files it reads and keeps."""

    def __init__(self) -> None:
        # by (store root, model path): a path names a model within its store only
        self._tokenizers: LRUCache = LRUCache(maxsize=TOKENIZERS_KEPT)

    def rows(self, store: StoreHandle, model_path: str, dataset_path: str, max_len: int,
             spans: bool = True) -> Layout:
        """A token-level run's offsets (prompt i owns token rows offsets[i]:offsets[i+1]) and every
        row's character span in its text (`modeling.tokens`; None without ``spans`` or a fast
        tokenizer), from the model's tokenizer alone; kept in ``store`` under both keys."""
        files = store.files
        by_tokenizer = tokenizer_layout_key(store.local(model_path), dataset_path, max_len, spans)
        layout = stored_layout(files, by_tokenizer)
        if layout is None:
            layout = self._compute(store, model_path, dataset_path, max_len, spans)
            keep_layout(files, by_tokenizer, layout)
        keep_layout(files, model_layout_key(model_path, dataset_path, max_len, spans), layout)
        return layout

    def _compute(self, store: StoreHandle, model_path: str, dataset_path: str, max_len: int,
                 spans: bool) -> Layout:
        tokenizer = self._tokenizers.get((store.root, model_path))
        if tokenizer is None:
            tokenizer = load_tokenizer(store.local(model_path), LOAD_HINT)
            if tokenizer is None:
                raise InvalidArgument("a token-level capture needs a text model with a tokenizer; this model has none")
            self._tokenizers[store.root, model_path] = tokenizer
        data = load_dataset(store.local(dataset_path))
        if data.kind != "text":
            raise InvalidArgument("a token-level capture needs a text dataset")
        counts, char_spans = token_layout(tokenizer, data.texts, max_len, spans)
        return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), char_spans
