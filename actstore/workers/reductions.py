"""A shard's reductions where its forward pass ran (on a GPU replica, on the GPU): layer sums,
finite extremes, NaN/Inf counts and the layer statistics, in float64 on the device, so only the
stored bytes and a few numbers a layer come to the host.

The same numbers `shard_writes.reduced_on_host` makes with numpy (a CPU replica's path), by the
same definitions: `LayerStats` (count, mean and M2 of the finite values, two passes; the row
norms' mean and M2, their non-finite values counted as 0), the finite min and max (NaN where a
layer has none) and the float64 sums of every stored number, NaN and Inf propagating. Summed in
another order, they agree with numpy's to float64 rounding (tests/workers/test_reductions.py).
"""

from __future__ import annotations

import numpy as np
import torch

from actstore.metrics.layer_stats import LayerStats

# the columns of a shard's reduced table, one row per layer; then its sums, (L+1, d)
COLUMNS = ("min", "max", "nan_count", "inf_count", *LayerStats.empty(0).to_dict())


def reduce_shard(part: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(L+1, len(COLUMNS)) and the (L+1, d) sums, float64 on ``part``'s device, of a shard's stored
    numbers ``part`` (L+1, rows, d); no synchronisation with the host."""
    x = part.to(torch.float64)
    sums = x.sum(dim=1)
    finite = torch.isfinite(x)
    count = finite.sum(dim=(1, 2)).to(torch.float64)
    seen = count > 0
    lows = torch.where(finite, x, torch.inf).amin(dim=(1, 2))
    highs = torch.where(finite, x, -torch.inf).amax(dim=(1, 2))
    zeroed = torch.where(finite, x, 0.0)
    mean = torch.where(seen, zeroed.sum(dim=(1, 2)) / count.clamp(min=1), 0.0)
    deviations = torch.where(finite, x - mean[:, None, None], 0.0)
    m2 = (deviations * deviations).sum(dim=(1, 2))
    norms = (zeroed * zeroed).sum(dim=2).sqrt()  # (L+1, rows)
    rows = norms.shape[1]
    norm_mean = norms.mean(dim=1) if rows else torch.zeros_like(count)
    norm_m2 = ((norms - norm_mean[:, None]) ** 2).sum(dim=1)
    table = torch.stack([
        torch.where(seen, lows, torch.nan), torch.where(seen, highs, torch.nan),
        torch.isnan(x).sum(dim=(1, 2)).to(torch.float64), torch.isinf(x).sum(dim=(1, 2)).to(torch.float64),
        count, mean, m2, torch.full_like(count, rows), norm_mean, norm_m2], dim=1)
    return table, sums


def reduced_values(table: np.ndarray) -> tuple[tuple[list, list], tuple[list, list], dict[str, list]]:
    """A shard's reduced table on the host as a `PreparedShard`'s extremes, counts and statistics."""
    columns = dict(zip(COLUMNS, table.T))
    extremes = columns["min"].tolist(), columns["max"].tolist()
    counts = columns["nan_count"].astype(np.int64).tolist(), columns["inf_count"].astype(np.int64).tolist()
    return extremes, counts, {name: columns[name].tolist() for name in COLUMNS[4:]}
