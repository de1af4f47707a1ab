"""A new run's layout: a token-level run's shards sized for the store (`token_shard_rows`)."""

from __future__ import annotations

import pytest

from actstore.store.array_store import (
    MIN_GROWN_SHARE,
    MIN_SHARDS_A_RUN,
    SHARD_ROW_STEP,
    RunLayout,
    balanced_shard_rows,
    token_shard_rows,
)


@pytest.mark.parametrize("row_bytes", [7 * 384 * 2, 13 * 768 * 2, 33 * 4096 * 2, 4 * 32 * 2])
@pytest.mark.parametrize("rows", [300, 20_000, 202_298, 5_000_000])
@pytest.mark.parametrize("shard_mb", [16.0, 64.0])
def test_token_shards_are_as_few_as_the_largest_multiple_within_the_size_and_the_run_gives_and_even(
        row_bytes, rows, shard_mb):
    shard_rows = token_shard_rows(256, shard_mb, row_bytes, rows)
    fitting = min(int(shard_mb * 1e6) // row_bytes, rows // MIN_SHARDS_A_RUN) // 256 * 256
    if fitting > 256 and fitting * row_bytes >= MIN_GROWN_SHARE * shard_mb * 1e6:  # grown
        assert (fitting + 256) * row_bytes > shard_mb * 1e6 or fitting + 256 > rows // MIN_SHARDS_A_RUN
        # within both bounds, as few shards as `fitting` rows make, and the padding under a step a shard
        assert shard_rows * row_bytes <= shard_mb * 1e6 and shard_rows <= rows // MIN_SHARDS_A_RUN
        shards = -(-rows // shard_rows)
        assert shards == -(-rows // fitting) and shard_rows % SHARD_ROW_STEP == 0
        assert shards * shard_rows - rows < SHARD_ROW_STEP * shards
    else:  # kept: growing would not reach the least grown size within the bounds
        assert shard_rows == 256


def test_minilm_on_the_review_set_gets_objects_of_about_15_mb():
    layout = RunLayout.new(7500, 202_298, 7, 384, "float16", "tokens", 256, 16.0)
    assert layout.shard_rows == 2812 and layout.num_shards == 72
    assert 14e6 < layout.shard_rows * 7 * 384 * 2 <= 16e6


def test_pooled_runs_and_a_zero_size_keep_the_row_setting():
    assert RunLayout.new(100_000, 100_000, 7, 384, "float16", "mean", 256, 16.0).shard_rows == 256
    assert RunLayout.new(7500, 202_298, 7, 384, "float16", "tokens", 256, 0.0).shard_rows == 256
    # a small run keeps its many small shards (as tests lay theirs out): 4,800 tokens of a tiny model
    assert RunLayout.new(240, 4_800, 4, 32, "float16", "tokens", 32, 16.0).shard_rows == 32
    # a mid-sized one grows as far as its 16 shards allow: 30,000 MiniLM tokens, 10 MB objects (17 shards of
    # 1,792 rows at most, balanced to 1,768)
    assert RunLayout.new(1_100, 30_000, 7, 384, "float16", "tokens", 256, 16.0).shard_rows == 1768


def test_an_int8_pooled_run_holds_up_to_twice_the_rows_a_shard_balanced():
    """The bytes of a float16 shard: half the bytes per value of the sums and scales each shard carries,
    and the rows spread evenly over as many shards (no padded last shard)."""
    for dtype, rows in (("float16", 256), ("float32", 256), ("bfloat16", 256), ("int8", 500)):
        assert RunLayout.new(5000, 5000, 7, 384, dtype, "mean", 256, 16.0).shard_rows == rows
    assert RunLayout.new(5120, 5120, 7, 384, "int8", "mean", 256, 16.0).shard_rows == 512
    assert RunLayout.new(2000, 2000, 31, 576, "int8", "last", 256, 16.0).shard_rows == 500  # 4 x 500: no padding
    tokens = RunLayout.new(100, 200_000, 7, 384, "int8", "tokens", 256, 16.0)
    assert tokens.shard_rows % SHARD_ROW_STEP == 0 and tokens.shard_rows * 7 * 384 <= 16e6


@pytest.mark.parametrize("rows", [1, 3, 500, 2000, 2049, 53_862, 1_000_003])
@pytest.mark.parametrize("most", [4, 512, 3328])
def test_balanced_shards_are_as_few_and_pad_less_than_a_step_each(rows, most):
    balanced = balanced_shard_rows(most, rows)
    shards = -(-rows // balanced)
    assert balanced <= most and balanced % SHARD_ROW_STEP == 0 and shards == -(-rows // most)
    assert shards * balanced - rows < SHARD_ROW_STEP * shards
