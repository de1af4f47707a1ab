"""The dataset object and its identity: ``DatasetData``, its validation, and ``dataset_digest``.

Also the two argument checks every source shares (``is_positive_int``, ``check_seed``), so a bad
``limit``, ``n_views`` or ``seed`` reads the same whichever function received it.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from actstore.errors import InvalidArgument

DIGEST_VERSION = "actstore-dataset-v1"


MAX_LABEL = 2**31 - 1  # num_labels = the largest label + 1 is a 32-bit count in the catalog and on the wire


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
        if self.labels is not None and self.labels.size:
            bad = (self.labels < 0) | (self.labels >= MAX_LABEL)
            if bad.any():
                i = int(np.argmax(bad))
                raise InvalidArgument(
                    f"label of sample {ids[i]!r} is {int(self.labels[i])}: "
                    f"labels are class indices >= 0 and below {MAX_LABEL} (a 32-bit class count)"
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


def is_positive_int(v: Any) -> bool:
    """Whether ``v`` is an integer >= 1 (``bool`` is not)."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1


def check_seed(seed: Any) -> None:
    """Raise ``InvalidArgument`` unless ``seed`` is an integer >= 0 (``bool`` is not)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InvalidArgument(f"seed must be a non-negative integer, not {seed!r}")
