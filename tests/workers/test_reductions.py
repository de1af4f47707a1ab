"""A shard's reductions on the device (`workers.reductions`, what a GPU replica runs; here on the
CPU) against the host's numpy path (`shard_writes.reduced_on_host`, a CPU replica's) and against
an independent float64 formula: every storage dtype, NaN, Inf, a layer with nothing finite, a
large mean."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from actstore.metrics.layer_stats import LayerStats
from actstore.workers.capture import storage_array
from actstore.workers.reductions import reduce_shard, reduced_values
from actstore.workers.shard_writes import reduced_on_host, stored_numbers

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def _part(dtype: str) -> torch.Tensor:
    rng = np.random.default_rng(5)
    values = torch.from_numpy(rng.standard_normal((5, 33, 7)).astype(np.float32) * 3)
    values[1, 4, 2] = float("nan")
    values[2, 9, 3] = float("inf")
    values[2, 10, 1] = -float("inf")
    values[3] = float("nan")  # nothing finite
    values[4] += 1000.0  # a mean far from zero: the deviations' pass matters
    values[0, 0, 0] = 1e6  # Inf in float16
    return values.to(DTYPES[dtype])


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_device_reductions_are_the_hosts(dtype):
    part = _part(dtype)
    table, sums = reduce_shard(part)
    extremes, counts, stats = reduced_values(table.numpy())
    layers = storage_array(part)
    with np.errstate(invalid="ignore"):  # Inf - Inf: NaN, as the device's
        host = reduced_on_host(layers, stored_numbers(layers).sum(axis=1, dtype=np.float64))
    np.testing.assert_array_equal(sums.numpy(), host.sums)
    np.testing.assert_array_equal(extremes, host.extremes)
    assert counts == host.counts
    for name, values in stats.items():
        np.testing.assert_allclose(values, host.stats[name], rtol=1e-12, atol=1e-300, err_msg=name)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_device_reductions_against_float64_numpy(dtype):
    """The definitions, written out: finite extremes (NaN where none), counts, and the finite
    values' mean and population std, the row norms' mean and std with non-finite values as 0."""
    part = _part(dtype)
    numbers = part.to(torch.float64).numpy()
    table, _ = reduce_shard(part)
    (lows, highs), (nans, infs), stats = reduced_values(table.numpy())
    summary = LayerStats.from_dict(stats).finalize()
    for layer, x in enumerate(numbers):
        finite = np.isfinite(x)
        kept = x[finite]
        assert (nans[layer], infs[layer]) == (np.isnan(x).sum(), np.isinf(x).sum())
        if not kept.size:
            assert np.isnan([lows[layer], highs[layer], summary["mean"][layer], summary["std"][layer]]).all()
            continue
        assert (lows[layer], highs[layer]) == (kept.min(), kept.max())
        assert summary["mean"][layer] == pytest.approx(kept.mean(), rel=1e-12)
        assert summary["std"][layer] == pytest.approx(kept.std(), rel=1e-10)
        norms = np.sqrt((np.where(finite, x, 0.0) ** 2).sum(axis=1))
        assert summary["norm_mean"][layer] == pytest.approx(norms.mean(), rel=1e-12)
        assert summary["norm_std"][layer] == pytest.approx(norms.std(), rel=1e-10)
