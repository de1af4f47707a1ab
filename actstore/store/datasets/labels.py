"""Label sets: labels registered by sample id against a dataset after its runs exist.

One capture serves many probing tasks: a label set names, for some of a dataset's samples, a class
(categorical) or a number (continuous). It is content-addressed (``label_set_digest``) and never
changes the dataset digest or any run key. Samples without a label (absent from the file, or an
empty cell, a null, a NaN) are simply not in the set; an id that matches no sample of the dataset
is refused, naming some.

- ``read_label_file(path, id_column, label_column)``: the (id, value) pairs of a ``.csv`` (every
  cell a string), ``.jsonl``/``.json`` (records) or ``.parquet`` file;
- ``make_label_set(dataset_digest, dataset_ids, ids, values, kind)``: validated against the
  dataset, the values read as classes or numbers (``kind`` auto: numbers of which one is not an
  integer are continuous, anything else categorical), in the dataset's sample order;
- ``save_label_set`` / ``load_label_set``: a folder holding ``labels.npz`` and ``meta.json``
  (written atomically; read back with its digest checked).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from actstore.errors import DataLoss, InvalidArgument, NotFound
from actstore.store.atomic import atomic_directory
from actstore.store.catalog.schema import LabelSetRecord
from actstore.store.datasets.columns import ids_from_values
from actstore.store.datasets.parsers import read_json_records, read_user_csv

DIGEST_VERSION = "actstore-labels-v1"
KINDS = ("auto", "categorical", "continuous")
LABEL_FILE_EXTENSIONS = (".csv", ".jsonl", ".json", ".parquet")
_NPZ, _META = "labels.npz", "meta.json"
_SHOWN = 5  # unknown ids named in a refusal


@dataclass(eq=False)
class LabelSet:
    """Labels of some of a dataset's samples: `positions` (ascending sample indices of the
    dataset), and for each `values` (float64) or `codes` (int64 into `classes`)."""

    dataset_digest: str
    kind: str  # categorical | continuous
    samples: int  # the dataset's n
    positions: np.ndarray
    codes: np.ndarray | None = None
    classes: list[str] | None = None
    values: np.ndarray | None = None
    source: dict = field(default_factory=dict)

    @property
    def labelled(self) -> int:
        return len(self.positions)

    def per_sample(self) -> np.ndarray:
        """One entry per dataset sample: the class code (-1: no label) of a categorical set, the
        value (NaN: no label) of a continuous one."""
        if self.kind == "categorical":
            out = np.full(self.samples, -1, dtype=np.int64)
            out[self.positions] = self.codes
        else:
            out = np.full(self.samples, np.nan)
            out[self.positions] = self.values
        return out


def label_set_record(labels: LabelSet, digest: str, name: str, path: str) -> LabelSetRecord:
    """The catalog's row of a stored set."""
    return LabelSetRecord(labels.dataset_digest, name, digest, labels.kind, tuple(labels.classes or ()),
                          labels.labelled, labels.samples, path, labels.source)


def label_set_digest(labels: LabelSet) -> str:
    """sha256 over the dataset digest, the kind, the class names, the labelled positions and their
    codes or values (little-endian): the same labels in any file order are the same set."""
    h = hashlib.sha256(DIGEST_VERSION.encode())
    for text in (labels.dataset_digest, labels.kind, json.dumps(labels.classes)):
        encoded = text.encode()
        h.update(struct.pack("<Q", len(encoded)) + encoded)
    h.update(np.ascontiguousarray(labels.positions, dtype="<i8").tobytes())
    own = labels.codes if labels.kind == "categorical" else labels.values
    h.update(np.ascontiguousarray(own, dtype="<i8" if labels.kind == "categorical" else "<f8").tobytes())
    return h.hexdigest()


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip() == "") or (
        isinstance(value, float) and math.isnan(value))


def _number(value: Any) -> float | None:
    """The value as a float where it is one (a number or a string that spells one), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float, np.integer, np.floating)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def make_label_set(dataset_digest: str, dataset_ids: Sequence[str], ids: Sequence[Any], values: Sequence[Any],
                   kind: str = "auto", where: str = "the labels", source: dict | None = None) -> LabelSet:
    """A validated label set (module docstring); InvalidArgument naming what is wrong."""
    if kind not in KINDS:
        raise InvalidArgument(f"label kind {kind!r} is not one of {', '.join(KINDS)}")
    if len(ids) != len(values):
        raise InvalidArgument(f"{where}: {len(ids)} ids for {len(values)} labels: give one label per id")
    ids = ids_from_values(list(ids), where)
    position = {sample: i for i, sample in enumerate(dataset_ids)}
    unknown = [sample for sample in ids if sample not in position]
    if unknown:
        shown = ", ".join(repr(s) for s in unknown[:_SHOWN])
        raise InvalidArgument(f"{where}: {len(unknown)} of {len(ids)} ids match no sample of dataset "
                              f"{dataset_digest[:12]} (e.g. {shown}); its ids look like {dataset_ids[0]!r}: "
                              "register the labels against the dataset they belong to, with its sample ids "
                              "(--id-column names the column that holds them)")
    seen: set[str] = set()
    for sample in ids:
        if sample in seen:
            raise InvalidArgument(f"{where}: sample id {sample!r} is labelled twice: give each sample one label")
        seen.add(sample)
    kept = [(position[s], v) for s, v in zip(ids, values) if not _missing(v)]
    if not kept:
        raise InvalidArgument(f"{where}: every label is empty: nothing to register")
    kept.sort(key=lambda pair: pair[0])
    positions = np.asarray([p for p, _ in kept], dtype=np.int64)
    raw = [v for _, v in kept]
    numbers = [_number(v) for v in raw]
    numeric = all(x is not None for x in numbers)
    if kind == "auto":
        kind = "continuous" if numeric and any(not float(x).is_integer() for x in numbers) else "categorical"
    common = dict(dataset_digest=dataset_digest, samples=len(dataset_ids), positions=positions,
                  source=dict(source or {}))
    if kind == "continuous":
        if not numeric:
            bad = next(v for v, x in zip(raw, numbers) if x is None)
            raise InvalidArgument(f"{where}: label {bad!r} is not a number: a continuous label set holds numbers "
                                  "(or register it with --kind categorical)")
        values_array = np.asarray(numbers, dtype=np.float64)
        if not np.isfinite(values_array).all():
            raise InvalidArgument(f"{where}: a continuous label is infinite: labels must be finite numbers (an "
                                  "empty cell leaves a sample unlabelled)")
        return LabelSet(kind="continuous", values=values_array, **common)
    if numeric and all(float(x).is_integer() for x in numbers):  # integer classes, named and ordered as numbers
        as_ints = [int(x) for x in numbers]
        classes = [str(c) for c in sorted(set(as_ints))]
        keys = [str(c) for c in as_ints]
    else:
        keys = [str(v).strip() for v in raw]
        classes = sorted(set(keys))
    if len(classes) < 2:
        raise InvalidArgument(f"{where}: every labelled sample is of the one class {classes[0]!r}: a probe needs at "
                              "least two classes (or register a continuous target with --kind continuous)")
    index = {name: code for code, name in enumerate(classes)}
    return LabelSet(kind="categorical", codes=np.asarray([index[k] for k in keys], dtype=np.int64), classes=classes,
                    **common)


def read_label_file(path: str | os.PathLike, id_column: str, label_column: str) -> tuple[list[Any], list[Any]]:
    """The ids and labels of a label file (module docstring); InvalidArgument for a bad file."""
    p = Path(path).expanduser()
    ext = p.suffix.lower()
    if ext not in LABEL_FILE_EXTENSIONS:
        raise InvalidArgument(f"cannot read labels from {p}: unknown extension {p.suffix or '(none)'!r}; use one of "
                              f"{', '.join(LABEL_FILE_EXTENSIONS)}")
    if not p.is_file():
        raise NotFound(f"no such file: {p}")
    if ext == ".parquet":
        columns, rows = _parquet_rows(p, (id_column, label_column))
    elif ext == ".csv":
        columns, rows = read_user_csv(p)
    else:
        columns, rows = read_json_records(p, jsonl=ext == ".jsonl", text_column=label_column)
    for role, name in (("--id-column", id_column), ("--label-column", label_column)):
        if name not in columns:
            raise InvalidArgument(f"{p} has no column {name!r} (asked for with {role}); its columns are: "
                                  f"{', '.join(repr(c) for c in columns) or '(none)'}")
    if not rows:
        raise InvalidArgument(f"{p} has no rows: nothing to register")
    return [row.get(id_column) for row in rows], [row.get(label_column) for row in rows]


def _parquet_rows(p: Path, wanted: tuple[str, str]) -> tuple[list[str], list[dict]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(p).names
        table = pq.read_table(p, columns=[c for c in dict.fromkeys(wanted) if c in names])
    except (pa.ArrowException, OSError) as exc:
        raise InvalidArgument(f"cannot read {p} as Parquet: {str(exc).strip().splitlines()[0][:300]}") from None
    return names, table.to_pylist()


def save_label_set(labels: LabelSet, name: str, directory: str | os.PathLike) -> str:
    """Write the set into `directory` (atomically; nothing if it is there already); its digest."""
    digest = label_set_digest(labels)
    target = Path(directory)
    if target.exists():
        return digest
    own = labels.codes if labels.kind == "categorical" else labels.values
    meta = {"digest": digest, "dataset_digest": labels.dataset_digest, "kind": labels.kind, "samples": labels.samples,
            "classes": labels.classes, "name": name, "source": labels.source}
    try:
        with atomic_directory(target) as staging:
            with open(staging / _NPZ, "wb") as f:
                np.savez(f, positions=labels.positions, labels=own)
            (staging / _META).write_text(json.dumps(meta, indent=1, sort_keys=True), encoding="utf-8")
    except FileExistsError:  # registered meanwhile: the folder is named by the same digest
        pass
    return digest


def load_label_set(directory: str | os.PathLike) -> tuple[LabelSet, str, str]:
    """(the set, its digest, the name it was first registered under) from its folder; DataLoss
    when the folder is incomplete or does not match its digest."""
    d = Path(directory)
    try:
        meta = json.loads((d / _META).read_text(encoding="utf-8"))
        with np.load(d / _NPZ, allow_pickle=False) as z:
            positions, own = z["positions"], z["labels"]
        categorical = meta["kind"] == "categorical"
        labels = LabelSet(meta["dataset_digest"], meta["kind"], int(meta["samples"]), positions,
                          codes=own if categorical else None, classes=meta["classes"],
                          values=None if categorical else own, source=meta.get("source") or {})
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as exc:
        raise DataLoss(f"the label set in {d} is unreadable ({type(exc).__name__}: {exc}): register it again") from None
    digest = label_set_digest(labels)
    if digest != meta.get("digest"):
        raise DataLoss(f"the label set in {d} does not match its digest ({digest[:12]} != "
                       f"{str(meta.get('digest'))[:12]}): its files are damaged; register it again")
    return labels, digest, meta.get("name", "")
