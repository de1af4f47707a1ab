"""Dry runs through a real server: a capture plan (rows, shards, bytes from measured compression,
time from finished jobs) and a CKA matrix plan (the job's own mode, tiles and FLOPs)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from actstore.errors import InvalidArgument
from actstore.metrics.similarity import cka_mode_costs
from tests.factories import sentences

N = 20


@pytest.fixture(scope="module")
def registered(module_client, tiny_models):
    module_client.register_model(tiny_models["bert"], name="bert")
    module_client.register_dataset(texts=sentences(N, seed=7), name="first")
    module_client.register_dataset(texts=sentences(N, seed=8), name="second")
    return module_client


def test_capture_plan_before_and_after_a_capture(registered):
    client = registered
    plan = client.plan_capture("bert", "first", pooling="mean", site="resid_post,mlp_out")
    assert list(plan.sites) == ["resid_post", "mlp_out"] and not any(plan.stored.values())
    assert (plan.n, plan.rows, plan.num_shards, plan.num_layers, plan.width) == (N, N, 3, 3, 16)  # shard_rows 8
    assert plan.raw_bytes == 2 * N * 4 * 16 * 2  # two runs of float16
    assert plan.compression == 1.0 and plan.compression_basis.startswith("dtype only")
    assert plan.seconds == 0 and "no finished capture" in plan.seconds_basis

    result = client.capture("bert", "first", pooling="mean", site="resid_post,mlp_out")
    assert result.runs == plan.sites  # the plan names the runs the capture makes

    stored = client.plan_capture("bert", "first", pooling="mean", site="resid_post,mlp_out")
    assert all(stored.stored.values()) and stored.raw_bytes == 0 and "nothing to compute" in stored.seconds_basis

    other = client.plan_capture("bert", "second", pooling="mean")
    measured = sum(client.describe(k).stored_bytes for k in result.runs.values()) / plan.raw_bytes
    assert other.compression == pytest.approx(measured) and "2 committed float16 run(s), 2 of this model" in \
        other.compression_basis
    assert other.stored_bytes == int(other.raw_bytes * measured)
    assert other.seconds > 0 and "1 recent capture job(s) of this model" in other.seconds_basis


def test_token_plan_counts_the_tokens_the_capture_stores(registered):
    plan = registered.plan_capture("bert", "second", pooling="tokens", site="attn_out")
    result = registered.capture("bert", "second", pooling="tokens", site="attn_out")
    run = registered.describe(result.run_key)
    assert (plan.rows, plan.num_shards) == (run.rows, run.num_shards) and plan.rows > N
    assert registered.plan_capture("bert", "second", pooling="tokens").rows == run.rows  # from the stored run


def test_a_plan_refuses_what_a_submit_refuses(registered):
    with pytest.raises(InvalidArgument, match="matches no module"):
        registered.plan_capture("bert", "first", site="encoder.layr.*.output")
    with pytest.raises(InvalidArgument, match="max_len 1 must be >= 2"):
        registered.plan_capture("bert", "first", max_len=1)


def test_cka_matrix_plan_is_the_jobs_plan(registered):
    client = registered
    runs = list(client.capture("bert", "first", pooling="mean", site="resid_post,mlp_out").runs.values())
    plan = client.plan_cka_matrix(runs)
    assert (plan.blocks, plan.rows, plan.run_keys, plan.cached) == (8, N, runs, False)
    assert plan.mode == "gram" and plan.memory_bytes <= plan.memory_limit_bytes  # n is small against 8 x 16
    assert plan.flops == pytest.approx(2 * cka_mode_costs([16] * 8, N)[plan.mode])
    result = client.cka_matrix(runs)
    # the sample-space tiles of k panels (server/gram_matrix.py): k(k+1)/2 tile tasks after the
    # map tasks of the means; the data is read once for the means and once per panel
    panels, tiles, means = (int(w) for w in re.match(r"gram space, (\d+) panels of \d+ rows, (\d+) tile tasks, "
                                                      r"pieces of \d+ rows, (\d+) map tasks", result.notes[0]).groups())
    assert plan.tiles == tiles == panels * (panels + 1) // 2 and plan.map_tasks == tiles + means
    assert plan.read_bytes == (panels + 1) * 8 * N * 16 * 2
    assert np.isfinite(result.biased).all() and client.plan_cka_matrix(runs).cached
