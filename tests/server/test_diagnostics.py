"""Diagnostics through gRPC: CKA / COS with bootstrap intervals and a permutation null, feature
options, and the outlier report, against independent float64 formulas on the stored rows."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as scipy_stats

from actstore.errors import InvalidArgument, ResourceExhausted
from actstore.metrics.similarity.resampling import null_permutation, poisson_weights
from tests.factories import sentences
from tests.formulas import cka_numpy, debiased_numpy, debiased_resampled_numpy


@pytest.fixture(scope="module")
def client(module_client):
    return module_client


@pytest.fixture(scope="module")
def runs(client, tiny_models):
    client.register_model(tiny_models["bert"], name="bert")
    client.register_model(tiny_models["gpt2"], name="gpt2")
    client.register_dataset(texts=sentences(40, seed=5), name="toy40")
    return {name: client.capture(name, "toy40", pooling="mean", dtype="float32").run_key for name in ("bert", "gpt2")}


def rows(client, run, layer):
    return client.read_activations(run, layer)[0].astype(np.float64)


def test_cka_bootstrap_and_null_match_the_expanded_rows(client, runs):
    x, y = rows(client, runs["bert"], 2), rows(client, runs["gpt2"], 1)
    result = client.cka_stats(runs["bert"], runs["gpt2"], layers_a=[2], layers_b=[1], bootstrap=30, null=20, seed=7)
    assert result.n == 40 and result.biased_ci.shape == (1, 1, 2)
    np.testing.assert_allclose(result.biased[0, 0], cka_numpy(x, y), atol=1e-9)
    np.testing.assert_allclose(result.debiased[0, 0], debiased_numpy(x, y), atol=1e-9)
    weights = poisson_weights(7, 30, np.arange(40))  # the same weights, materialised as repeated rows
    boot = np.array([cka_numpy(np.repeat(x, w, 0), np.repeat(y, w, 0)) for w in weights])
    boot_d = np.array([debiased_resampled_numpy(x, y, w) for w in weights])
    np.testing.assert_allclose(result.biased_ci[0, 0], np.quantile(boot, [0.025, 0.975]), atol=1e-9)
    np.testing.assert_allclose(result.debiased_ci[0, 0], np.quantile(boot_d, [0.025, 0.975]), atol=1e-9)
    np.testing.assert_allclose(result.biased_se[0, 0], boot.std(ddof=1), atol=1e-9)
    null = np.array([cka_numpy(x, y[null_permutation(7, p, 40)]) for p in range(20)])
    np.testing.assert_allclose(result.biased_null.mean[0, 0], null.mean(), atol=1e-9)
    np.testing.assert_allclose(result.biased_null.calibrated[0, 0],
                               (cka_numpy(x, y) - null.mean()) / (1 - null.mean()), atol=1e-9)
    assert result.biased_null.quantiles.shape == (1, 1, len(result.quantile_levels))
    assert result.provenance.options["bootstrap"] == 30 and result.provenance.metric == "linear_cka_stats"
    again = client.cka_stats(runs["bert"], runs["gpt2"], layers_a=[2], layers_b=[1], bootstrap=30, null=20, seed=7)
    assert again.provenance.cached
    other_seed = client.cka_stats(runs["bert"], runs["gpt2"], layers_a=[2], layers_b=[1], bootstrap=30, seed=8)
    assert not np.array_equal(other_seed.biased_ci, result.biased_ci)


def test_cos_bootstrap_interval_matches_the_weighted_mean(client, runs):
    x, y = rows(client, runs["bert"], 1), rows(client, runs["bert"], 3)
    result = client.cos_stats(runs["bert"], layers_a=[1], layers_b=[3], bootstrap=25, seed=3)
    xc, yc = x - x.mean(0), y - y.mean(0)
    cosine = np.einsum("ij,ij->i", xc, yc) / np.linalg.norm(xc, axis=1) / np.linalg.norm(yc, axis=1)
    weights = poisson_weights(3, 25, np.arange(40))
    np.testing.assert_allclose(result.mean[0, 0], cosine.mean(), atol=1e-6)  # stored float32 rows, centred
    np.testing.assert_allclose(result.mean_ci[0, 0], np.quantile(weights @ cosine / weights.sum(1), [0.025, 0.975]),
                               atol=1e-6)
    assert result.mean_ci[0, 0, 0] <= result.mean[0, 0] <= result.mean_ci[0, 0, 1]
    with pytest.raises(InvalidArgument, match="null is defined for CKA only"):
        client.diagnostics._stats(2, runs["bert"], None, [1], [3], "", False, 0, 0.95, 0, 5, False, [], False, 3.0)


def test_standardised_and_excluded_features(client, runs):
    x, y = rows(client, runs["bert"], 1), rows(client, runs["gpt2"], 2)
    zx, zy = (x - x.mean(0)) / x.std(0), (y - y.mean(0)) / y.std(0)
    standard = client.cka_stats(runs["bert"], runs["gpt2"], layers_a=[1], layers_b=[2], standardize=True)
    np.testing.assert_allclose(standard.biased[0, 0], cka_numpy(zx, zy), atol=1e-9)
    np.testing.assert_allclose(standard.debiased[0, 0], debiased_numpy(zx, zy), atol=1e-9)
    assert standard.provenance.options["standardize"] is True and standard.biased_ci is None
    dropped = client.cka_stats(runs["bert"], runs["gpt2"], layers_a=[1], layers_b=[2], exclude_dims=[0, 5])
    keep = [d for d in range(16) if d not in (0, 5)]
    np.testing.assert_allclose(dropped.biased[0, 0], cka_numpy(x[:, keep], y[:, keep]), atol=1e-9)
    assert dropped.excluded_a.tolist() == [[1, 0], [1, 5]] and dropped.provenance.options["exclude_dims"] == [0, 5]
    with pytest.raises(InvalidArgument, match="exclude_dims 99 is out of range"):
        client.cka_stats(runs["bert"], layers_a=[1], layers_b=[2], exclude_dims=[99])


def test_outlier_report_matches_numpy(client, runs):
    report = client.outliers(runs["gpt2"], top_k=3)
    assert report.layers == [0, 1, 2, 3] and report.top_dims.shape == (4, 3)
    x = rows(client, runs["gpt2"], 2)
    mean, std = x.mean(0), x.std(0)
    np.testing.assert_allclose(report.severity[2], np.linalg.norm(mean) / np.linalg.norm(std), rtol=1e-9)
    ratio = np.abs(mean) / std
    assert report.top_dims[2].tolist() == np.argsort(-ratio)[:3].tolist()
    np.testing.assert_allclose(report.top_ratio[2], np.sort(ratio)[::-1][:3], rtol=1e-9)
    np.testing.assert_allclose(report.kurtosis_max[2], scipy_stats.kurtosis(x, axis=0).max(), rtol=1e-7)


def test_memory_limit_names_the_size(tmp_path, ray_cluster, tiny_models):
    from actstore.client import Client
    from actstore.server.app import start_server
    from tests.conftest import make_settings

    running = start_server(make_settings(tmp_path / "store", max_accumulator_bytes=40_000))
    try:
        with Client(f"127.0.0.1:{running.port}") as c:
            c.register_model(tiny_models["bert"], name="bert")
            c.register_dataset(texts=sentences(40, seed=5), name="toy40")
            run = c.capture("bert", "toy40", pooling="mean").run_key
            with pytest.raises(ResourceExhausted, match=r"would hold [\d.]+ KiB in memory, over the 39.06 KiB"):
                c.cka_stats(run, layers_a=[1], layers_b=[2], bootstrap=200)
            with pytest.raises(ResourceExhausted, match=r"bootstrap with 16 groups .* would hold [\d.]+ [KM]iB"):
                c.cka_stats(run, layers_a=[1], layers_b=[2], bootstrap=200, bootstrap_method="grouped")
            # without resampling, standardised CKA takes the plain query's tiled path
            standard = c.cka_stats(run, standardize=True)
            z = [(x - x.mean(0)) / x.std(0) for x in (rows(c, run, layer) for layer in range(4))]
            np.testing.assert_allclose(standard.biased, [[cka_numpy(p, q) for q in z] for p in z], atol=1e-9)
            assert any("tile(s)" in note and not note.startswith("computed in feature space over 40 rows in 1 ")
                       for note in standard.notes), standard.notes
    finally:
        running.stop()


def test_cli_prints_intervals_and_draws_error_bars(module_server, client, runs, tmp_path, capsys):
    from actstore.cli import main

    address = ["--address", f"127.0.0.1:{module_server.port}"]
    assert main([*address, "cka", runs["bert"], runs["gpt2"], "--layers-a", "1", "--layers-b", "2,3",
                 "--bootstrap", "20", "--null", "10", "--plot", str(tmp_path / "ci.png")]) == 0
    out = capsys.readouterr().out
    assert "linear CKA (biased), n=40" in out and "permutation null" in out and (tmp_path / "ci.png").stat().st_size
    r = client.cka_stats(runs["bert"], runs["gpt2"], layers_a=[1], layers_b=[2, 3], bootstrap=20, null=10)
    assert f"[{r.biased_ci[0, 0, 0]:.4f}, {r.biased_ci[0, 0, 1]:.4f}]" in out
    assert main([*address, "cos", runs["bert"], "--layers-a", "1", "--layers-b", "2", "--bootstrap", "10",
                 "--standardize", "--json"]) == 0
    assert '"interval": [[[' in capsys.readouterr().out
    assert main([*address, "outliers", runs["gpt2"], "--top-k", "2", "--plot", str(tmp_path / "o.png")]) == 0
    out = capsys.readouterr().out
    assert "severity" in out and (tmp_path / "o.png").stat().st_size


def test_demo_section_on_tiny_models(client, runs, tmp_path):
    """The demo's standardised cross-model section, on the tiny models (the packaged SmolLM2 is too
    heavy for the test suite): its plots and a report paragraph that counts the dark layers."""
    from actstore.demo import _standardised_section, lit_columns

    assert lit_columns(np.array([[0.9, 0.1, 0.5], [0.2, 0.85, 0.1]])).tolist() == [0, 1]
    plain = client.cka(runs["bert"], runs["gpt2"]).biased
    text = _standardised_section(client, tmp_path, ("bert", runs["bert"]), ("gpt2", runs["gpt2"]), plain)
    assert text.startswith("## Outlier dimensions and the cross-model matrix")
    assert "outlier severity" in text and "of the flat block" in text
    assert (tmp_path / "outliers_b.png").stat().st_size and (tmp_path / "cka_cross_standardised.png").stat().st_size
