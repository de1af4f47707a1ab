"""One-byte coding (`store.format.quantised`, `workers.quantise`): torch and numpy give the same bits,
every value is within half a step of the exact one (a constant channel exactly), and an int8
shard's reductions are of its decoded values, the numbers a reader gets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from actstore.errors import FailedPrecondition
from actstore.metrics.layer_stats import LayerStats
from actstore.store.format import quantised
from actstore.workers.capture import prepare_shards
from actstore.workers.quantise import dequantise, quantise


def _exact(seed: int = 0, rows: int = 300) -> np.ndarray:
    """(L+1, rows, d) float32 with channels of very different scales and offsets, a massive outlier
    row in one channel, a constant channel and one of a single repeated tiny value."""
    rng = np.random.default_rng(seed)
    scales = rng.uniform(0.01, 100, 48).astype(np.float32)
    values = (rng.standard_normal((5, rows, 48)) * scales + rng.uniform(-500, 500, 48)).astype(np.float32)
    values[1, 7, 3] = 3e4  # a massive activation
    values[2, :, 5] = 3.25
    values[3, :, 6] = -1e-30
    return values


def _devices() -> list[str]:
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", _devices())
def test_torch_codes_equal_numpys_bit_for_bit(device):
    exact = _exact()
    codes, state = quantise(torch.from_numpy(exact).to(device))
    expected_codes, expected_state = quantised.quantise(exact)
    np.testing.assert_array_equal(codes.cpu().numpy(), expected_codes)
    np.testing.assert_array_equal(state.cpu().numpy(), expected_state)
    np.testing.assert_array_equal(dequantise(codes, state).cpu().numpy(), quantised.decode(expected_codes,
                                                                                           expected_state))


def test_every_value_is_within_half_a_step_and_constants_are_exact():
    exact = _exact(1)
    codes, state = quantised.quantise(exact)
    decoded = quantised.decode(codes, state)
    step = state[0][:, None]
    # half a step, plus the float32 rounding of the decode's multiply and add
    slack = np.spacing(np.maximum(np.abs(exact), np.abs(state[1][:, None]))) * 2
    assert np.all(np.abs(decoded.astype(np.float64) - exact) <= step / 2 + slack)
    assert codes.min() == -128 and codes.max() == 127
    np.testing.assert_array_equal(decoded[2, :, 5], exact[2, :, 5])
    np.testing.assert_array_equal(decoded[3, :, 6], exact[3, :, 6])
    assert state[0][2, 5] == 0 and (codes[2, :, 5] == 0).all()


def test_decode_takes_codes_laid_out_rows_first():
    exact = _exact(2, rows=40)
    codes, state = quantised.quantise(exact)
    np.testing.assert_array_equal(quantised.decode(codes.transpose(1, 0, 2), state, layer_axis=1),
                                  quantised.decode(codes, state).transpose(1, 0, 2))


def test_an_int8_shard_is_coded_where_the_forward_ran_and_reduced_from_its_decoded_values():
    exact = _exact(3, rows=70)
    values = torch.from_numpy(exact.transpose(1, 0, 2).copy())  # (rows, L+1, d), as a capture holds them
    bounds = [(0, 32), (32, 64), (64, 70)]
    prepared = prepare_shards(values, bounds, "int8")
    for (lo, hi), shard in zip(bounds, prepared):
        codes, state = quantised.quantise(exact[:, lo:hi])
        np.testing.assert_array_equal(shard.layers, codes)
        np.testing.assert_array_equal(shard.decoding, state)
        numbers = quantised.decode(codes, state)
        np.testing.assert_array_equal(shard.sums, numbers.sum(axis=1, dtype=np.float64))
        assert shard.extremes == (numbers.min(axis=(1, 2)).tolist(), numbers.max(axis=(1, 2)).tolist())
        assert LayerStats.from_dict(shard.stats).finalize() == \
            LayerStats.empty(5).update(numbers.transpose(1, 0, 2)).finalize()


def test_nan_or_inf_in_the_exact_values_is_refused_naming_the_layers():
    exact = _exact(4, rows=20).transpose(1, 0, 2).copy()
    exact[3, 2, 0] = np.nan
    exact[5, 4, 1] = np.inf
    with pytest.raises(FailedPrecondition, match=r"layers 2, 4 of this model's activations hold NaN or Inf.*"
                                                 r"--dtype float32"):
        prepare_shards(torch.from_numpy(exact), [(0, 20)], "int8")
