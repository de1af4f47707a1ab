"""`actstore experiment --seeds` end to end on the smoke recipe, through a real server."""

from __future__ import annotations

import re

import pytest

from actstore.errors import InvalidArgument
from actstore.experiment import run_experiment, write_report
from tests.experiment.test_claims import FakeLens, result


@pytest.mark.slow  # 8 trainings, captures and lens queries: minutes on 2 loaded cores
def test_experiment_over_two_seeds_reports_mean_spread_and_verdicts(server, client, tmp_path):
    report = run_experiment("vit-fmnist", tmp_path / "out", smoke=True, seeds=[0, 1], steps=2,
                            address=f"127.0.0.1:{server.port}", beta=0.5)
    text = report.read_text()
    assert "seeds 0, 1" in text and "ce-reg beta = 0.5" in text
    assert "only if it holds on every seed" in text
    claims = [line for line in text.splitlines() if re.match(r"\| [1-4][ab]?\. ", line)]
    assert len(claims) == 5
    for line in claims:  # baseline and aligned as mean ± std (min..max), holds on k/2, a verdict
        assert len(re.findall(r"-?\d+\.\d{4} ± \d+\.\d{4} \(", line)) == 2, line
        assert re.search(r"\| [0-2]/2 \|", line) and "0: " in line and "1: " in line, line
        assert re.search(r"\*\*(reproduces|does not reproduce|not testable)\*\*", line), line
    for name in ("accuracy.png", "cos_to_last.png", "saturation.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    # every method trained once per seed, under a name with the asked steps (and beta for ce-reg)
    aliases = {a for m in client.models() for a in m.aliases}
    for seed in (0, 1):
        for method in ("standard", "aligned", "multi-exit"):
            assert f"vit-fmnist-smoke-{method}-steps2-s{seed}" in aliases
        assert f"vit-fmnist-smoke-ce-reg-beta0.5-steps2-s{seed}" in aliases
    ce_reg = next(m for m in client.models() if "vit-fmnist-smoke-ce-reg-beta0.5-steps2-s1" in m.aliases)
    assert ce_reg.lineage["beta"] == 0.5 and ce_reg.lineage["seed"] == 1


def test_beta_is_checked(client):
    with pytest.raises(InvalidArgument, match="beta"):
        client.train("vit-fmnist", "ce-reg", smoke=True, beta=-1.0)


def test_report_over_seeds_from_given_answers(tmp_path):
    """The report's tables and verdicts from fixed answers (no training): seed 1 breaks claim 2."""
    def seed(saturation_aligned):
        std = result("standard", [0.1, 0.2, 0.3, 0.9], [0.1, 0.2, 0.4, 1.0], [0, 0, 1, 9], 3, [1.0, 1.0])
        ali = result("aligned", [0.1, 0.5, 0.7, 0.88], [0.2, 0.5, 0.7, 1.0], saturation_aligned, 2, [1.6, 1.5])
        own = FakeLens([0.1, 0.5, 0.7, 0.9], [0, 0, 0, 1], 2, [1.8, 1.7], [0.9, 0.9])
        mex = result("multi-exit", [0.1, 0.2, 0.3, 0.9], [0, 0, 0, 1], [0, 0, 1, 9], 3, [1.0, 1.0], own)
        return {"standard": std, "aligned": ali, "multi-exit": mex}

    results = {0: seed([0, 5, 4, 1]), 1: seed([0, 0, 0, 10])}
    text = write_report("vit-fmnist", True, 0.1, 0.1, results, {"standard": 1.0}, tmp_path, 2.0).read_text()
    rows = {line.split(" |")[0]: line for line in text.splitlines() if re.match(r"\| [1-4][ab]?\. ", line)}
    assert "**reproduces**" in rows["| 1a. Aligned training raises shallow-layer accuracy (mean over layers 1..L-1)"]
    claim2 = rows["| 2. It moves saturation earlier (mean saturation layer)"]
    assert "**does not reproduce**" in claim2 and "| 1/2 |" in claim2 and "0: yes, 1: no" in claim2
    # the aligned mean saturation layers are 1.6 and 3.0: mean 2.3, sample std 1.4 / sqrt 2
    assert "2.3000 ± 0.9899 (1.6000..3.0000)" in claim2
    assert (tmp_path / "accuracy.png").stat().st_size > 0
