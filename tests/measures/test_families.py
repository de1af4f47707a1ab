"""Every metric is a registered spec, and the generic Measure RPC (`Client.metric`) serves each one
through the same typed query and planner as its own RPC: the same numbers under the same result
key (the second asker gets the first one's cached result), and the same refusals."""

from __future__ import annotations

import numpy as np
import pytest

from actstore import measures
from actstore._proto.actstore.v1 import actstore_pb2 as pb
from actstore.errors import ActStoreError, InvalidArgument
from tests.measures.served import client, runs  # noqa: F401 (fixtures)
from tests.test_cli import actstore, ok

FAMILIES = {"cka", "cos", "minibatch_cka", "mutual_knn", "dataset_entropy", "prompt_entropy", "effective_rank",
            "curvature", "infonce", "dime", "lidar", "residual_norm", "nc1", "lens", "stitch", "probe"}


def test_every_metric_is_one_spec_listed_with_the_command_that_asks_for_it():
    every = measures.measures(query=None)
    identifiers = [spec.identifier for spec in every]
    assert len(identifiers) == len(set(identifiers)) and FAMILIES <= set(identifiers)
    from actstore.server.planners import Planner, families, family

    # every spec's family is registered, each with its typed query and its planner's answering method
    assert {spec.query for spec in every} == {f.name for f in families()}
    for spec in every:
        registered = family(spec.query)
        assert callable(registered.query.resolve) and issubclass(registered.planner, Planner)
        assert callable(getattr(registered.planner, registered.method))
    curves = {spec.identifier for spec in every if spec.curve}
    assert curves == {"dataset_entropy", "prompt_entropy", "effective_rank", "curvature", "infonce", "dime", "lidar",
                      "residual_norm", "nc1", "lens", "probe"}
    assert [spec.identifier for spec in measures.measures()] == [s.identifier for s in every if s.query == "measure"]
    listing = ok(actstore("measures"))
    for spec in every:
        assert spec.identifier in listing
    for command in ("actstore cka", "actstore entropy dime", "actstore residual-norm", "actstore nc1",
                    "actstore lens", "actstore stitch", "actstore knn", "actstore similarity nbs-score",
                    "actstore probe"):
        assert command in listing
    markdown = ok(actstore("measures", "--markdown"))
    assert "| `dataset_entropy` |" in markdown and "alpha=1.0" in markdown
    # the similarity command takes the registry's own measures and says where the others are asked
    out = actstore("similarity", "cka", "run")
    assert out.returncode != 0 and "ask `actstore cka`" in out.stderr
    # a flag of another measure's option is refused, not ignored (before any connection)
    out = actstore("similarity", "nbs-score", "run", "--alpha", "0.5")
    assert out.returncode == 2 and "nbs-score does not take --alpha" in out.stderr


def _same(answer, expected_arrays, expected_provenance) -> None:
    """The generic answer is the older RPC's cached result: same key, same numbers."""
    assert answer.provenance.cached and answer.provenance.result_key == expected_provenance.result_key
    for name, values in expected_arrays.items():
        np.testing.assert_array_equal(answer.arrays[name], values)


def test_the_similarity_family_through_the_generic_rpc(client, runs):  # noqa: F811
    cka = client.cka(runs[0], runs[1], layers_a=[0, 2], refresh=True)
    _same(client.metric("cka", runs[0], runs[1], layers_a=[0, 2]),
          {"biased": cka.biased, "debiased": cka.debiased}, cka.provenance)
    minibatch = client.minibatch_cka(runs[0], runs[1], batch_size=32, remainder="merge", refresh=True)
    _same(client.metric("minibatch_cka", runs[0], runs[1], batch_size=32, remainder="merge"),
          {"values": minibatch.values}, minibatch.provenance)
    knn = client.mutual_knn(runs[0], k=5, refresh=True)
    _same(client.metric("mutual_knn", runs[0], k=5), {"values": knn.values}, knn.provenance)
    cos = client.cos(runs[0], center="none", refresh=True)
    _same(client.metric("cos", runs[0], center="none"), {"mean": cos.mean}, cos.provenance)
    # the generic RPC refuses what the metric does not take, and the planner's own checks hold
    with pytest.raises(InvalidArgument, match="minibatch_cka does not take align"):
        client._connection.query.Measure(pb.MeasureRequest(measure="minibatch_cka", run_a=runs[0],
                                                options_json='{"align": "words", "batch_size": 8}'))
    with pytest.raises(InvalidArgument, match="cka does not take k"):
        client.metric("cka", runs[0], k=3)  # the client checks against the same spec first
    with pytest.raises(InvalidArgument, match="batch_size 0 must be an int between"):
        client.metric("minibatch_cka", runs[0])


def _outcome(ask):
    try:
        return "answer", ask()
    except ActStoreError as exc:
        return type(exc).__name__, str(exc)


def test_the_one_run_families_through_the_generic_rpc(client, runs):  # noqa: F811
    entropy = client.entropy("dataset_entropy", runs[0], layers=[1, 2], alpha=2.0, refresh=True)
    _same(client.metric("dataset_entropy", runs[0], layers_a=[1, 2], alpha=2.0), {"values": entropy.values},
          entropy.provenance)
    rank = client.entropy("effective_rank", runs[1], convention="roy-vetterli", refresh=True)
    _same(client.metric("effective_rank", runs[1], convention="roy-vetterli"), {"values": rank.values},
          rank.provenance)
    residual = client.residual_norm(runs[0], layers=[0, 1], refresh=True)
    _same(client.metric("residual_norm", runs[0], layers_a=[0, 1]), {"mean": residual.mean}, residual.provenance)
    # what an RPC refuses, the generic one refuses in the same words (one typed query, one planner)
    for generic, own in [
        (lambda: client.metric("nc1", runs[0]), lambda: client.neural_collapse(runs[0])),
        (lambda: client.metric("prompt_entropy", runs[0]), lambda: client.entropy("prompt_entropy", runs[0])),
        (lambda: client.metric("lens", runs[1], epsilon=0.2), lambda: client.lens(runs[1], epsilon=0.2)),
        (lambda: client.metric("stitch", runs[0], runs[1], layers_a=[1], layers_b=[2]),
         lambda: client.stitch(runs[0], 1, runs[1], 2)),
        (lambda: client.metric("dime", runs[0], permutations=10**9),
         lambda: client.entropy("dime", runs[0], permutations=10**9)),
    ]:
        found, expected = _outcome(generic), _outcome(own)
        if found[0] == "answer":
            assert expected[0] == "answer" and found[1].provenance.result_key == expected[1].provenance.result_key
        else:
            assert found == expected
    # a one-run metric takes no second run; a stitch joins exactly one layer to one
    with pytest.raises(InvalidArgument, match="dataset_entropy takes one run"):
        client.metric("dataset_entropy", runs[0], runs[1])
    with pytest.raises(InvalidArgument, match="give exactly one of each"):
        client.metric("stitch", runs[0], runs[1], layers_a=[1, 2], layers_b=[2])
    with pytest.raises(InvalidArgument, match="the lens reads every layer"):
        client.metric("lens", runs[1], layers_a=[1])
    with pytest.raises(InvalidArgument, match="metric 'no-such' is not one of nbs-score"):
        client._connection.query.Measure(pb.MeasureRequest(measure="no-such", run_a=runs[0]))


def test_the_entropy_tables_metrics_are_the_registrys():
    from actstore.options import ENTROPY

    registered = [spec.identifier for spec in measures.measures(query="entropy")]
    assert registered == list(ENTROPY.metric.choices)  # the older RPC's enum and the client check the table
    assert registered == [name.lower() for name in pb.EntropyRequest.Metric.keys()[1:]]
