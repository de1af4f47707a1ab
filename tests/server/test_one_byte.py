"""One-byte storage end to end (issue 39): a capture with --dtype int8 stores codes and each shard's
steps and offsets, every reader decodes them (read_activations, to_xarray, batches, the torch
dataset), its values are within one step of the float32 capture's (stochastic rounding: one of the two
codes around each), the dtype enters the run key, and verify checks the new arrays."""

from __future__ import annotations

import numpy as np
import pytest

from actstore.store.format import quantised
from tests.conftest import serving
from tests.server.captured import read_all, register_toy

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
# What two float64 computations of one CKA (the server's, the formula's) differ by: a bound of 0 (a
# layer stored exactly) is checked to this
FLOAT64_NOISE = 1e-12


@pytest.fixture(scope="module")
def module_server(tmp_path_factory, ray_cluster):
    """The module's server, with forward batches of 16: a float32 pooled run's task (two shards of 8
    rows) and an int8 one's (one shard of 16: a one-byte pooled shard holds twice the rows) then run
    the same batches, so the two runs hold the same forward's values, which the tests compare the
    int8 figures with. A sample's numbers depend on its batch in float32 rounding (torch's AVX-512
    kernels: 3e-8 between batches of 8 and 4), and batches of 8 ran the int8 task's 16 rows as two
    batches sorted by length."""
    yield from serving(tmp_path_factory.mktemp("store"), capture_batch_size=16)


@pytest.fixture(scope="module")
def runs(module_client, tiny_models):
    """The toy reviews captured by bert as float32 and int8, pooled (cls) and token-level."""
    client = module_client
    register_toy(client, tiny_models)
    return {(dtype, pooling): client.capture("bert", "toy", dtype=dtype, pooling=pooling).run_key
            for dtype in ("float32", "int8") for pooling in ("cls", "tokens")}


def _read(client, run):
    return read_all(client, run, client.describe(run).num_layers)


def _steps(client, run):
    """The steps of each row's shard (rows, L+1, d), read with plain zarr through to_xarray's location."""
    import zarr

    location = client.locate_run(run)
    group = zarr.open_group(store=zarr.storage.LocalStore(location.store, read_only=True), path=location.group,
                            mode="r")
    shard_rows = group[location.array].shards[0]
    return np.repeat(group["scales"][:, 0], shard_rows, 0)[:location.rows]


@pytest.mark.parametrize("pooling", ["cls", "tokens"])
def test_int8_values_are_within_one_step_of_the_float32_capture(module_client, runs, pooling):
    client = module_client
    exact = _read(client, runs["float32", pooling])
    stored = _read(client, runs["int8", pooling])
    assert stored.dtype == np.float32 and stored.shape == exact.shape
    described = client.describe(runs["int8", pooling])
    assert described.dtype == "int8" and described.status == "committed"
    steps = _steps(client, runs["int8", pooling])
    # one step (stochastic rounding takes one of the two codes around a value), plus the float32 rounding of
    # the decode (the two captures compute the same float32 values)
    slack = 4 * np.spacing(np.abs(exact).max())
    error = stored.astype(np.float64) - exact
    assert np.all(np.abs(error) <= steps + slack)
    assert np.abs(error).max() > 0.6 * steps.max()  # beyond half a step somewhere: not rounded to nearest
    assert not np.array_equal(stored, exact)  # rounded, really


def test_the_dtype_enters_the_run_key(module_client, runs):
    assert len({runs[dtype, "cls"] for dtype in ("float32", "int8")}) == 2
    again = module_client.capture("bert", "toy", dtype="int8", pooling="cls")
    assert again.cache_hit and again.run_key == runs["int8", "cls"]


@pytest.mark.parametrize("pooling", ["cls", "tokens"])
def test_every_reader_decodes(module_client, runs, pooling):
    client = module_client
    run = runs["int8", pooling]
    stored = _read(client, run)
    view = client.to_xarray(run)
    assert view.dtype == np.float32 and view.attrs["stored_dtype"] == "int8"
    np.testing.assert_array_equal(view.values, stored)
    rows = np.concatenate([batch.rows for batch in client.batches(run, batch_size=7, shuffle=True)])
    values = np.concatenate([batch.values for batch in client.batches(run, batch_size=7, shuffle=True)])
    assert values.dtype == np.float32
    np.testing.assert_array_equal(values, stored[rows])
    dataset = client.torch_dataset(run, batch_size=16, shuffle=False, layers=[1])
    first = next(iter(dataset))
    np.testing.assert_array_equal(first["values"].numpy(), stored[first["rows"].numpy()][:, [1]])


def test_plain_zarr_reads_the_codes_and_the_documented_decode_gives_the_values(module_client, runs):
    import zarr

    client = module_client
    run = runs["int8", "tokens"]
    location = client.locate_run(run)
    g = zarr.open_group(store=zarr.storage.LocalStore(location.store, read_only=True), path=location.group, mode="r")
    codes = g["tokens"][:]
    assert codes.dtype == np.int8
    n, s = codes.shape[0], g["tokens"].shards[0]
    x = codes * np.repeat(g["scales"][:, 0], s, 0)[:n] + np.repeat(g["scales"][:, 1], s, 0)[:n]
    np.testing.assert_array_equal(x, _read(client, run))
    assert quantised.SCALES == "scales"


def test_verify_checks_the_codes_and_scales(module_client, runs):
    report = module_client.verify([runs["int8", "cls"], runs["int8", "tokens"]])
    assert [(verdict.status, verdict.damage) for verdict in report.runs] == [("ok", [])] * 2


@pytest.mark.parametrize("pooling", ["cls", "tokens"])
def test_describe_shows_the_error_figures_measured_from_the_exact_values(module_client, runs, pooling):
    """Against an independent float64 formula on the float32 capture (the same forward's values)."""
    import math

    from tests.formulas import cka_numpy, debiased_numpy

    client = module_client
    exact = _read(client, runs["float32", pooling]).astype(np.float64)
    stored = _read(client, runs["int8", pooling]).astype(np.float64)
    described = client.describe(runs["int8", pooling])
    assert [r.layer for r in described.rounding] == list(range(described.num_layers + 1))
    assert client.describe(runs["float32", pooling]).rounding == []
    for r in described.rounding:
        x, xhat = exact[:, r.layer], stored[:, r.layer]
        assert r.stored == "int8" and r.rows == len(x)
        if np.array_equal(x, xhat):  # bert's layer 0 at cls: the same embedding in every sample, stored exactly
            assert (r.max_abs, r.angle_biased, r.angle_debiased, r.cka_biased) == (0, 0, 0, 1)
            continue
        assert r.rel_frobenius == pytest.approx(np.linalg.norm(xhat - x) / np.linalg.norm(x), rel=1e-6)
        assert r.max_abs == pytest.approx(np.abs(xhat - x).max(), rel=1e-6)
        assert r.cka_biased == pytest.approx(cka_numpy(x, xhat), abs=1e-12)
        # centred first: the formula is invariant to it, and its uncentred Grams lose 1e-7 here (the tiny
        # model's channels sit ~100 standard deviations from zero)
        assert r.cka_debiased == pytest.approx(debiased_numpy(x - x.mean(0), xhat - xhat.mean(0)), abs=1e-12)
        assert math.acos(min(1.0, cka_numpy(x, xhat))) <= r.angle_biased <= math.acos(cka_numpy(x, xhat)) + 1e-6
        assert 0 < r.angle_biased < 0.05 and 0 < r.angle_debiased < 0.05


def _figures(run_info):
    return np.array([[r.rel_frobenius, r.max_abs, r.cka_biased, r.cka_debiased] for r in run_info.rounding])


def test_an_interrupted_int8_capture_is_captured_again_in_full_and_measures_every_shard(module_client, runs):
    """Its figures need every shard's exact values: the resubmitted capture drops the stored shards and
    computes them all, and ends with the figures an uninterrupted capture has (mean pooling: a run of
    its own, so that the interruption is this test's)."""
    from tests.server.captured import cancel_after

    client = module_client
    job = client.submit_capture("bert", "toy", dtype="int8", pooling="mean")
    cancel_after(client, job.job_id, shards=2)
    assert client.describe(job.target).status != "committed"
    resumed = client.capture("bert", "toy", dtype="int8", pooling="mean")
    described = client.describe(resumed.run_key)
    assert described.status == "committed" and described.recorded_shards == described.num_shards
    exact = _read(client, client.capture("bert", "toy", dtype="float32", pooling="mean").run_key)
    stored = _read(client, resumed.run_key)
    for r in described.rounding[1:]:
        x, xhat = exact[:, r.layer].astype(np.float64), stored[:, r.layer].astype(np.float64)
        assert r.rows == len(x) and r.max_abs == pytest.approx(np.abs(xhat - x).max(), rel=1e-6)
        assert r.rel_frobenius == pytest.approx(np.linalg.norm(xhat - x) / np.linalg.norm(x), rel=1e-6)


def test_an_import_stored_as_int8_measures_the_sources_values(module_client, runs, tmp_path):
    """Import the float32 capture's values with --dtype int8: the codes of the same steps and offsets
    as the int8 capture's, drawn with the import's own seeds (another run key), and error figures
    measured from the source: those of the values it stored against the source's."""
    client = module_client
    layers = [client.read_activations(runs["float32", "cls"], k)[0] for k in range(client.describe(
        runs["float32", "cls"]).num_layers + 1)]
    folder = tmp_path / "exported"
    folder.mkdir()
    for k, values in enumerate(layers):
        np.save(folder / f"layer_{k}.npy", values)
    imported = client.import_activations(folder, model="bert", dataset="toy", pooling="cls", dtype="int8").run_key
    stored, captured = _read(client, imported), _read(client, runs["int8", "cls"])
    np.testing.assert_array_equal(_steps(client, imported), _steps(client, runs["int8", "cls"]))
    assert not np.array_equal(stored, captured)  # other draws
    exact = np.stack(layers, axis=1).astype(np.float64)
    for r in client.describe(imported).rounding[1:]:
        error = stored[:, r.layer].astype(np.float64) - exact[:, r.layer]
        assert r.max_abs == pytest.approx(np.abs(error).max(), rel=1e-9)
        assert r.rel_frobenius == pytest.approx(np.linalg.norm(error) / np.linalg.norm(exact[:, r.layer]), rel=1e-9)
        assert 0 < r.bound_biased <= r.angle_biased


# ---- the bound every CKA answer over a lossy run carries --------------------------------------------
@pytest.fixture(scope="module")
def gpt2_runs(module_client, runs):
    """gpt2 over the same reviews (last token), float32 and int8: a second model for the across-run pairs."""
    return {dtype: module_client.capture("gpt2", "toy", dtype=dtype, pooling="last").run_key
            for dtype in ("float32", "int8")}


def _sides(client, run, variant):
    """A run's per-layer bounds, each checked against the sure angle it may never exceed."""
    rounding = client.describe(run).rounding
    bounds = np.array([getattr(r, f"bound_{variant}") for r in rounding])
    angles = np.array([getattr(r, f"angle_{variant}") for r in rounding])
    assert np.all((bounds <= angles) | np.isnan(angles))
    return bounds


def _exact_cka(x, y):
    from tests.formulas import cka_numpy, debiased_numpy

    x, y = x.astype(np.float64), y.astype(np.float64)
    x, y = x - x.mean(0), y - y.mean(0)
    if not (x.any() and y.any()):  # a constant layer (bert's cls at layer 0): CKA is undefined
        return np.nan, np.nan
    return cka_numpy(x, y), debiased_numpy(x, y)


def _check_bounds(client, answer, exact_a, exact_b, bound_a, bound_b, layers_a, layers_b):
    """Every entry within its bound of the float64 CKA of the exact values, the bound at most the
    sides' sum (`metrics.rounding.answer_bound` takes each side at the entry's own CKA)."""
    for variant, index in (("biased", 0), ("debiased", 1)):
        bound = getattr(answer, f"bound_{variant}")
        summed = np.add.outer(bound_a[variant][layers_a], bound_b[variant][layers_b])
        assert np.all((bound <= summed + 1e-15) & (bound >= 0) | np.isnan(summed)), (variant, bound, summed)
        assert np.all(np.isnan(bound) == np.isnan(summed))
        values = getattr(answer, variant)
        for i, la in enumerate(layers_a):
            for j, lb in enumerate(layers_b):
                truth = _exact_cka(exact_a[:, la], exact_b[:, lb])[index]
                if np.isnan(truth) or np.isnan(values[i, j]):
                    continue
                assert abs(values[i, j] - truth) <= bound[i, j] + FLOAT64_NOISE, \
                    (variant, la, lb, values[i, j], truth, bound[i, j])
    assert answer.provenance.error_bound == pytest.approx(np.nanmax(answer.bound_biased.tolist()
                                                                    + answer.bound_debiased.tolist()))
    assert any(note.startswith("error bound:") for note in answer.notes)


def _bounds_of(client, run):
    if client.describe(run).dtype != "int8":
        states = client.describe(run).num_layers + 1
        return {"biased": np.zeros(states), "debiased": np.zeros(states)}
    return {variant: _sides(client, run, variant) for variant in ("biased", "debiased")}


def test_cka_within_an_int8_run_carries_a_bound_that_holds(module_client, runs):
    client = module_client
    run, exact = runs["int8", "tokens"], _read(module_client, runs["float32", "tokens"])
    answer = client.cka(run)
    layers = list(range(client.describe(run).num_layers + 1))
    _check_bounds(client, answer, exact, exact, _bounds_of(client, run), _bounds_of(client, run), layers, layers)
    off_diagonal = ~np.eye(len(layers), dtype=bool)
    assert np.all(answer.bound_biased[off_diagonal] > 0)
    # a layer against itself is CKA 1 for the exact values too: the bound is the answer's own rounding
    np.testing.assert_array_equal(np.diag(answer.bound_biased), np.abs(np.diag(answer.biased) - 1))
    assert np.all(np.diag(answer.bound_biased) < 1e-12)
    cached = client.cka(run)  # a cached answer carries the same bound
    assert cached.provenance.cached and np.array_equal(cached.bound_biased, answer.bound_biased)


@pytest.mark.parametrize("sides", [("int8", "int8"), ("int8", "float32"), ("float32", "int8")])
def test_cka_across_models_adds_both_sides_bounds(module_client, runs, gpt2_runs, sides):
    client = module_client
    run_a, run_b = runs[sides[0], "cls"], gpt2_runs[sides[1]]
    exact_a, exact_b = _read(client, runs["float32", "cls"]), _read(client, gpt2_runs["float32"])
    answer = client.cka(run_a, run_b, layers_a=[1, 3], layers_b=[0, 2, 3])
    _check_bounds(client, answer, exact_a, exact_b, _bounds_of(client, run_a), _bounds_of(client, run_b), [1, 3],
                  [0, 2, 3])


def test_the_cka_matrix_job_carries_the_bound_of_every_block_pair(module_client, runs, gpt2_runs):
    client = module_client
    matrix = client.cka_matrix([runs["int8", "cls"], gpt2_runs["int8"]])
    angles = {variant: np.concatenate([_sides(client, runs["int8", "cls"], variant),
                                       _sides(client, gpt2_runs["int8"], variant)])
              for variant in ("biased", "debiased")}
    exact = np.concatenate([_read(client, runs["float32", "cls"]), _read(client, gpt2_runs["float32"])], axis=1)
    blocks = list(range(len(matrix.block_run)))
    _check_bounds(client, matrix, exact, exact, angles, angles, blocks, blocks)


def test_answers_over_exact_runs_carry_no_bound(module_client, runs):
    answer = module_client.cka(runs["float32", "cls"])
    assert answer.bound_biased is None and answer.provenance.error_bound is None
    assert not any("bound" in note for note in answer.notes)


def test_other_measures_say_not_bounded_and_refuse_when_a_bound_is_required(module_client, runs):
    import math

    from actstore.errors import FailedPrecondition

    client = module_client
    run = runs["int8", "cls"]
    cos = client.cos(run)
    assert math.isnan(cos.provenance.error_bound)
    assert any(note.startswith("not bounded:") for note in cos.notes)
    worst = max(r.max_abs for r in client.describe(run).rounding)
    assert cos.provenance.error_bound != 0 and f"{worst:.3g}" in next(n for n in cos.notes if "not bounded" in n)
    with pytest.raises(FailedPrecondition, match=r"cos over run .* has no error bound: only linear CKA"):
        client.cos(run, require_bound=True)
    with pytest.raises(FailedPrecondition, match="no error bound"):
        client.measure("procrustes-distance=angular", run, require_bound=True)
    assert client.cos(runs["float32", "cls"], require_bound=True).provenance.error_bound is None  # exact: fine


# ---- the tolerance: max_cka_error -------------------------------------------------------------------
@pytest.fixture(scope="module")
def tolerated(module_client, runs):
    """The token-level int8 capture again with a tolerance between its layers' bounds: the layers over
    it must come out exact (a run with a tolerance draws its rounding as the run without it,
    `store.keys.rounding_key`, so its first pass measures the same bounds)."""
    client = module_client
    plain = client.describe(runs["int8", "tokens"]).rounding
    bounds = sorted(max(r.bound_biased, r.bound_debiased) for r in plain if r.bound_biased > 0)
    tolerance = (bounds[0] + bounds[-1]) / 2
    over = [r.layer for r in plain if max(r.bound_biased, r.bound_debiased) > tolerance]
    assert over and len(over) < len(plain)
    run = client.capture("bert", "toy", dtype="int8", pooling="tokens", max_cka_error=tolerance).run_key
    return run, tolerance, over


def test_layers_over_the_tolerance_are_stored_exactly_and_the_run_says_which(module_client, runs, tolerated):
    client = module_client
    run, tolerance, over = tolerated
    assert run != runs["int8", "tokens"]  # the tolerance enters the run key
    described = client.describe(run)
    assert described.status == "committed" and described.dtype == "int8"
    assert [r.layer for r in described.rounding if r.stored == "float32"] == over
    for r in described.rounding:
        if r.layer in over:
            assert (r.angle_biased, r.angle_debiased, r.bound_biased, r.bound_debiased, r.max_abs,
                    r.rel_frobenius) == (0, 0, 0, 0, 0, 0)
        else:
            assert max(r.bound_biased, r.bound_debiased) <= tolerance
    exact, plain = _read(client, runs["float32", "tokens"]), _read(client, runs["int8", "tokens"])
    stored = _read(client, run)
    for layer in range(described.num_layers + 1):  # the other layers: the plain run's codes, bit for bit
        np.testing.assert_array_equal(stored[:, layer], (exact if layer in over else plain)[:, layer])
    np.testing.assert_array_equal(client.to_xarray(run).values, stored)
    np.testing.assert_array_equal(client.to_xarray(run).isel(layer=over[0]).values, exact[:, over[0]])
    rows = np.concatenate([b.rows for b in client.batches(run, batch_size=11, shuffle=True)])
    values = np.concatenate([b.values for b in client.batches(run, batch_size=11, shuffle=True)])
    np.testing.assert_array_equal(values, stored[rows])
    report = client.verify([run])
    assert [(v.status, v.damage) for v in report.runs] == [("ok", [])]


def test_a_tolerated_runs_cka_bound_holds_and_is_zero_on_the_exact_layers(module_client, runs, tolerated):
    client = module_client
    run, tolerance, over = tolerated
    answer = client.cka(run)
    layers = list(range(client.describe(run).num_layers + 1))
    exact = _read(client, runs["float32", "tokens"])
    _check_bounds(client, answer, exact, exact, _bounds_of(client, run), _bounds_of(client, run), layers, layers)
    assert answer.bound_biased[over[0], over[0]] == 0
    assert answer.provenance.error_bound <= 2 * tolerance


@pytest.mark.parametrize(("tolerance", "message"), [
    (0.0, r"max_cka_error 0.0 must be in \(0, 1\): a bound on \|CKA - the exact values. CKA\|"),
    (1.0, r"max_cka_error 1.0 must be in \(0, 1\)"),
    (-1e-3, r"max_cka_error -0.001 must be in \(0, 1\)"),
])
def test_a_tolerance_out_of_range_is_refused_saying_what_to_give(module_client, runs, tolerance, message):
    from actstore.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match=message):
        module_client.capture("bert", "toy", dtype="int8", max_cka_error=tolerance)


def test_a_tolerance_needs_a_lossy_dtype(module_client, runs):
    from actstore._proto.actstore.v1 import actstore_pb2 as pb
    from actstore.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="max_cka_error bounds the error of a lossy dtype.*--dtype int8"):
        module_client.capture("bert", "toy", dtype="float16", max_cka_error=1e-2)
    # a raw caller's explicit 0 is refused too (INVALID_ARGUMENT), not read as "not given"
    with pytest.raises(InvalidArgument, match="max_cka_error 0.0 must be in"):
        module_client._connection.capture.SubmitCapture(pb.CaptureRequest(model="bert", dataset="toy", dtype="int8",
                                                               max_cka_error=0.0))


def test_batches_send_an_int8_runs_codes_and_each_shards_state_once(module_client, runs):
    from actstore._proto.actstore.v1 import readers_pb2 as rpb
    from actstore.wire import from_ndarray

    client = module_client
    run = runs["int8", "tokens"]
    parts = list(client._connection.readers.ReadBatches(rpb.BatchesRequest(run=run, batch_size=5, shuffle=True)))
    assert {from_ndarray(p.values).dtype for p in parts} == {np.dtype(np.int8)}  # one byte a value on the wire
    sent = [d.shard for p in parts for d in p.decodings]
    assert sorted(sent) == list(range(client.describe(run).num_shards))  # every shard's state, once
