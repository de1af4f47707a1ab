"""Listings and results as pandas DataFrames (pandas is optional: `pip install 'actstore[readers]'`).

One API throughout: a listing (`client.runs()`, `models()`, `datasets()`, `jobs()`) is a `Listing`,
a list with `to_pandas()` (one row per item, one column per field); a matrix result's
`to_pandas()` is long format, one row per layer pair (`layer_a`, `layer_b`, `value`; the
cross-model matrix adds `run_a` and `run_b`), and a per-layer result's is (`layer`, `value`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np

from actstore.client.display import table
from actstore.errors import FailedPrecondition

T = TypeVar("T")


def pandas():
    try:
        import pandas
    except ImportError:
        raise FailedPrecondition("to_pandas() needs pandas: pip install 'actstore[readers]' (or pandas)") from None
    return pandas


class Listing(list[T]):
    """A list of records (`RunInfo`, `ModelInfo`, ...) that also becomes a DataFrame, and shows
    itself in Jupyter as a table."""

    def to_pandas(self):
        return pandas().DataFrame([dataclasses.asdict(item) for item in self])

    def _repr_html_(self) -> str:
        return table(list(self))


def matrix_frame(values: np.ndarray, layers_a: Sequence[int], layers_b: Sequence[int], **columns: Any):
    """Long format of a len(layers_a) x len(layers_b) matrix: layer_a, layer_b, value (plus
    `columns`: arrays of the same shape, or scalars)."""
    a, b = np.meshgrid(np.asarray(layers_a), np.asarray(layers_b), indexing="ij")
    data = {"layer_a": a.ravel(), "layer_b": b.ravel(), "value": np.asarray(values).ravel()}
    data.update({name: np.broadcast_to(column, np.shape(values)).ravel() for name, column in columns.items()})
    return pandas().DataFrame(data)


def layer_frame(values: np.ndarray, layers: Sequence[int]):
    return pandas().DataFrame({"layer": np.asarray(layers), "value": np.asarray(values)})
