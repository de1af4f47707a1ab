"""Stitching with the optional tuning step (METRICS.md, "Model stitching"): a few Adam steps of the
affine map on B's task loss over the training prompts, with the penalty before and after."""

from __future__ import annotations

import pytest

from actstore.errors import InvalidArgument, ResourceExhausted
from tests.server.test_metric_engine import unique_sentences

TEXTS = unique_sentences(40, seed=5)


@pytest.fixture(scope="module")
def runs(module_client, tiny_models):
    client = module_client
    for name in ("gpt2", "llama"):
        client.register_model(tiny_models[name], name=name)
    client.register_dataset(texts=TEXTS, name="stitch")
    return {name: client.capture(name, "stitch", pooling="tokens").run_key for name in ("gpt2", "llama")}


def test_tuning_lowers_the_training_loss_and_reports_both_penalties(module_client, runs):
    client = module_client
    plain = client.stitch(runs["gpt2"], 1, runs["llama"], 2).scalars
    tuned = client.stitch(runs["gpt2"], 1, runs["llama"], 2, tune_steps=25, tune_lr=0.01)
    s = tuned.scalars
    # the least-squares numbers are the untuned query's, the tuned ones come on top
    for key in ("own_loss", "stitched_loss", "penalty", "test_r2"):
        assert s[key] == pytest.approx(plain[key], abs=1e-9), key
    assert "tuned_penalty" not in plain and s["tune_steps"] == 25
    assert s["tuned_penalty"] == pytest.approx(s["tuned_stitched_loss"] - s["own_loss"], abs=1e-12)
    # the objective tuning descends: B's loss through the stitch on the training prompts
    assert s["tuned_train_stitched_loss"] < s["train_stitched_loss"] - 1e-3, s
    assert s["tuned_penalty"] != s["penalty"]
    assert any("25 Adam steps" in note for note in tuned.notes)
    assert tuned.provenance.options["tune_steps"] == 25 and "tune_steps" not in client.stitch(
        runs["gpt2"], 1, runs["llama"], 2).provenance.options
    # seeded: the same request recomputed gives the same numbers
    again = client.stitch(runs["gpt2"], 1, runs["llama"], 2, tune_steps=25, tune_lr=0.01, refresh=True).scalars
    assert again["tuned_penalty"] == pytest.approx(s["tuned_penalty"], abs=1e-6)


def test_tuning_options_are_checked(module_client, runs):
    with pytest.raises(InvalidArgument, match="tune_steps"):
        module_client.stitch(runs["gpt2"], 1, runs["llama"], 2, tune_steps=-1)
    with pytest.raises(ResourceExhausted, match="ACTSTORE_MAX_STITCH_TUNE_STEPS"):
        module_client.stitch(runs["gpt2"], 1, runs["llama"], 2, tune_steps=10**6)
