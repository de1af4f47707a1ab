"""What every similarity metric checks first: the same samples, paired matrices, blocks.

METRICS.md, "Similarity between two representations (same n samples, same order)": the sample ids
of both sides must be identical and in the same order, otherwise the query fails with a clear
error naming the first mismatch; it never silently aligns or truncates. Unbiased HSIC (Song et al.
2007) divides by `n(n-3)`, hence `MIN_HSIC_SAMPLES` = 4.

A "block" is one layer of one run: a matrix with one row per sample. The streaming accumulators
take several blocks side by side, the rows of one chunk `z_i = concat_b(block_b[i])`; this module
validates their widths and shapes and sums over their column ranges. Everything is converted to
float64 (or kept as float16/32 where the caller upcasts before any product: METRICS.md numerics).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .._numerics import as_float64_matrix

MIN_HSIC_SAMPLES = 4
FLOAT64_BYTES = 8


def check_same_samples(ids_a: Sequence | np.ndarray, ids_b: Sequence | np.ndarray) -> None:
    """Raise ValueError unless both id sequences are identical and in the same order.

    METRICS.md: the sample ids of both sides must be identical and in the same order, otherwise
    the query fails naming the first mismatch; it never silently aligns or truncates. Ids are
    compared element-wise as numpy arrays.
    """
    first, second = np.asarray(ids_a), np.asarray(ids_b)
    if first.ndim != 1 or second.ndim != 1:
        raise ValueError(
            f"sample ids must be 1-D sequences, got shapes {first.shape} and {second.shape}"
        )
    common = min(len(first), len(second))
    mismatches = np.flatnonzero(first[:common] != second[:common])
    if mismatches.size:
        position = int(mismatches[0])
        raise ValueError(
            f"sample ids differ at position {position}: {first[position : position + 1].item()!r} "
            f"(first) vs {second[position : position + 1].item()!r} (second); similarity needs "
            "the same samples in the same order and never aligns them"
        )
    if len(first) != len(second):
        raise ValueError(
            f"sample id sequences differ in length: {len(first)} (first) vs {len(second)} "
            f"(second), identical over the first {common} positions; similarity never truncates"
        )


def paired(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both representations as float64 matrices, checked to have the same number of rows (>= 1)."""
    first, second = as_float64_matrix(x, "x"), as_float64_matrix(y, "y")
    if len(first) != len(second):
        raise ValueError(f"x has {len(first)} samples but y has {len(second)}; they must match")
    if len(first) == 0:
        raise ValueError("x and y hold no samples")
    return first, second


def require_hsic_samples(n: int) -> None:
    """Raise ValueError when n is too small for unbiased HSIC (n < 4)."""
    if n < MIN_HSIC_SAMPLES:
        raise ValueError(
            f"unbiased HSIC needs n >= {MIN_HSIC_SAMPLES} samples (it divides by n(n-3)), got n={n}"
        )


def validated_widths(block_widths: Sequence[int]) -> tuple[int, ...]:
    """The block widths as a tuple of ints, checked to be non-empty and >= 1."""
    widths = tuple(int(width) for width in block_widths)
    if not widths or min(widths) < 1:
        raise ValueError(f"block_widths must be a non-empty sequence of widths >= 1, got {widths}")
    return widths


_EXACT_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def _as_exact_matrix(values: np.ndarray, name: str) -> np.ndarray:
    """`values` as a 2-D float16/32/64 matrix, keeping float16 and float32 as they are (the
    caller upcasts before any product); other real dtypes become float64."""
    array = np.asarray(values)
    if array.dtype in _EXACT_FLOATS and array.ndim == 2:
        return array
    return as_float64_matrix(array, name)


def validated_blocks(
    blocks: Sequence[np.ndarray], widths: tuple[int, ...], upcast: bool = True
) -> list[np.ndarray]:
    """One chunk's blocks as float64 matrices (or, with `upcast=False`, in their own float16/32
    dtype), checked against the widths and for equal rows."""
    if len(blocks) != len(widths):
        raise ValueError(f"expected {len(widths)} blocks, got {len(blocks)}")
    convert = as_float64_matrix if upcast else _as_exact_matrix
    matrices = [convert(block, f"blocks[{b}]") for b, block in enumerate(blocks)]
    shapes = [matrix.shape for matrix in matrices]
    expected = [(shapes[0][0], width) for width in widths]
    if shapes != expected:
        raise ValueError(
            f"block shapes {shapes} do not match the rows of block 0 and the widths {widths}"
        )
    return matrices


def block_starts(widths: tuple[int, ...]) -> np.ndarray:
    """The first column of each block in the stacked rows."""
    return np.concatenate(([0], np.cumsum(widths)[:-1]))


def block_sums(matrix: np.ndarray, widths: tuple[int, ...], axis: int) -> np.ndarray:
    """Sums of `matrix` over the column ranges of each block along `axis`."""
    return np.add.reduceat(matrix, block_starts(widths), axis=axis)
