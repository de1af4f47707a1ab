"""Numeric helpers shared by the metric modules: dtype promotion and centering.

METRICS.md, "Numerics, for all metrics": center features before forming any product and
accumulate every product in float64, upcasting fp16/bf16 before any product.
"""

from __future__ import annotations

import numpy as np


def as_float64_matrix(values: np.ndarray, name: str) -> np.ndarray:
    """Return `values` as a 2-D float64 array (rows = samples), upcasting before any product.

    fp16 holds at most 65504, so one large coordinate overflows a product formed in fp16; the
    upcast happens here, before anything else touches the data. bf16 must arrive upcast already
    (numpy has no bf16).
    """
    array = np.asarray(values)
    if array.ndim != 2:
        raise ValueError(f"{name} must be a 2-D (samples x features) array, got {array.shape}")
    if array.dtype.kind not in "fiu":
        raise TypeError(f"{name} must hold real numbers, got dtype {array.dtype}")
    return array.astype(np.float64, copy=False)


def column_centered(matrix: np.ndarray) -> np.ndarray:
    """`Xc = X - 1 mean(X)^T`: the columns of a float64 matrix with their means removed."""
    return matrix - matrix.mean(axis=0)
