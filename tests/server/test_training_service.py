"""Training through the service: a smoke-size run of each recipe, its checkpoints registered with
lineage, then captured and queried with the logit lens (the path `actstore experiment` takes)."""

from __future__ import annotations

import numpy as np
import pytest

from actstore.errors import InvalidArgument, NotFound
from actstore.training import get_recipe

pytestmark = pytest.mark.long  # minutes of servers, clusters or venvs: started first (tests/conftest.py)


def _eval_dataset(client, recipe: str) -> str:
    source = get_recipe(recipe, smoke=True).eval_source()
    name = f"{recipe}-eval"
    client.register_dataset(builtin=source["name"], limit=source["limit"], seed=source["seed"],
                            split=source.get("split"), name=name)
    return name


def test_multi_exit_vit_trains_registers_and_lenses(client):
    model = client.train("vit-fmnist", "multi-exit", smoke=True)
    steps = get_recipe("vit-fmnist", smoke=True).steps
    assert f"vit-fmnist-smoke-multi-exit-s0@step{steps}" in model.aliases
    lineage = {m.digest: m for m in client.models()}
    assert len(lineage) >= 2, "every checkpoint is registered, not only the last"
    run = client.capture(model.digest, _eval_dataset(client, "vit-fmnist")).run_key
    shared = client.lens(run)
    own = client.lens(run, heads="exits")
    assert shared.accuracy.shape == own.accuracy.shape == (model.num_layers + 1,)
    # the last exit head is a copy of the model's own classifier: layer L agrees exactly
    assert own.accuracy[-1] == shared.accuracy[-1]
    assert np.all(shared.saturation_counts.sum() == shared.n)
    with pytest.raises(Exception, match="no exit heads"):
        other = client.train("vit-fmnist", "aligned", smoke=True)
        client.lens(client.capture(other.digest, "vit-fmnist-eval").run_key, heads="exits")


def test_causal_lm_recipe_lens_per_token(client):
    model = client.train("gpt2-austen", "aligned", smoke=True)
    assert model.kind == "causal-lm"
    run = client.capture(model.digest, _eval_dataset(client, "gpt2-austen"), pooling="tokens",
                         max_len=get_recipe("gpt2-austen", smoke=True).max_len).run_key
    lens = client.lens(run)
    assert lens.n == int(lens.saturation_counts.sum()) > 0
    assert "next-token" in lens.notes[0]


def test_training_lineage_and_bad_requests(client):
    model = client.train("vit-fmnist", "standard", smoke=True, seed=3)
    steps = get_recipe("vit-fmnist", smoke=True).steps
    assert {k: model.lineage[k] for k in ("recipe", "method", "seed", "step")} == \
        {"recipe": "vit-fmnist", "method": "standard", "seed": 3, "step": steps}
    parent = model.lineage["parent"]
    assert parent is not None and any(f"@{parent.replace('-', '')}" in a for m in client.models() for a in m.aliases)
    with pytest.raises(NotFound, match="no recipe 'nope'"):
        client.train("nope", "standard", smoke=True)
    with pytest.raises(InvalidArgument, match="method 'odd'"):
        client.train("vit-fmnist", "odd", smoke=True)


def test_runs_with_other_steps_keep_their_own_step_names(client):
    """Two runs differing only in --steps: each checkpoint name stays with its own run (the second
    run's @stepK moved the first's before: a progression then mixed both runs)."""
    short = client.train("vit-fmnist", "standard", smoke=True, steps=4)
    longer = client.train("vit-fmnist", "standard", smoke=True, steps=6)
    assert "vit-fmnist-smoke-standard-steps4-s0" in short.aliases
    assert "vit-fmnist-smoke-standard-steps6-s0" in longer.aliases
    base, short_steps = client.training_steps("vit-fmnist-smoke-standard-steps4-s0")
    assert base == "vit-fmnist-smoke-standard-steps4-s0" and short_steps[-1] == (4, short.digest)
    _, longer_steps = client.training_steps("vit-fmnist-smoke-standard-steps6-s0")
    assert longer_steps[-1] == (6, longer.digest) and short.digest != longer.digest
