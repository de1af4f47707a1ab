"""Columns a user hands over (labels, groups, sample ids) made model-ready, and ``from_texts``.

Shared by ``from_texts`` (Python lists) and ``load_file`` (user files), so both read a column the
same way: labels that are all integers (or integer strings) are used as they are, other strings
become ints with ``label_names`` sorted; string groups become ids in order of first appearance.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from actstore.errors import InvalidArgument
from actstore.store.datasets.core import DatasetData

_INT_RE = re.compile(r"^\s*[+-]?\d+\s*$")


def _all_ints(values: Sequence[Any]) -> bool:
    """Whether every value is an integer (``bool`` is not) or a string that spells one."""
    return all(
        (isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)))
        or (isinstance(v, str) and _INT_RE.match(v))
        for v in values
    )


def labels_from_values(values: Sequence[Any], where: str) -> tuple[np.ndarray, list[str] | None]:
    """Integers (or integer-looking strings) -> those ints; other strings -> sorted names."""
    if _all_ints(values):
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


def groups_from_values(values: Sequence[Any], where: str) -> np.ndarray:
    """Integer group ids as they are; string group names -> ids in order of first appearance."""
    if _all_ints(values):
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


def ids_from_values(values: Sequence[Any], where: str) -> list[str]:
    """Non-empty strings or integers (``bool`` is not) -> string sample ids."""
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
        label_arr, names = labels_from_values(vals, "from_texts")
    group_arr = None
    if groups is not None:
        vals = groups.tolist() if isinstance(groups, np.ndarray) else list(groups)
        if len(vals) != n:
            raise InvalidArgument(f"{len(vals)} groups for {n} texts: give exactly one per text")
        group_arr = groups_from_values(vals, "from_texts")
    if sample_ids is None:
        ids = [f"row:{i}" for i in range(n)]
    else:
        ids = ids_from_values(list(sample_ids), "from_texts")
    return DatasetData(
        kind="text",
        texts=texts,
        labels=label_arr,
        label_names=names,
        sample_ids=ids,
        groups=group_arr,
        source={"from_texts": True},
    )
