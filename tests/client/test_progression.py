"""Checkpoint progression over a smoke training run's registered steps, against the per-step
queries and an independent CKA formula."""

from __future__ import annotations

import numpy as np
import pytest

from actstore.cli import main
from actstore.errors import InvalidArgument, NotFound
from actstore.training import get_recipe
from tests.formulas import cka_numpy


@pytest.fixture(scope="module")
def trained(module_client, module_server):
    client = module_client
    recipe = get_recipe("vit-fmnist", smoke=True)
    source = recipe.eval_source()
    client.register_dataset(builtin=source["name"], limit=source["limit"], seed=source["seed"],
                            split=source.get("split"), name="fmnist-eval")
    model = client.train("vit-fmnist", "aligned", smoke=True)
    return model, f"127.0.0.1:{module_server.port}"


def test_cka_to_final_over_steps(module_client, trained):
    client = module_client
    model, _ = trained
    base, steps = client.training_steps("vit-fmnist-smoke-aligned-s0")
    expected_steps = list(range(2, get_recipe("vit-fmnist", smoke=True).steps + 1, 2))
    assert base == "vit-fmnist-smoke-aligned-s0" and [s for s, _ in steps] == expected_steps
    assert client.training_steps(model.digest[:12]) == (base, steps)  # a checkpoint names its run too
    result = client.progression("vit-fmnist-smoke-aligned-s0@step2", "fmnist-eval")
    assert result.steps.tolist() == expected_steps and result.layers == list(range(model.num_layers + 1))
    assert result.values.shape == (len(expected_steps), model.num_layers + 1)
    np.testing.assert_allclose(result.values[-1, 1:], 1.0, atol=1e-9)  # the final step against itself
    # layer 0 is the CLS embedding, the same for every image: CKA of a constant is NaN by definition
    assert np.isnan(result.values[:, 0]).all()
    final = [client.read_activations(result.runs[-1], layer)[0].astype(np.float64) for layer in result.layers]
    first = [client.read_activations(result.runs[0], layer)[0].astype(np.float64) for layer in result.layers]
    expected = [cka_numpy(a, b) for a, b in zip(first[1:], final[1:])]
    np.testing.assert_allclose(result.values[0, 1:], expected, atol=1e-9)
    assert result.models == [d for _, d in steps]


def test_entropy_and_lens_progression_are_the_per_step_queries(module_client, trained):
    client = module_client
    entropy = client.progression("vit-fmnist-smoke-aligned-s0", "fmnist-eval", metric="dataset-entropy",
                                 layers=[0, 2])
    lens = client.progression("vit-fmnist-smoke-aligned-s0", "fmnist-eval", metric="lens-accuracy")
    for s, run in enumerate(entropy.runs):
        np.testing.assert_allclose(entropy.values[s], client.entropy("dataset_entropy", run, layers=[0, 2]).values)
        np.testing.assert_allclose(lens.values[s], client.lens(run).accuracy)
    assert entropy.layers == [0, 2]
    with pytest.raises(NotFound, match="actstore train"):
        client.progression("no-such-model", "fmnist-eval")
    with pytest.raises(InvalidArgument, match="metric"):
        client.progression("vit-fmnist-smoke-aligned-s0", "fmnist-eval", metric="cka")
    with pytest.raises(InvalidArgument, match="layers"):
        client.progression("vit-fmnist-smoke-aligned-s0", "fmnist-eval", layers=[99])


def test_cli_progression_plots_one_curve_per_layer(trained, tmp_path, capsys):
    _, address = trained
    plot = tmp_path / "progression.png"
    assert main(["progression", "vit-fmnist-smoke-aligned-s0", "--dataset", "fmnist-eval", "--address", address,
                 "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "cka-to-final of vit-fmnist-smoke-aligned-s0 over 2 registered steps" in out
    assert plot.stat().st_size > 0
