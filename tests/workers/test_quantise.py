"""One-byte coding (`store.format.quantised`, `workers.quantise`): torch and numpy give the same bits
for the same draws, every value lands on one of the two codes around it (a constant channel
exactly), the rounding is unbiased with each value's error independent of the others', the same
seed gives the same bits, and an int8 shard's reductions are of its decoded values, the numbers a
reader gets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from actstore.errors import FailedPrecondition
from actstore.metrics.layer_stats import LayerStats
from actstore.store.format import quantised
from actstore.workers.capture import prepare_shards
from actstore.workers.quantise import dequantise, quantise, rounding_draws


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


def _coded(exact: np.ndarray, seed: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    values = torch.from_numpy(exact).to(device)
    draws = rounding_draws(values.shape, seed, values.device)
    return (*quantise(values, draws), draws)


@pytest.mark.parametrize("device", _devices())
def test_torch_codes_equal_numpys_bit_for_bit_for_the_same_draws(device):
    exact = _exact()
    codes, state, draws = _coded(exact, 7, device)
    expected_state = quantised.decoding_state(exact.min(axis=1), exact.max(axis=1))
    expected_codes = quantised.encode(exact, expected_state, draws.cpu().numpy())
    np.testing.assert_array_equal(codes.cpu().numpy(), expected_codes)
    np.testing.assert_array_equal(state.cpu().numpy(), expected_state)
    np.testing.assert_array_equal(dequantise(codes, state).cpu().numpy(), quantised.decode(expected_codes,
                                                                                           expected_state))


def test_a_seed_gives_the_same_bits_and_another_seed_other_ones():
    exact = _exact()
    first, again, other = (_coded(exact, seed)[0].numpy() for seed in (3, 3, 4))
    np.testing.assert_array_equal(first, again)
    assert (first != other).mean() > 0.2
    seeds = {quantised.rounding_seed(key, shard) for key in ("a" * 64, "b" * 64) for shard in range(50)}
    assert len(seeds) == 100 and all(0 <= seed < 2**63 for seed in seeds)
    assert quantised.rounding_seed("a" * 64, 3) == quantised.rounding_seed("a" * 64, 3)


def test_every_value_lands_on_a_code_around_it_and_constants_are_exact():
    exact = _exact(1)
    codes, state = quantised.quantise(exact, seed=1)
    decoded = quantised.decode(codes, state)
    step = state[0][:, None]
    # within one step (the codes on either side), plus the float32 rounding of the decode's multiply and add
    slack = np.spacing(np.maximum(np.abs(exact), np.abs(state[1][:, None]))) * 2
    assert np.all(np.abs(decoded.astype(np.float64) - exact) <= step + slack)
    scaled = (exact.astype(np.float64) - state[1][:, None]) / np.where(step > 0, step, 1)
    moving = np.broadcast_to(step > 0, exact.shape)
    assert np.all((codes[moving] == np.floor(scaled[moving])) | (codes[moving] == np.ceil(scaled[moving])))
    assert codes.min() == -128 and codes.max() == 127
    np.testing.assert_array_equal(decoded[2, :, 5], exact[2, :, 5])
    np.testing.assert_array_equal(decoded[3, :, 6], exact[3, :, 6])
    assert state[0][2, 5] == 0 and (codes[2, :, 5] == 0).all()


def test_the_rounding_is_unbiased_and_each_values_error_independent_of_the_others():
    """Every value of one channel coded 4,000 times (a seed each): the mean decoded value is the
    exact one within 4 standard errors, the variance is p(1 - p) step^2 (p the value's fraction of a
    step), and the errors of two values are uncorrelated. Round to nearest fails all three."""
    rng = np.random.default_rng(5)
    exact = rng.uniform(-3, 5, (1, 64, 6)).astype(np.float32)
    exact[0, 0], exact[0, 1] = -3.0, 5.0  # fix the range, so the state is the same for every seed
    decoded = np.stack([quantised.decode(*quantised.quantise(exact, seed))[0] for seed in range(4000)])
    step = quantised.decoding_state(exact.min(axis=1), exact.max(axis=1))[0][0].astype(np.float64)
    errors = decoded.astype(np.float64) - exact[0]
    fraction = (exact[0] - (-3.0)) / step % 1.0
    variance = fraction * (1 - fraction) * step**2
    standard_error = np.sqrt(variance / len(decoded)) + 1e-6
    assert np.all(np.abs(errors.mean(axis=0)) <= 4 * standard_error)
    assert np.allclose(errors.var(axis=0), variance, rtol=0.15, atol=0.01 * step.max() ** 2)
    flat = errors.reshape(len(errors), -1)
    moving = flat.std(axis=0) > 0
    correlation = np.corrcoef(flat[:, moving].T)
    assert np.abs(correlation[~np.eye(len(correlation), dtype=bool)]).max() < 0.1  # 4000 draws: |r| ~ 0.016


def test_decode_takes_codes_laid_out_rows_first():
    exact = _exact(2, rows=40)
    codes, state = quantised.quantise(exact, seed=2)
    np.testing.assert_array_equal(quantised.decode(codes.transpose(1, 0, 2), state, layer_axis=1),
                                  quantised.decode(codes, state).transpose(1, 0, 2))


def test_an_int8_shard_is_coded_where_the_forward_ran_and_reduced_from_its_decoded_values():
    exact = _exact(3, rows=70)
    values = torch.from_numpy(exact.transpose(1, 0, 2).copy())  # (rows, L+1, d), as a capture holds them
    bounds = [(0, 32), (32, 64), (64, 70)]
    prepared = prepare_shards(values, bounds, "int8", seeds=[11, 12, 13])
    for (lo, hi), shard, seed in zip(bounds, prepared, [11, 12, 13]):
        codes, state, _ = _coded(np.ascontiguousarray(exact[:, lo:hi]), seed)
        codes, state = codes.numpy(), state.numpy()
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
        prepare_shards(torch.from_numpy(exact), [(0, 20)], "int8", seeds=[0])
