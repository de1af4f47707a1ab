"""The grouped bootstrap of CKA through gRPC and the CLI: its intervals against the repeated-rows
definition on the stored rows, the method and G in the provenance and the result key, the null
beside it, and the refusals (COS, bad options; memory: test_diagnostics)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from actstore.errors import InvalidArgument
from actstore.metrics.similarity.resampling import group_poisson_weights, null_permutation, sample_groups
from tests.formulas import biased_grouped_numpy, cka_numpy, debiased_resampled_numpy
from tests.server.test_diagnostics import client, rows, runs  # noqa: F401  (the same module fixtures)


def test_grouped_intervals_match_the_repeated_rows_and_the_null(client, runs):  # noqa: F811 (the fixtures)
    x, y = rows(client, runs["bert"], 2), rows(client, runs["gpt2"], 1)
    asked = {"layers_a": [2], "layers_b": [1], "bootstrap": 30, "seed": 7, "null": 10}
    result = client.cka_stats(runs["bert"], runs["gpt2"], bootstrap_method="grouped", bootstrap_groups=8, **asked)
    weights = group_poisson_weights(7, 30, 8)[:, sample_groups(7, np.arange(40), 8)]  # row i: its group's weight
    boot = np.array([biased_grouped_numpy(x, y, w) for w in weights])
    boot_d = np.array([debiased_resampled_numpy(x, y, w) for w in weights])
    np.testing.assert_allclose(result.biased[0, 0], cka_numpy(x, y), atol=1e-9)
    np.testing.assert_allclose(result.biased_ci[0, 0], np.quantile(boot, [0.025, 0.975]), atol=1e-9)
    np.testing.assert_allclose(result.debiased_ci[0, 0], np.quantile(boot_d, [0.025, 0.975]), atol=1e-9)
    np.testing.assert_allclose(result.debiased_se[0, 0], boot_d.std(ddof=1), atol=1e-9)
    null = np.array([cka_numpy(x, y[null_permutation(7, p, 40)]) for p in range(10)])
    np.testing.assert_allclose(result.biased_null.mean[0, 0], null.mean(), atol=1e-9)
    options = result.provenance.options
    assert (options["bootstrap_method"], options["bootstrap_groups"]) == ("grouped", 8)
    assert any(note.startswith("grouped Poisson bootstrap: 8 random groups") for note in result.notes), result.notes
    exact = client.cka_stats(runs["bert"], runs["gpt2"], bootstrap_method="exact", **asked)
    assert exact.provenance.options["bootstrap_method"] == "exact"
    assert "bootstrap_groups" not in exact.provenance.options
    np.testing.assert_allclose(exact.biased_null.mean, result.biased_null.mean, atol=1e-12)
    assert not np.allclose(exact.biased_ci, result.biased_ci)


def test_auto_is_exact_at_small_n_and_the_key_holds_method_and_groups(client, runs):  # noqa: F811 (the fixtures)
    pair = {"layers_a": [1], "layers_b": [3], "bootstrap": 20, "seed": 2}
    auto = client.cka_stats(runs["bert"], **pair)
    assert auto.provenance.options["bootstrap_method"] == "exact" and not auto.provenance.cached
    assert client.cka_stats(runs["bert"], bootstrap_method="exact", **pair).provenance.cached  # auto resolved
    grouped = client.cka_stats(runs["bert"], bootstrap_method="grouped", bootstrap_groups=6, **pair)
    assert not grouped.provenance.cached
    assert client.cka_stats(runs["bert"], bootstrap_method="grouped", bootstrap_groups=6, **pair).provenance.cached
    other = client.cka_stats(runs["bert"], bootstrap_method="grouped", bootstrap_groups=7, **pair)
    assert not other.provenance.cached and not np.allclose(other.biased_ci, grouped.biased_ci)
    with pytest.raises(InvalidArgument, match="grouped bootstrap is for CKA"):
        client.diagnostics._stats(2, runs["bert"], None, [1], [3], "", False, 10, 0.95, 0, 0, False, [], False, 3.0,
                                  "grouped", None)
    with pytest.raises(InvalidArgument, match="bootstrap_method"):
        client.cka_stats(runs["bert"], bootstrap_method="jackknife", **pair)
    with pytest.raises(InvalidArgument, match="bootstrap_groups"):
        client.cka_stats(runs["bert"], bootstrap_method="grouped", bootstrap_groups=1, **pair)


def test_cli_asks_for_the_method(module_server, client, runs, capsys):  # noqa: F811 (the fixtures)
    from actstore.cli import main

    assert main(["--address", f"127.0.0.1:{module_server.port}", "cka", runs["bert"], runs["gpt2"], "--layers-a",
                 "1", "--layers-b", "2", "--bootstrap", "15", "--bootstrap-method", "grouped", "--bootstrap-groups",
                 "5", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["options"]["bootstrap_method"] == "grouped" and printed["options"]["bootstrap_groups"] == 5
    assert any("5 random groups" in note for note in printed["notes"])


def test_grouped_on_standardised_features(client, runs):  # noqa: F811 (the fixtures)
    x, y = rows(client, runs["bert"], 1), rows(client, runs["gpt2"], 2)
    zx, zy = (x - x.mean(0)) / x.std(0), (y - y.mean(0)) / y.std(0)
    result = client.cka_stats(runs["bert"], runs["gpt2"], layers_a=[1], layers_b=[2], standardize=True, bootstrap=20,
                              seed=4, bootstrap_method="grouped", bootstrap_groups=6)
    weights = group_poisson_weights(4, 20, 6)[:, sample_groups(4, np.arange(40), 6)]
    boot_d = np.array([debiased_resampled_numpy(zx, zy, w) for w in weights])
    np.testing.assert_allclose(result.debiased_ci[0, 0], np.quantile(boot_d, [0.025, 0.975]), atol=1e-9)
    assert result.provenance.options["standardize"] is True


def test_map_finalize_merges_in_a_task_or_finalizes_in_the_one_map_task(module_server, client, runs):  # noqa: F811
    from actstore.metrics.similarity.grouped_cka import GroupedBootstrapCKA

    executor = module_server.service.queries.parts.executor
    sources = [(runs["bert"], [2]), (runs["gpt2"], [1])]
    make = lambda: GroupedBootstrapCKA([16, 16], [(0, 1)], 25, 5, seed=3)  # noqa: E731
    local = make()
    local.update([rows(client, runs["bert"], 2), rows(client, runs["gpt2"], 1)])
    expected = local.finalize().stats()
    three = executor.map_finalize(40, sources, [make()], executor.row_groups(40, 3))  # merged in a reduce task
    one = executor.map_finalize(40, sources, [make()], executor.row_groups(40, 1))  # finalized in the map task
    shared = executor.map_finalize(40, sources, make().split(2), executor.row_groups(40, 2))  # two shares, side by side
    for terms in (three, one, shared):
        stats = terms[0].stats(*terms[1:])
        np.testing.assert_allclose(stats.bootstrap_debiased, expected.bootstrap_debiased, atol=1e-9)
        np.testing.assert_allclose(stats.bootstrap_biased, expected.bootstrap_biased, atol=1e-9)
