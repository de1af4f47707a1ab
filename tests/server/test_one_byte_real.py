"""Issue 39's acceptance test: MiniLM-L6 and SmolLM2-135M on 2,000 Rotten Tomatoes reviews,
captured as float32 (the exact values) and as int8, pooled and every token. On every layer pair,
within each run and across the two models (pooled: the same samples), biased and debiased, the
bound the int8 answer carries holds against the CKA of the float32 capture; that CKA is checked
against an independent float64 feature-space formula (METRICS.md) on a spread of pairs. The bounds
reached are printed (run with -s): the note reports them (docs/one-byte-storage.md)."""

from __future__ import annotations

import numpy as np
import pytest

# slow (not in make test): eight captures of 2,000 reviews and the full CKA of ~50,000-row runs; the
# SmolLM2 token-level CKA pair did not finish within the suite's 600 s a test on 2 cores
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

N = 2000
CASES = {("minilm-l6", "mean"), ("minilm-l6", "tokens"), ("smollm2-135m", "last"), ("smollm2-135m", "tokens")}


@pytest.fixture(scope="module")
def real(tmp_path_factory, ray_cluster):
    """A server with the store's own shard and batch sizes; every case captured as float32 and int8."""
    from actstore.client import Client
    from actstore.server.app import start_server
    from tests.conftest import make_settings

    running = start_server(make_settings(tmp_path_factory.mktemp("store"), shard_rows=256, capture_batch_size=32))
    client = Client(f"127.0.0.1:{running.port}")
    try:
        for model in ("minilm-l6", "smollm2-135m"):
            client.register_model(builtin=model)
        client.register_dataset(builtin="rotten-tomatoes", limit=N, name="rt")
        runs = {(model, pooling, dtype): client.capture(model, "rt", pooling=pooling, dtype=dtype).run_key
                for model, pooling in sorted(CASES) for dtype in ("float32", "int8")}
        yield client, runs
    finally:
        client.close()
        running.stop()


def _feature_cka(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Biased and debiased linear CKA in feature space, float64, written out from METRICS.md (not
    tests/formulas.py's Gram-space forms: n x n Grams of a 53,862-row token run are 23 GB each)."""
    n = len(x)
    x, y = x.astype(np.float64), y.astype(np.float64)
    x, y = x - x.mean(0), y - y.mean(0)
    cross = lambda a, b: float(np.sum((a.T @ b) ** 2))  # noqa: E731
    rx, ry = (x * x).sum(1), (y * y).sum(1)

    def hsic(a, b, ra, rb):
        return cross(a, b) - n / (n - 2) * float(ra @ rb) + ra.sum() * rb.sum() / ((n - 1) * (n - 2))

    biased = cross(x, y) / np.sqrt(cross(x, x) * cross(y, y))
    debiased = hsic(x, y, rx, ry) / np.sqrt(hsic(x, x, rx, rx) * hsic(y, y, ry, ry))
    return float(biased), float(debiased)


def _holds(lossy, exact) -> tuple[float, float]:
    """Every entry of the int8 answer within its bound of the float32 answer; (largest error, largest bound)."""
    errors = []
    for variant in ("biased", "debiased"):
        error = np.abs(getattr(lossy, variant) - getattr(exact, variant))
        bound = getattr(lossy, f"bound_{variant}")
        defined = ~np.isnan(error)
        assert np.all(error[defined] <= bound[defined]), (variant, np.argwhere(error > bound))
        errors.append(float(error[defined].max()))
    return max(errors), float(lossy.provenance.error_bound)


@pytest.mark.parametrize(("model", "pooling"), sorted(CASES))
def test_the_bound_holds_on_every_layer_pair_within_a_run(real, model, pooling):
    client, runs = real
    exact = client.cka(runs[model, pooling, "float32"])
    lossy = client.cka(runs[model, pooling, "int8"])
    largest_error, bound = _holds(lossy, exact)
    rows = client.describe(runs[model, pooling, "int8"]).rows
    print(f"\n{model} {pooling} ({rows} rows): largest |CKA int8 - CKA float32| {largest_error:.3g}, largest bound "
          f"{bound:.3g}, per layer (biased bound, one side) "
          + " ".join(f"{r.bound_biased:.2g}" for r in client.describe(runs[model, pooling, "int8"]).rounding))
    assert 0 < bound < 0.1


@pytest.mark.parametrize("sides", [("int8", "int8"), ("int8", "float32"), ("float32", "int8")])
def test_the_bound_holds_on_every_layer_pair_across_the_two_models(real, sides):
    client, runs = real
    a, b = ("minilm-l6", "mean"), ("smollm2-135m", "last")
    exact = client.cka(runs[(*a, "float32")], runs[(*b, "float32")])
    lossy = client.cka(runs[(*a, sides[0])], runs[(*b, sides[1])])
    largest_error, bound = _holds(lossy, exact)
    print(f"\nacross MiniLM-L6 {sides[0]} x SmolLM2 {sides[1]} (pooled, {N} rows): largest error {largest_error:.3g}, "
          f"largest bound {bound:.3g}")


@pytest.mark.parametrize(("model", "pooling"), sorted(CASES))
def test_the_exact_runs_cka_is_the_float64_formulas(real, model, pooling):
    client, runs = real
    run = runs[model, pooling, "float32"]
    last = client.describe(run).num_layers
    pairs = [(1, 2), (1, last), (last // 2, last), (last - 1, last)]
    answer = client.cka(run)
    for i, j in pairs:
        biased, debiased = _feature_cka(client.read_activations(run, i)[0], client.read_activations(run, j)[0])
        assert answer.biased[i, j] == pytest.approx(biased, abs=1e-9)
        assert answer.debiased[i, j] == pytest.approx(debiased, abs=1e-9)
