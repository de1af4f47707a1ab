"""What every registered measure must do end to end, for a measure module's test to call: through a
real server, the client, the CLI, the matrix job (MOMENTS measures), the cache and provenance, the
values equal to an independent float64 formula on the rows read back. Nothing here names a measure:
a new measure module needs only its own test, which passes its identifier and reference."""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import pytest

from actstore import measures
from tests.factories import sentences
from tests.test_cli import actstore, ok

Reference = Callable[[np.ndarray, np.ndarray], float]


@pytest.fixture(scope="module")
def client(module_client):
    return module_client


@pytest.fixture(scope="module")
def runs(client, tiny_models) -> list[str]:
    """A tiny BERT (16 wide) and GPT-2 over the same 96 texts, mean-pooled: two runs, 3 layers each."""
    for name in ("bert", "gpt2"):
        client.register_model(tiny_models[name], name=name)
    client.register_dataset(texts=sentences(96, seed=11), name="measures")
    jobs = [client.submit_capture(name, "measures", pooling="mean") for name in ("bert", "gpt2")]
    return [client.wait(job.job_id).target for job in jobs]


def streamed(name: str, x: np.ndarray, y: np.ndarray, chunks: int = 5, **options) -> np.ndarray:
    """The registered measure between blocks x and y (2 x 2, both orders), from moments accumulated
    in `chunks` parts merged in reverse order."""
    from actstore.metrics.similarity import MomentMeasures

    parts = []
    for rows in np.array_split(np.arange(len(x)), chunks):
        part = MomentMeasures([x.shape[1], y.shape[1]])
        part.update([x[rows], y[rows]])
        parts.append(part)
    total = parts[-1]
    for part in reversed(parts[:-1]):
        total.merge(part)
    spec = measures.get(name)
    return total.finalize(spec.build(spec.resolve(options)), [0, 1], [0, 1])


def layers_of(client, run: str) -> list[np.ndarray]:
    info = client.describe(run)
    return [client.read_activations(run, layer)[0].astype(np.float64) for layer in range(info.num_layers + 1)]


def assert_served(client, server, runs: list[str], identifier: str, reference: Reference, **options) -> None:
    spec = measures.get(identifier)
    xs, ys = layers_of(client, runs[0]), layers_of(client, runs[1])
    # the client (the generic Measure RPC), against the formula on every layer pair
    first = client.measure(identifier, runs[0], runs[1], refresh=True, **options)
    expected = np.array([[reference(x, y) for y in ys] for x in xs])
    np.testing.assert_allclose(first.values, expected, rtol=1e-7, atol=1e-9)
    lo, hi = spec.bounds
    assert (lo is None or (first.values >= lo - 1e-12).all()) and (hi is None or (first.values <= hi + 1e-12).all())
    # provenance names the measure; the second answer is the cached one
    filled = spec.filled(spec.resolve(options))
    assert first.provenance.metric == filled and first.provenance.options["measure"] == identifier
    assert first.provenance.definition_version == spec.version and not first.provenance.cached
    again = client.measure(identifier, runs[0], runs[1], **options)
    assert again.provenance.cached and again.provenance.result_key == first.provenance.result_key
    np.testing.assert_array_equal(again.values, first.values)
    # the CLI: the similarity command and the measures table
    flags = [f for name, value in options.items() for f in (f"--{name.replace('_', '-')}", str(value))]
    out = json.loads(ok(actstore("similarity", identifier, runs[0], runs[1], "--json", *flags, server=server)))
    assert out["metric"] == filled
    np.testing.assert_allclose(out["matrix"], first.values, rtol=1e-12)
    assert identifier in ok(actstore("measures"))
    assert f"| `{identifier}` |" in ok(actstore("measures", "--markdown"))
    if spec.needs != measures.MOMENTS:
        return
    # the cross-model job: every layer of both runs in one pass, blocks equal to the pair queries
    matrix = client.measure_matrix(runs, identifier, **options)
    assert matrix.identifier == filled and matrix.provenance.options["measure"] == identifier
    np.testing.assert_allclose(matrix.block(0, 1), first.values, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(matrix.block(1, 0), client.measure(identifier, runs[1], runs[0], **options).values,
                               rtol=1e-9, atol=1e-12)
    text = ok(actstore("cka-matrix", *runs, "--measure", identifier, *flags, server=server))
    assert f"{filled} matrix" in text
