"""MEASURE similarity queries and the matrix job's `--measure` through gRPC: every streamed measure
against the independent data-space formulas on the stored activations, provenance naming the
similarity-repository identifier, the cache, validation, and the `actstore similarity` command."""

from __future__ import annotations

import json

import numpy as np
import pytest

from actstore.errors import InvalidArgument
from tests.factories import sentences
from tests.measure_formulas import (
    cca_reference,
    knn_reference,
    procrustes_reference,
    pwcca_reference,
    rbf_cka_reference,
    rsa_reference,
    shape_metric_reference,
    svcca_reference,
)
from tests.measures import served
from tests.measures.served import layers_of
from tests.server.test_cka_matrix_job import slow_server  # noqa: F401  (a fixture)
from tests.test_cli import actstore, ok

pytestmark = pytest.mark.long  # minutes of servers, clusters or venvs: started first (tests/conftest.py)

ALPHA = 0.25
client, runs = served.client, served.runs  # the fixtures: a tiny BERT and GPT-2 run over 96 texts
REFERENCES = {
    "procrustes-distance=angular": lambda x, y: procrustes_reference(x, y, "angular"),
    "procrustes-distance=euclidean": lambda x, y: procrustes_reference(x, y, "euclidean"),
    "shape_metric-alpha={alpha}-distance=angular": lambda x, y: shape_metric_reference(x, y, ALPHA),
    "cca-squared_score": lambda x, y: cca_reference(x, y, squared=True),
    "cca-score": lambda x, y: cca_reference(x, y, squared=False),
    "svcca-var=0.99-score": svcca_reference,
    "pwcca-score": pwcca_reference,
}


@pytest.mark.parametrize("measure", list(REFERENCES))
def test_each_streamed_measure_equals_the_formula_on_the_stored_rows(client, runs, measure):
    result = client.measure(measure, runs[0], runs[1], layers_a=[0, 2], layers_b=[1, 2], alpha=ALPHA)
    xs, ys = layers_of(client, runs[0]), layers_of(client, runs[1])
    expected = [[REFERENCES[measure](xs[a], ys[b]) for b in (1, 2)] for a in (0, 2)]
    np.testing.assert_allclose(result.values, expected, rtol=1e-7, atol=1e-9)
    identifier = measure.replace("{alpha}", "0.25")
    assert result.provenance.metric == identifier
    assert result.provenance.options["identifier"] == identifier
    assert result.provenance.options["measure"] == measure
    assert result.layers_a == [0, 2] and result.layers_b == [1, 2] and result.scalars["n"] == 96
    assert ("alpha" in result.provenance.options) == ("{alpha}" in measure)


IN_MEMORY = {
    "rsa-rdm=cosine-compare=spearman": (lambda x, y: rsa_reference(x, y, "cosine", "spearman"),
                                        "rsa-rdm=cosine-compare=spearman"),
    "rsa-rdm=euclidean-compare=pearson": (lambda x, y: rsa_reference(x, y, "euclidean", "pearson"),
                                          "rsa-rdm=euclidean-compare=pearson"),
    "cka-kernel=(rbf-sigma={sigma})-hsic=gretton-score": (lambda x, y: rbf_cka_reference(x, y, 0.5, False),
                                                          "cka-kernel=(rbf-sigma={sigma})-hsic=gretton-score"),
    "cknna-topk={topk}": (lambda x, y: knn_reference(x, y, 6, "cknna"), "cknna-topk=6"),
    "cycle_knn-topk={topk}": (lambda x, y: knn_reference(x, y, 6, "cycle_knn"), "cycle_knn-topk=6"),
}


@pytest.mark.parametrize("measure", list(IN_MEMORY))
def test_in_memory_measures_equal_the_formulas_on_the_stored_rows(client, runs, measure):
    reference, identifier = IN_MEMORY[measure]
    result = client.measure(measure, runs[0], runs[1], layers_a=[0, 2], layers_b=[2], sigma_fraction=0.5, k=6)
    xs, ys = layers_of(client, runs[0]), layers_of(client, runs[1])
    np.testing.assert_allclose(result.values, [[reference(xs[0], ys[2])], [reference(xs[2], ys[2])]],
                               rtol=1e-7, atol=1e-9)
    assert result.provenance.metric == identifier and result.provenance.options["identifier"] == identifier
    assert ("sigma_fraction" in result.provenance.options) == ("rbf" in measure)
    assert ("k" in result.provenance.options) == ("knn" in measure)


def test_in_memory_measures_are_refused_by_the_matrix_job(client, runs):
    with pytest.raises(InvalidArgument, match="ask for rsa-rdm=cosine-compare=pearson between run pairs"):
        client.measure_matrix(runs, "rsa-rdm=cosine-compare=pearson")
    with pytest.raises(InvalidArgument, match="k=96 must be between 1 and n-1=95"):
        client.measure("cknna-topk={topk}", runs[0], k=96)


def test_cached_and_parameters_key_the_cache(client, runs):
    shape = "shape_metric-alpha={alpha}-distance=angular"
    first = client.measure(shape, runs[0], alpha=0.0, refresh=True)
    again = client.measure(shape, runs[0], alpha=0.0)
    other = client.measure(shape, runs[0], alpha=1.0)
    assert not first.provenance.cached and again.provenance.cached
    np.testing.assert_array_equal(first.values, again.values)
    assert not other.provenance.cached and other.provenance.metric == "shape_metric-alpha=1-distance=angular"
    # alpha = 1 is the angular Procrustes distance; within one run the diagonal is 0
    procrustes = client.measure("procrustes-distance=angular", runs[0])
    np.testing.assert_allclose(other.values, procrustes.values, atol=1e-9)
    np.testing.assert_array_equal(np.diag(procrustes.values), 0.0)
    # alpha is ignored by the measures that do not use it: one cached answer
    assert client.measure("cca-score", runs[0], alpha=0.5).provenance.result_key == \
        client.measure("cca-score", runs[0]).provenance.result_key


def test_matrix_job_computes_a_streamed_measure_for_all_pairs(client, runs):
    matrix = client.measure_matrix(runs, "pwcca-score")
    assert matrix.identifier == "pwcca-score" and matrix.provenance.options["measure"] == "pwcca-score"
    for i, run_i in enumerate(runs):
        for j, run_j in enumerate(runs):
            np.testing.assert_allclose(matrix.block(i, j), client.measure("pwcca-score", run_i, run_j).values,
                                       rtol=1e-9, atol=1e-12)
    again = client.measure_matrix(runs, "pwcca-score")
    assert again.provenance.cached
    cka = client.cka_matrix(runs)
    assert cka.provenance.result_key != matrix.provenance.result_key


def test_refusals(client, runs):
    with pytest.raises(InvalidArgument, match="measure 'cka' is not one of"):
        client.measure("cka", runs[0])
    with pytest.raises(InvalidArgument, match="alpha 2.0 must be in"):
        client.measure("shape_metric-alpha={alpha}-distance=angular", runs[0], alpha=2.0)
    from actstore._proto.actstore.v1 import actstore_pb2 as pb

    with pytest.raises(InvalidArgument, match="name the measure"):  # the server, not only the client
        client._connection.query.Similarity(pb.SimilarityRequest(metric=pb.SimilarityRequest.MEASURE, run_a=runs[0]))


def test_similarity_command(client, runs, module_server, tmp_path):
    out = ok(actstore("similarity", "cca-squared_score", runs[0], runs[1], "--layers-a", "1", "--json",
                      server=module_server))
    answer = json.loads(out)
    assert answer["metric"] == "cca-squared_score"
    expected = client.measure("cca-squared_score", runs[0], runs[1], layers_a=[1]).values
    np.testing.assert_allclose(answer["matrix"], expected)
    plot = tmp_path / "m.png"
    text = ok(actstore("cka-matrix", *runs, "--measure", "procrustes-distance=angular", "--plot", str(plot),
                       server=module_server))
    assert "procrustes-distance=angular matrix" in text and plot.exists()


def test_the_legacy_fields_resolve_through_the_table_and_the_generic_rpc_is_strict(client, runs):
    """Similarity(MEASURE) and SubmitCKAMatrix keep their wire form: alpha 0 is a value, a field the
    measure does not take is not read (as before); the generic Measure RPC refuses what the measure
    does not take, and checks the values against the measure's options."""
    from actstore._proto.actstore.v1 import actstore_pb2 as pb

    shape = "shape_metric-alpha={alpha}-distance=angular"
    query = client._connection.query
    legacy = query.Similarity(pb.SimilarityRequest(metric=pb.SimilarityRequest.MEASURE, run_a=runs[0],
                                                   layers_a=[1], measure=shape, alpha=0.0))
    assert json.loads(legacy.provenance.options_json)["alpha"] == 0.0
    assert client.measure(shape, runs[0], layers_a=[1], alpha=0.0).provenance.metric == \
        "shape_metric-alpha=0-distance=angular"
    cca = query.Similarity(pb.SimilarityRequest(metric=pb.SimilarityRequest.MEASURE, run_a=runs[0],
                                                layers_a=[1], measure="cca-score", alpha=0.5, k=3))
    assert "alpha" not in json.loads(cca.provenance.options_json)
    with pytest.raises(InvalidArgument, match="cca-score does not take alpha"):
        query.Measure(pb.MeasureRequest(measure="cca-score", run_a=runs[0], options_json='{"alpha": 0.5}'))
    with pytest.raises(InvalidArgument, match="alpha 2.0 must be in"):
        query.Measure(pb.MeasureRequest(measure=shape, run_a=runs[0], options_json='{"alpha": 2}'))
    with pytest.raises(InvalidArgument, match="options_json must be a JSON object"):
        query.Measure(pb.MeasureRequest(measure=shape, run_a=runs[0], options_json="[1]"))
    with pytest.raises(InvalidArgument, match="metric 'cka-score' is not one of"):  # cka is a metric the RPC serves
        query.Measure(pb.MeasureRequest(measure="cka-score", run_a=runs[0]))
    with pytest.raises(InvalidArgument, match="cca-score does not take beta"):
        client.measure("cca-score", runs[0], beta=1)


def test_in_memory_measures_hold_b_in_groups_within_the_limit(tmp_path, ray_cluster, tiny_models, client, runs):
    """A server whose limit holds only a few prepared layers answers in groups, the same numbers;
    one that cannot hold two is refused with RESOURCE_EXHAUSTED."""
    from actstore.client import Client
    from actstore.errors import ResourceExhausted
    from actstore.server.app import start_server
    from tests.conftest import make_settings

    n, width = 96, 16
    per_layer, working = 8 * n * n, 8 * n * n * 4 + 8 * n * width * 2
    expected = client.measure("rsa-rdm=cosine-compare=pearson", runs[0], runs[1]).values
    for limit, group in [(working + 3 * per_layer, 2), (working + per_layer, None)]:
        # one store: the second server (another limit) finds the runs the first captured
        running = start_server(make_settings(tmp_path / "store", max_accumulator_bytes=limit))
        try:
            with Client(f"127.0.0.1:{running.port}") as small:
                for name in ("bert", "gpt2"):
                    small.register_model(tiny_models[name], name=name)
                small.register_dataset(texts=sentences(96, seed=11), name="measures")
                keys = [small.capture(name, "measures", pooling="mean").run_key for name in ("bert", "gpt2")]
                assert keys == runs
                if group is None:
                    with pytest.raises(ResourceExhausted, match="two prepared layers"):
                        small.measure("rsa-rdm=cosine-compare=pearson", keys[0], keys[1])
                    continue
                answer = small.measure("rsa-rdm=cosine-compare=pearson", keys[0], keys[1])
                np.testing.assert_allclose(answer.values, expected, rtol=1e-12)
                assert f"in groups of {group}" in answer.notes[0]
        finally:
            running.stop()


def test_measure_matrix_job_cancels_and_resumes_from_partial_results(slow_server):  # noqa: F811 (the fixture)
    """The matrix job with a streamed measure checkpoints tiles of `values` like the CKA job: a
    cancelled job resumes from them and ends equal to the float64 formula on the stored rows (the
    pairwise queries equal that formula: `test_each_streamed_measure_equals_the_formula_...`; on this
    server's tiny accumulator limit each of them was a job of many tasks, most of this test's time)."""
    c, runs, store = slow_server
    job = c.submit_measure_matrix(runs, "cca-score")
    cancelled = False
    for final in c.watch(job.job_id):
        if not cancelled and final.total and final.total // 3 <= final.done < final.total:
            c.cancel(job.job_id)
            cancelled = True
    if final.status == "done":
        pytest.fail("the job finished before the cancel landed: the setup is not slow enough to test resuming")
    assert final.status == "cancelled" and any((store / "partials" / job.target).iterdir())
    resumed = c.submit_measure_matrix(runs, "cca-score")
    assert resumed.target == job.target and resumed.job_id != job.job_id
    events = list(c.watch(resumed.job_id))
    first = next(e for e in events if e.total)
    assert "resuming" in first.message or first.done > 0
    assert events[-1].status == "done" and not (store / "partials" / job.target).exists()
    result = c.measure_matrix(runs, "cca-score")
    assert result.provenance.cached and result.identifier == "cca-score"
    # against the float64 formula on the stored rows, where it is defined: a layer of full rank (the
    # last-token run's embedding layer spans 9 of 16 dimensions, where the QR formula is not CCA's)
    stored = [layers_of(c, run) for run in runs]
    full = [[np.linalg.matrix_rank(x - x.mean(axis=0)) == x.shape[1] for x in xs] for xs in stored]
    for i, xs in enumerate(stored):
        for j, ys in enumerate(stored):
            expected = np.array([[REFERENCES["cca-score"](x, y) if full[i][a] and full[j][b] else np.nan
                                  for b, y in enumerate(ys)] for a, x in enumerate(xs)])
            defined = ~np.isnan(expected)
            np.testing.assert_allclose(result.block(i, j)[defined], expected[defined], rtol=1e-7, atol=1e-9)
    # a rank-deficient layer's entries against the pairwise query of that layer, both ways round
    deficient = [(i, a) for i, ranks in enumerate(full) for a, whole in enumerate(ranks) if not whole]
    assert deficient, "no rank-deficient layer: the pairwise part of this test checks nothing"
    for i, a in deficient:
        for j, run_j in enumerate(runs):
            pairwise = c.measure("cca-score", runs[i], run_j, layers_a=[a]).values[0]
            np.testing.assert_allclose(result.block(i, j)[a], pairwise, rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(result.block(j, i)[:, a], pairwise, rtol=1e-9, atol=1e-12)


def test_whitening_measures_say_when_too_few_samples_make_them_one(client, tiny_models):
    """n - 1 <= width: centred rows span at most n - 1 dimensions, so CCA is 1 by construction;
    the answer says so (Procrustes, which does not whiten, does not)."""
    client.register_model(tiny_models["bert"], name="bert")
    client.register_dataset(texts=sentences(12, seed=3), name="few")  # 12 samples, 16 wide
    run = client.capture("bert", "few", pooling="mean").run_key
    cca = client.measure("cca-squared_score", run, layers_a=[2], layers_b=[3])
    assert np.allclose(cca.values, 1.0) and any("1 by construction" in note for note in cca.notes)
    procrustes = client.measure("procrustes-distance=angular", run, layers_a=[2], layers_b=[3])
    assert not any("by construction" in note for note in procrustes.notes)


def test_result_keys_are_those_of_results_cached_before_the_registry(client, runs):
    """The registry must not move a cached result: each key is the one the code before it wrote
    (metric = the filled identifier, version 1, these option layouts), so results cached by an older
    server are found (provenance.cached) and not recomputed."""
    from actstore.store.keys import result_key

    shape = "shape_metric-alpha={alpha}-distance=angular"
    answer = client.measure(shape, runs[0], runs[1], layers_a=[1], layers_b=[0, 2], alpha=0.5)
    old = {"layers_a": [1], "layers_b": [0, 2], "measure": shape,
           "identifier": "shape_metric-alpha=0.5-distance=angular", "alpha": 0.5}
    assert answer.provenance.result_key == result_key(old["identifier"], 1, old, runs)
    knn = client.measure("cknna-topk={topk}", runs[0], layers_a=[2], layers_b=[2], k=5)
    old = {"layers_a": [2], "layers_b": [2], "measure": "cknna-topk={topk}", "identifier": "cknna-topk=5", "k": 5}
    assert knn.provenance.result_key == result_key("cknna-topk=5", 1, old, [runs[0], runs[0]])
    matrix = client.measure_matrix(runs, "cca-score")
    old = {"runs": 2, "measure": "cca-score", "identifier": "cca-score"}
    assert matrix.provenance.result_key == result_key("cca-score", 1, old, runs)
