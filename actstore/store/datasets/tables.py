"""Columnar user files as datasets: Parquet, Arrow and Hugging Face ``datasets`` folders.

- ``.parquet``: read with pyarrow (only the columns asked for);
- ``.arrow``: one split file as ``datasets`` writes it (the Arrow IPC stream), opened with
  ``datasets.Dataset.from_file`` (memory-mapped);
- a folder written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk`` (then ``split``
  picks the split; a folder of one split needs none), opened with ``datasets.load_from_disk``.

Every one becomes the same rows the CSV and JSON readers make, so the columns are read by one
path (``parsers.records_to_dataset``): the text column must hold strings, labels integers or
strings, ids strings or integers. A ``ClassLabel`` label column (Hugging Face's named classes)
keeps its class names as ``label_names``. Image columns are not read: a Parquet/Arrow dataset is a
text dataset (image datasets come as ``.npz``). A bad file is ``InvalidArgument``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from actstore.errors import InvalidArgument

TABLE_EXTENSIONS = (".parquet", ".arrow")
_ROLES = ("text_column", "label_column", "id_column", "group_column")
# the arrow types each role may hold, by pyarrow.types predicate name
_ROLE_TYPES = {
    "text_column": ("is_string", "is_large_string", "is_string_view"),
    "label_column": ("is_integer", "is_string", "is_large_string", "is_string_view"),
    "id_column": ("is_integer", "is_string", "is_large_string", "is_string_view"),
    "group_column": ("is_integer", "is_string", "is_large_string", "is_string_view"),
}
_ROLE_WANTS = {"text_column": "text (strings)", "label_column": "integers or strings",
               "id_column": "strings or integers", "group_column": "integers or strings"}


def is_dataset_folder(p: Path) -> bool:
    """Whether ``p`` is a folder ``save_to_disk`` wrote (a Dataset or a DatasetDict)."""
    return p.is_dir() and ((p / "state.json").is_file() or (p / "dataset_dict.json").is_file())


def read_table(p: Path, columns: dict[str, str | None], split: str | None) -> tuple[list[str], list[dict], Any]:
    """(every column name, the rows of the asked-for columns, the Hugging Face features or None)
    of a Parquet file, an Arrow split file or a ``save_to_disk`` folder. ``columns`` maps each
    role (text_column, ...) to a column name or None."""
    if p.suffix.lower() == ".parquet":
        table, features = _parquet(p, columns)
    else:
        dataset = _hf_dataset(p, split)
        features = dataset.features
        _check_roles(p, dataset.data.table.schema, columns)
        wanted = list(dict.fromkeys(c for c in columns.values() if c))
        table = dataset.select_columns(wanted).with_format("arrow")[:]
    names = list(features) if features is not None else table.column_names
    if table.num_rows == 0:
        raise InvalidArgument(f"dataset is empty: {p} has no rows")
    return names, table.to_pylist(), features


def label_names(features: Any, label_column: str | None) -> list[str] | None:
    """The class names of a ``ClassLabel`` label column, else None."""
    if features is None or label_column is None:
        return None
    from datasets import ClassLabel

    feature = features.get(label_column)
    return list(feature.names) if isinstance(feature, ClassLabel) else None


def _parquet(p: Path, columns: dict[str, str | None]):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(p)
        _check_roles(p, schema, columns)
        wanted = list(dict.fromkeys(c for c in columns.values() if c))
        table = pq.read_table(p, columns=wanted)
    except (pa.ArrowException, OSError) as e:
        raise InvalidArgument(f"cannot read {p} as Parquet: {_first_line(e)}") from None
    return table, _features(schema)


def _features(schema):
    """The Hugging Face features a file written by ``datasets`` carries in its schema, else None."""
    if not schema.metadata or b"huggingface" not in schema.metadata:
        return None
    from datasets import Features

    try:
        return Features.from_arrow_schema(schema)
    except (ValueError, TypeError, KeyError):
        return None  # metadata we cannot read: the plain arrow columns still are


def _hf_dataset(p: Path, split: str | None):
    import datasets
    import pyarrow as pa

    try:
        if p.is_dir():
            loaded = datasets.load_from_disk(str(p))
        else:
            loaded = datasets.Dataset.from_file(str(p))
    except (pa.ArrowException, OSError, ValueError, KeyError, TypeError) as e:
        what = "a Hugging Face dataset folder (save_to_disk)" if p.is_dir() else "an Arrow split file"
        raise InvalidArgument(f"cannot read {p} as {what}: {_first_line(e)}") from None
    if isinstance(loaded, datasets.DatasetDict):
        splits = ", ".join(loaded) or "(none)"
        if split is None and len(loaded) != 1:
            raise InvalidArgument(f"{p} holds the splits {splits}: pick one with split (--split)")
        if split is not None and split not in loaded:
            raise InvalidArgument(f"{p} has no split {split!r}; its splits are {splits}")
        loaded = loaded[split if split is not None else next(iter(loaded))]
    return loaded


def _check_roles(p: Path, schema, columns: dict[str, str | None]) -> None:
    import pyarrow.types as types

    names = schema.names
    for role in _ROLES:
        name = columns.get(role)
        if name is None:
            continue
        if name not in names:
            raise InvalidArgument(f"{p} has no column {name!r} (asked for as the {role}); its columns are: "
                                  f"{', '.join(repr(c) for c in names) or '(none)'}")
        kind = schema.field(name).type
        if not any(getattr(types, check)(kind) for check in _ROLE_TYPES[role]):
            raise InvalidArgument(f"{p}: column {name!r} (the {role}) holds {kind}, not {_ROLE_WANTS[role]}: "
                                  f"name another column with --{role.replace('_', '-')}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
