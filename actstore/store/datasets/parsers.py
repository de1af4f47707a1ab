"""User files as datasets: ``load_file`` reads ``.csv``, ``.jsonl``, ``.json``, ``.npz``, and through
``tables`` ``.parquet``, ``.arrow`` and Hugging Face ``save_to_disk`` folders.

A bad user file raises ``InvalidArgument`` (it is the request that is wrong), a missing one
``NotFound``. Label, group and id columns are read by ``columns``, as ``from_texts`` reads them.
"""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from actstore.errors import InvalidArgument, NotFound
from actstore.store.datasets.columns import (
    groups_from_values,
    ids_from_values,
    labels_from_values,
)
from actstore.store.datasets.core import DatasetData
from actstore.store.datasets.tables import TABLE_EXTENSIONS, is_dataset_folder, label_names, read_table

FILE_EXTENSIONS = (".csv", ".jsonl", ".json", ".npz", *TABLE_EXTENSIONS)
_TOO_DEEP = "{}: the JSON is nested too deeply to read: a dataset is a list of flat records or strings"


def load_file(
    path: str | os.PathLike,
    *,
    text_column: str = "text",
    label_column: str | None = None,
    id_column: str | None = None,
    group_column: str | None = None,
    split: str | None = None,
) -> DatasetData:
    """Load a dataset from a user file (or a Hugging Face dataset folder).

    - ``.csv`` (header row; every cell read as a string, nothing turned into NaN),
      ``.jsonl`` (one JSON object, or one string, per line; blank lines skipped),
      ``.json`` (a list of objects, or a list of strings): a text dataset from ``text_column``,
      labels from ``label_column``, ids from ``id_column``, groups from ``group_column``.
    - ``.npz`` (no pickles): ``images`` or ``x`` ((n, C, H, W) or (n, H, W), uint8 or float),
      or ``texts`` (a string array); optional ``labels`` / ``y`` (or ``label_column``),
      ``sample_ids`` (or ``id_column``), ``groups`` (or ``group_column``), ``label_names``.
    - ``.parquet``, ``.arrow`` (a ``datasets`` split file) or a ``save_to_disk`` folder (``split``
      picks a split of a DatasetDict): the columns as for CSV; a ``ClassLabel`` label column keeps
      its class names (``tables``).

    Labels that are all integers (or integer strings) are used as they are; any other strings
    become ints with ``label_names`` sorted. Ids default to ``"row:<i>"`` (the row's position).
    """
    p = Path(path).expanduser()
    ext = p.suffix.lower()
    folder = is_dataset_folder(p)
    if ext not in FILE_EXTENSIONS and not folder:
        raise InvalidArgument(
            f"cannot load {p}: unknown extension {p.suffix or '(none)'!r}; "
            f"use one of {', '.join(FILE_EXTENSIONS)} or a Hugging Face save_to_disk folder"
        )
    if not p.exists():
        raise NotFound(f"no such file: {p}")
    if not p.is_file() and not folder:
        raise InvalidArgument(f"{p} is not a regular file (nor a Hugging Face save_to_disk folder)")
    if split is not None and not (folder and (p / "dataset_dict.json").is_file()):
        raise InvalidArgument(f"{p} has no splits: omit split (it picks a split of a DatasetDict folder or a builtin)")
    source: dict[str, Any] = {"file": str(p.resolve()), **({"split": split} if split is not None else {})}
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
    if folder or ext in TABLE_EXTENSIONS:
        columns, rows, features = read_table(p, opts, split)
        data = _records_to_dataset(p, columns, rows, text_column, label_column, id_column, group_column, source)
        names = label_names(features, label_column)
        return data if names is None else replace(data, label_names=names)
    if ext == ".csv":
        columns, rows = read_user_csv(p)
    else:
        columns, rows = read_json_records(p, jsonl=ext == ".jsonl", text_column=text_column)
    return _records_to_dataset(
        p, columns, rows, text_column, label_column, id_column, group_column, source
    )


def read_csv_strings(path: Path):
    """A CSV file with a header row as a pandas DataFrame, every cell a string (none made NaN)."""
    import pandas as pd

    return pd.read_csv(path, dtype=str, keep_default_na=False, na_filter=False)


def read_user_csv(p: Path) -> tuple[list[str], list[dict]]:
    import pandas as pd

    try:
        df = read_csv_strings(p)
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


def read_json_records(p: Path, *, jsonl: bool, text_column: str) -> tuple[list[str], list[dict]]:
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
            except RecursionError:
                raise InvalidArgument(_TOO_DEEP.format(f"{p}, line {lineno}")) from None
    else:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise InvalidArgument(f"{p}: not valid JSON ({e.msg}, line {e.lineno})") from None
        except RecursionError:
            raise InvalidArgument(_TOO_DEEP.format(p)) from None
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
        labels, names = labels_from_values(column(label_column, "label_column"), str(p))
    ids = [f"row:{i}" for i in range(len(rows))]
    if id_column is not None:
        ids = ids_from_values(column(id_column, "id_column"), str(p))
    groups = None
    if group_column is not None:
        groups = groups_from_values(column(group_column, "group_column"), str(p))
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
            labels, names = labels_from_values(lab.tolist(), str(p))
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
            groups = groups_from_values(g.tolist(), str(p))
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
