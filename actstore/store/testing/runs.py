"""The contract an ArrayStore backend's reading and writing must pass (like zarr-python's
``zarr.testing.store.StoreTests``): creating runs, writing and reading shards in every dtype,
means, side arrays, one byte a value; `upkeep.ArrayStoreContract` adds the rest.

A backend's test module subclasses `ArrayStoreContract` as `Test<Backend>` and overrides
`make_store`. The classes' names do not start with `Test`, so pytest never collects them alone.
The tests only use the ArrayStore interface: nothing here knows about files or formats. This
module imports pytest and torch: it is for tests, and nothing of actstore imports it.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from actstore.errors import DataLoss
from actstore.store.array_store import ArrayStore, RunLayout
from actstore.store.format import quantised

# 11 rows in shards of 4: shards [0, 4), [4, 8) and the partial last shard [8, 11).
N = 11
SHARD_ROWS = 4
NUM_STATES = 4  # L + 1
WIDTH = 8

# Row ranges inside one shard, on shard boundaries, straddling shards, inside the last partial
# shard, the whole run, and empty.
ROW_RANGES = [
    (0, N), (0, 4), (1, 3), (4, 8), (3, 5), (2, 10), (7, 9), (8, 11), (9, 10), (10, 11), (0, 1),
    (5, 5),
]
LAYER_SETS = [[0], [2], [NUM_STATES - 1], [0, 3], [3, 1, 2], list(range(NUM_STATES))]


def key(name: str) -> str:
    """A run key shaped like the real ones (64 hex digits)."""
    return hashlib.sha256(name.encode()).hexdigest()


def pooled_layout(dtype: str = "float32", n: int = N, pooling: str = "mean") -> RunLayout:
    return RunLayout(n=n, rows=n, num_states=NUM_STATES, width=WIDTH, dtype=dtype, pooling=pooling,
                     shard_rows=SHARD_ROWS)


def token_layout(offsets: np.ndarray, dtype: str = "float32") -> RunLayout:
    return RunLayout(n=len(offsets) - 1, rows=int(offsets[-1]), num_states=NUM_STATES, width=WIDTH,
                     dtype=dtype, pooling="tokens", shard_rows=SHARD_ROWS)


def make_values(layout: RunLayout, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(stored, numbers): the array in the storage dtype as given to write_shard, and the float
    numbers it stands for (bfloat16 bits come from torch's own cast, as the capture does)."""
    rng = np.random.default_rng(seed)
    floats = (rng.standard_normal((layout.rows, layout.num_states, layout.width)) * 3).astype(np.float32)
    if layout.dtype == "bfloat16":
        as_bf16 = torch.from_numpy(floats).bfloat16()
        stored = as_bf16.view(torch.int16).numpy().view(np.uint16)
        numbers = as_bf16.float().numpy()
    else:
        stored = floats.astype(layout.dtype)
        numbers = stored
    return stored, numbers


def one_byte_values(layout: RunLayout, seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """(codes, numbers, states) of an int8 run: each shard of `make_values`'s float32 numbers coded
    alone (`store.format.quantised`), the numbers its codes decode to, and each shard's steps and offsets."""
    floats, _ = make_values(replace(layout, dtype="float32"), seed)
    floats[:, 1] = floats[:, 1] * 50 + 200  # a layer far from zero: the offsets matter
    codes = np.empty(floats.shape, np.int8)
    numbers = np.empty(floats.shape, np.float32)
    states = []
    for shard in range(layout.num_shards):
        start, stop = layout.shard_range(shard)
        shard_codes, state = quantised.quantise(floats[start:stop].transpose(1, 0, 2), seed=shard)
        codes[start:stop] = shard_codes.transpose(1, 0, 2)
        numbers[start:stop] = quantised.decode(shard_codes, state).transpose(1, 0, 2)
        states.append(state)
    return codes, numbers, states


def shard_sums(numbers: np.ndarray, layout: RunLayout, shard: int) -> np.ndarray:
    start, stop = layout.shard_range(shard)
    return numbers[start:stop].sum(axis=0, dtype=np.float64)


def kept_with(run_key: str, layout: RunLayout, shard: int) -> tuple[dict[str, list], dict[str, list]]:
    """Chunk rows and statistics to keep with a shard, as a capture gives them (one row per layer,
    the catalog's columns; `LayerStats.to_dict`'s fields), with values that tell shards and layers
    apart: a crc32c above 2^31, a layer without finite values (NaN extremes), large counts."""
    layers, rows = layout.num_states, layout.shard_range(shard)[1] - layout.shard_range(shard)[0]
    chunk_rows = {"run_key": [run_key] * layers, "shard": [shard] * layers, "layer": list(range(layers)),
                  "rows": [rows] * layers, "checksum": [0xFFFF0000 + 16 * shard + layer for layer in range(layers)],
                  "min": [float("nan")] + [-1.5 - shard - layer for layer in range(1, layers)],
                  "max": [float("nan")] + [2.25 + shard + layer for layer in range(1, layers)],
                  "nan_count": [rows * layout.width] + [0] * (layers - 1), "inf_count": [0] * (layers - 1) + [shard]}
    stats = {name: [i + 0.1 * shard + layer / 3 for layer in range(layers)]
             for i, name in enumerate(("count", "mean", "m2", "norm_count", "norm_mean", "norm_m2"))}
    return chunk_rows, stats


def same_cells(a: list, b: list) -> bool:
    """Lists equal cell by cell, NaN equal to NaN (a NaN read back is another float object)."""
    return len(a) == len(b) and all(x == y or (x != x and y != y) for x, y in zip(a, b))



class RunContract:
    """What every ArrayStore backend must pass in reading and writing runs. Override `make_store`."""

    def make_store(self, tmp_path: Path) -> ArrayStore:
        """A store over the storage at tmp_path (empty for a fresh tmp_path). Called twice with
        the same tmp_path it returns two handles on the same storage, as two processes have."""
        raise NotImplementedError("a backend's test class opens its store here")

    @pytest.fixture
    def store(self, tmp_path: Path) -> ArrayStore:
        return self.make_store(tmp_path)

    # ---- helpers --------------------------------------------------------------------------
    def create(self, store: ArrayStore, run_key: str, layout: RunLayout, *, sample_ids=None,
               labels=None, offsets=None) -> None:
        ids = sample_ids if sample_ids is not None else [f"s{i}" for i in range(layout.n)]
        store.create_run(run_key, layout, ids, labels, offsets)

    def write_all(self, store: ArrayStore, run_key: str, layout: RunLayout, seed: int = 0):
        if layout.dtype == "int8":
            stored, numbers, states = one_byte_values(layout, seed)
        else:
            (stored, numbers), states = make_values(layout, seed), [None] * layout.num_shards
        for shard in range(layout.num_shards):
            start, stop = layout.shard_range(shard)
            store.write_shard(run_key, shard, stored[start:stop], shard_sums(numbers, layout, shard),
                              decoding=states[shard])
        return stored, numbers

    def filled_run(self, store: ArrayStore, dtype: str = "float32", name: str = "run"):
        run_key, layout = key(name), pooled_layout(dtype)
        self.create(store, run_key, layout)
        _, numbers = self.write_all(store, run_key, layout)
        return run_key, layout, numbers

    @staticmethod
    def expected(numbers: np.ndarray, layers: list[int], start: int, stop: int) -> np.ndarray:
        return np.stack([numbers[start:stop, layer, :] for layer in layers])

    # ---- create / layout ------------------------------------------------------------------
    @pytest.mark.parametrize("dtype", ["float16", "float32", "bfloat16", "int8"])
    @pytest.mark.parametrize("pooling", ["cls", "last", "mean"])
    def test_create_run_then_layout_round_trips(self, store, dtype, pooling):
        layout = pooled_layout(dtype, pooling=pooling)
        self.create(store, key("r"), layout)
        got = store.layout(key("r"))
        assert got == layout
        assert isinstance(got, RunLayout)
        assert got.num_shards == 3 and got.shard_range(2) == (8, 11)

    def test_token_layout_round_trips(self, store):
        offsets = np.array([0, 4, 5, 13], dtype=np.int64)
        layout = token_layout(offsets)
        self.create(store, key("t"), layout, offsets=offsets)
        assert store.layout(key("t")) == layout
        assert layout.array_name == "tokens" and layout.rows == 13 and layout.n == 3

    def test_create_run_is_idempotent_for_the_same_layout(self, store):
        run_key, layout, numbers = self.filled_run(store)
        store.write_means(run_key)
        # a resumed capture calls create_run again with the same layout: nothing is lost
        self.create(store, run_key, layout, labels=None)
        assert store.layout(run_key) == layout
        np.testing.assert_array_equal(store.read_layers(run_key, [1], 0, N), self.expected(numbers, [1], 0, N))
        assert store.sample_ids(run_key) == [f"s{i}" for i in range(N)]

    def test_runs_are_independent(self, store):
        a, layout_a, numbers_a = self.filled_run(store, name="a")
        b_key, layout_b = key("b"), pooled_layout("float16", n=5)
        self.create(store, b_key, layout_b)
        _, numbers_b = self.write_all(store, b_key, layout_b, seed=7)
        assert store.layout(a) == layout_a and store.layout(b_key) == layout_b
        np.testing.assert_array_equal(store.read_layers(a, [0], 0, N), self.expected(numbers_a, [0], 0, N))
        np.testing.assert_array_equal(store.read_layers(b_key, [0], 0, 5), self.expected(numbers_b, [0], 0, 5))

    # ---- write_shard / read_layers --------------------------------------------------------
    @pytest.mark.parametrize("dtype", ["float16", "float32", "bfloat16", "int8"])
    def test_read_one_layer_any_row_range(self, store, dtype):
        run_key, _, numbers = self.filled_run(store, dtype)
        for layer in range(NUM_STATES):
            for start, stop in ROW_RANGES:
                got = store.read_layers(run_key, [layer], start, stop)
                assert got.shape == (1, stop - start, WIDTH), (layer, start, stop)
                np.testing.assert_array_equal(got, self.expected(numbers, [layer], start, stop),
                                              err_msg=f"layer {layer} rows {start}..{stop}")

    @pytest.mark.parametrize("dtype", ["float16", "float32", "bfloat16", "int8"])
    def test_read_several_layers_any_row_range(self, store, dtype):
        run_key, _, numbers = self.filled_run(store, dtype)
        for layers in LAYER_SETS:
            for start, stop in ROW_RANGES:
                got = store.read_layers(run_key, layers, start, stop)
                assert got.shape == (len(layers), stop - start, WIDTH), (layers, start, stop)
                np.testing.assert_array_equal(got, self.expected(numbers, layers, start, stop),
                                              err_msg=f"layers {layers} rows {start}..{stop}")

    def test_last_partial_shard(self, store):
        run_key, layout = key("p"), pooled_layout()
        self.create(store, run_key, layout)
        stored, numbers = make_values(layout)
        # a full-size block for the 3-row last shard is refused
        with pytest.raises(ValueError):
            store.write_shard(run_key, 2, np.zeros((SHARD_ROWS, NUM_STATES, WIDTH), np.float32),
                              np.zeros((NUM_STATES, WIDTH)))
        store.write_shard(run_key, 2, stored[8:11], shard_sums(numbers, layout, 2))
        np.testing.assert_array_equal(store.read_layers(run_key, [0, 3], 8, 11),
                                      self.expected(numbers, [0, 3], 8, 11))

    def test_a_shard_of_zeros_is_stored_not_taken_for_a_missing_one(self, store):
        run_key, layout = key("zeros"), pooled_layout("float16")
        self.create(store, run_key, layout)
        store.write_shard(run_key, 1, np.zeros((SHARD_ROWS, NUM_STATES, WIDTH), np.float16),
                          np.zeros((NUM_STATES, WIDTH)))
        assert store.shard_present(run_key, 1)
        for layers in ([2], list(range(NUM_STATES))):
            assert not store.read_layers(run_key, layers, *layout.shard_range(1)).any()

    def test_shards_write_in_any_order(self, store):
        run_key, layout = key("o"), pooled_layout()
        self.create(store, run_key, layout)
        stored, numbers = make_values(layout)
        for shard in (2, 0, 1):
            start, stop = layout.shard_range(shard)
            store.write_shard(run_key, shard, stored[start:stop], shard_sums(numbers, layout, shard))
        np.testing.assert_array_equal(store.read_layers(run_key, [1, 2], 0, N),
                                      self.expected(numbers, [1, 2], 0, N))

    def test_bfloat16_reads_back_as_float32_of_the_rounded_values(self, store):
        run_key, layout = key("bf"), pooled_layout("bfloat16")
        self.create(store, run_key, layout)
        rng = np.random.default_rng(3)
        floats = (rng.standard_normal((N, NUM_STATES, WIDTH)) * 100).astype(np.float32)
        floats[0, 0, :6] = [0.0, -0.0, 1.0 + 2.0**-8, 3.0e38, -1.0e-40, np.inf]  # ties, overflow, subnormal
        bits = torch.from_numpy(floats).bfloat16().view(torch.int16).numpy().view(np.uint16)
        rounded = torch.from_numpy(floats).bfloat16().float().numpy()
        assert not np.array_equal(rounded, floats)  # the cast really rounds
        for shard in range(layout.num_shards):
            start, stop = layout.shard_range(shard)
            store.write_shard(run_key, shard, bits[start:stop], rounded[start:stop].sum(0, dtype=np.float64))
        got = store.read_layers(run_key, [0, 2], 0, N)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, self.expected(rounded, [0, 2], 0, N))
        assert np.signbit(got[0, 0, 1]) and got[0, 0, 5] == np.inf

    def test_float32_round_trips_exactly(self, store):
        run_key, _, numbers = self.filled_run(store, "float32")
        got = store.read_layers(run_key, [3], 0, N)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got[0], numbers[:, 3, :])

    def test_float16_stays_float16(self, store):
        run_key, _, numbers = self.filled_run(store, "float16")
        got = store.read_layers(run_key, [1, 2], 0, N)
        assert got.dtype == np.float16
        np.testing.assert_array_equal(got, self.expected(numbers, [1, 2], 0, N))

    def test_float16_keeps_nan_and_inf(self, store):
        run_key, layout = key("nan"), pooled_layout("float16")
        self.create(store, run_key, layout)
        stored, _ = make_values(layout)
        stored[1, 2, 3], stored[9, 0, 0], stored[10, 3, 7] = np.nan, np.inf, -np.inf
        for shard in range(layout.num_shards):
            start, stop = layout.shard_range(shard)
            store.write_shard(run_key, shard, stored[start:stop], np.zeros((NUM_STATES, WIDTH)))
        got = store.read_layers(run_key, list(range(NUM_STATES)), 0, N)
        np.testing.assert_array_equal(got, stored.transpose(1, 0, 2))  # NaN == NaN here
        assert np.isnan(got[2, 1, 3]) and got[0, 9, 0] == np.inf and got[3, 10, 7] == -np.inf

    def test_wrong_shard_shape_raises_value_error(self, store):
        run_key, layout = key("w"), pooled_layout()
        self.create(store, run_key, layout)
        sums = np.zeros((NUM_STATES, WIDTH))
        for shape in [(SHARD_ROWS - 1, NUM_STATES, WIDTH), (SHARD_ROWS + 1, NUM_STATES, WIDTH),
                      (SHARD_ROWS, NUM_STATES - 1, WIDTH), (SHARD_ROWS, NUM_STATES, WIDTH + 1),
                      (SHARD_ROWS, WIDTH), (SHARD_ROWS, WIDTH, NUM_STATES)]:
            with pytest.raises(ValueError):
                store.write_shard(run_key, 0, np.ones(shape, np.float32), sums)

    def test_rewriting_a_shard_with_the_same_content_is_harmless(self, store):
        run_key, layout, numbers = self.filled_run(store, "float16")
        first_means = store.write_means(run_key).copy()
        stored, numbers_again = make_values(layout)
        np.testing.assert_array_equal(numbers_again, numbers)
        for shard in (1, 1, 2):  # a retried task reports the same shard again
            start, stop = layout.shard_range(shard)
            store.write_shard(run_key, shard, stored[start:stop], shard_sums(numbers, layout, shard))
        np.testing.assert_array_equal(store.read_layers(run_key, list(range(NUM_STATES)), 0, N),
                                      numbers.transpose(1, 0, 2))
        # the layer sums are replaced per shard, never added up twice
        np.testing.assert_array_equal(store.write_means(run_key), first_means)

    def test_nbytes_stored_is_positive_after_writing(self, store):
        run_key, _, _ = self.filled_run(store)
        nbytes = store.nbytes_stored(run_key)
        assert isinstance(nbytes, int) and nbytes > 0

    # ---- means ----------------------------------------------------------------------------
    @pytest.mark.parametrize("dtype", ["float16", "float32", "bfloat16"])
    def test_write_means_is_the_float64_mean_of_the_sums(self, store, dtype):
        run_key, layout, numbers = self.filled_run(store, dtype)
        means = store.write_means(run_key)
        assert means.dtype == np.float64 and means.shape == (NUM_STATES, WIDTH)
        total = sum(shard_sums(numbers, layout, s) for s in range(layout.num_shards))
        np.testing.assert_allclose(means, total / N, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(means, numbers.astype(np.float64).mean(axis=0), rtol=1e-12, atol=1e-14)
        stored_means = store.means(run_key)
        assert stored_means.dtype == np.float64
        np.testing.assert_array_equal(stored_means, means)

    def test_write_means_uses_the_given_sums(self, store):
        # the means come from the sums the writer reports, not from re-reading the values
        run_key, layout = key("m"), pooled_layout()
        self.create(store, run_key, layout)
        stored, _ = make_values(layout)
        for shard in range(layout.num_shards):
            start, stop = layout.shard_range(shard)
            sums = np.full((NUM_STATES, WIDTH), float(shard + 1)) * np.arange(NUM_STATES)[:, None]
            store.write_shard(run_key, shard, stored[start:stop], sums)
        expected = (1 + 2 + 3) * np.arange(NUM_STATES, dtype=np.float64)[:, None] * np.ones(WIDTH) / N
        np.testing.assert_allclose(store.write_means(run_key), expected, rtol=1e-15)
        np.testing.assert_allclose(store.means(run_key), expected, rtol=1e-15)

    # ---- sample ids, labels, offsets ------------------------------------------------------
    def test_sample_ids_round_trip_including_non_ascii_and_nuls(self, store):
        ids = ["plain", "café", "日本語:17", "emoji 🙂", "nul\x00inside", "trailing nul\x00", "\x00lead",
               "\x00\x00", "tab\tand\nnewline", "x" * 300, "ä"]
        layout = pooled_layout(n=len(ids))
        self.create(store, key("ids"), layout, sample_ids=ids)
        got = store.sample_ids(key("ids"))
        assert got == ids
        assert all(type(i) is str for i in got)

    def test_labels_none(self, store):
        self.create(store, key("nl"), pooled_layout(), labels=None)
        assert store.labels(key("nl")) is None

    def test_labels_given(self, store):
        labels = np.array([0, 1, 2, 1, 0, 9, 3, 1, 1, 0, 2])
        self.create(store, key("l"), pooled_layout(), labels=labels)
        got = store.labels(key("l"))
        assert got is not None and np.issubdtype(got.dtype, np.integer)
        np.testing.assert_array_equal(got, labels)

    def test_offsets_for_a_token_layout(self, store):
        offsets = np.array([0, 4, 5, 5, 13], dtype=np.int64)  # prompt 2 owns no tokens
        layout = token_layout(offsets, "float16")
        self.create(store, key("tok"), layout, offsets=offsets, labels=np.array([1, 0, 1, 0]))
        _, numbers = self.write_all(store, key("tok"), layout)
        got = store.offsets(key("tok"))
        assert got is not None and np.issubdtype(got.dtype, np.integer)
        np.testing.assert_array_equal(got, offsets)
        # prompt i's tokens are rows offsets[i]..offsets[i+1] of the token array
        for i in range(layout.n):
            a, b = int(got[i]), int(got[i + 1])
            np.testing.assert_array_equal(store.read_layers(key("tok"), [2], a, b)[0], numbers[a:b, 2])
        assert store.sample_ids(key("tok")) == ["s0", "s1", "s2", "s3"]

    def test_pooled_runs_have_no_offsets(self, store):
        self.create(store, key("nooff"), pooled_layout())
        assert store.offsets(key("nooff")) is None

    # ---- one byte a value (store.format.quantised) ------------------------------------------------------
    def test_int8_reads_decoded_values_and_keeps_its_codes_and_scales(self, store):
        run_key, layout = key("int8"), pooled_layout("int8")
        self.create(store, run_key, layout)
        codes, numbers = self.write_all(store, run_key, layout)
        every = list(range(NUM_STATES))
        got = store.read_layers(run_key, every, 0, N)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, self.expected(numbers, every, 0, N))
        stored = store.read_stored(run_key, [1, 3], 2, 10)
        assert stored.dtype == np.int8
        np.testing.assert_array_equal(stored, self.expected(codes, [1, 3], 2, 10))
        _, _, states = one_byte_values(layout)
        for shard in range(layout.num_shards):
            np.testing.assert_array_equal(store.decoding(run_key, shard), states[shard])
        assert store.array_shapes(run_key)["scales"] == ((layout.num_shards, 2, NUM_STATES, WIDTH), "float32")
        # the means are those of the decoded numbers, as every reader sees them (each shard's sums kept in float32)
        np.testing.assert_allclose(store.write_means(run_key), numbers.astype(np.float64).mean(axis=0), rtol=1e-6)

    def test_int8_shards_need_their_scales_and_other_dtypes_take_none(self, store):
        run_key, layout = key("int8-scales"), pooled_layout("int8")
        self.create(store, run_key, layout)
        codes, numbers, states = one_byte_values(layout)
        with pytest.raises(ValueError, match="steps and offsets"):
            store.write_shard(run_key, 0, codes[:SHARD_ROWS], shard_sums(numbers, layout, 0))
        f32_key, f32 = self.filled_run(store, "float32", name="f32")[:2]
        assert store.decoding(f32_key, 0) is None
        with pytest.raises(ValueError, match="steps and offsets"):
            store.write_shard(f32_key, 0, np.zeros((SHARD_ROWS, NUM_STATES, WIDTH), np.float32),
                              np.zeros((NUM_STATES, WIDTH)), decoding=states[0])

    def test_int8_dropped_shards_take_their_scales_with_them(self, store):
        run_key, layout = key("int8-drop"), pooled_layout("int8")
        self.create(store, run_key, layout)
        self.write_all(store, run_key, layout)
        store.drop_shards(run_key, [1])
        with pytest.raises(DataLoss, match="shard 1 of array '(acts|scales)'"):
            store.read_layers(run_key, [0], 0, N)
        with pytest.raises(DataLoss, match="shard 1 of array 'scales' is missing"):
            store.decoding(run_key, 1)
