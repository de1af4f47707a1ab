"""Per-layer running statistics: merged shard by shard, they equal the float64 statistics of the
whole array computed directly, whatever the split and the order of merging."""

from __future__ import annotations

import numpy as np

from actstore.metrics.layer_stats import LayerStats


def _direct(x: np.ndarray) -> dict[str, list[float]]:
    x = x.astype(np.float64)
    norms = np.linalg.norm(x, axis=2)  # (rows, layers)
    return {"mean": x.mean(axis=(0, 2)).tolist(), "std": x.std(axis=(0, 2)).tolist(),
            "norm_mean": norms.mean(axis=0).tolist(), "norm_std": norms.std(axis=0).tolist()}


def test_merged_shards_equal_the_direct_statistics():
    rng = np.random.default_rng(0)
    scales = np.array([1, 10, 100, 1e4])[None, :, None]
    x = (rng.normal(size=(103, 4, 7)) * scales + 1e3).astype(np.float32)
    expected = _direct(x)
    for cuts in ([103], [50, 53], [1, 2, 100], [30, 30, 30, 13]):
        bounds = np.cumsum([0, *cuts])
        parts = [LayerStats.empty(4).update(x[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
        total = LayerStats.empty(4)
        for part in reversed(parts):  # any order
            total.merge(LayerStats.from_dict(part.to_dict()))  # through JSON-able dicts, as stored
        got = total.finalize()
        for name, values in expected.items():
            np.testing.assert_allclose(got[name], values, rtol=1e-10, err_msg=name)


def test_invariances_and_empty_layers():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(20, 2, 5))
    a, b = LayerStats.empty(2).update(x).finalize(), LayerStats.empty(2).update(x + 3.0).finalize()
    np.testing.assert_allclose(b["mean"], np.asarray(a["mean"]) + 3.0)
    np.testing.assert_allclose(b["std"], a["std"])  # a shift leaves the spread
    assert all(np.isnan(v).all() for v in LayerStats.empty(2).finalize().values())
    x[0, 0, 0] = np.nan  # non-finite values are left out, not averaged in
    got = LayerStats.empty(2).update(x).finalize()
    assert np.isfinite(got["mean"]).all() and np.isclose(got["mean"][0], np.nanmean(x[:, 0]))
