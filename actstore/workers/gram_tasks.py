"""The map side of the Gram-space matrix job: one tile of the n x n sample space per task.

A tile is a pair of row panels `R <= C` (`server/gram_matrix.py`). The task reads R's rows of
every block once and holds them as stored, then streams C one shard at a time (the square's own
shards come from R), and sums `similarity.gram_tiles.rectangle_products` over the rectangles on or
above the diagonal. Its memory is R's rows, one shard of C and one piece of entries, whatever n is;
its process hands large freed buffers back to the OS at once (`heap.unmap_large_frees`).
"""

from __future__ import annotations

import numpy as np

from actstore.metrics.similarity.gram_tiles import rectangle_products
from actstore.store.handle import StoreHandle
from actstore.workers.heap import unmap_large_frees


def _read(arrays, sources: list[tuple[str, list[int]]], start: int, stop: int) -> list[np.ndarray]:
    """Rows [start, stop) of every block, in the job's block order, as stored (float16 stays)."""
    return [block for run_key, layers in sources for block in arrays.read_layers(run_key, layers, start, stop)]


def gram_tile(store: StoreHandle, sources: list[tuple[str, list[int]]], rows: tuple[int, int],
              cols: tuple[int, int], shard_rows: int, means: list[np.ndarray],
              piece_rows: int) -> tuple[np.ndarray, np.ndarray | None]:
    """`(sum of <K_b, K_b'>_F over the tile's entries on or above the diagonal, each entry strictly
    above it counted twice; diag(K_b) over R when the tile is a square, else None)`. The products run on the host
    (numpy/BLAS)."""
    unmap_large_frees()
    arrays = store.open()
    (r0, r1), (c0, c1) = rows, cols
    panel = _read(arrays, sources, r0, r1)
    total = np.zeros((len(panel), len(panel)))
    diagonal = np.empty((len(panel), r1 - r0)) if rows == cols else None
    for first in range(c0, c1, shard_rows):
        last = min(first + shard_rows, c1)
        inside = r0 <= first < r1
        chunk = [block[first - r0: last - r0] for block in panel] if inside else _read(arrays, sources, first, last)
        above = min(r1, first) - r0  # rows of R before the chunk: their entries are strictly above
        if above > 0:
            total += 2 * rectangle_products([block[:above] for block in panel], chunk, means, piece_rows)[0]
        if inside:
            square, diagonal[:, first - r0: last - r0] = rectangle_products(chunk, None, means, piece_rows)
            total += square
    return total, diagonal
