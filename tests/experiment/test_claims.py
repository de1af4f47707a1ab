"""The claims over seeds: the verdict rule, the spread, and the per-seed checks of given answers."""

from __future__ import annotations

import numpy as np
import pytest

from actstore.experiment.claims import Check, MethodResult, Spread, seed_checks, summarise, verdict


@pytest.mark.parametrize("per_seed,expected", [
    ([True, True, True], "reproduces"),
    ([True, False, True], "fails"),  # one failing seed is enough
    ([True, None, True], "untestable"),
    ([None, False], "fails"),
    ([None, None], "untestable"),
    ([True], "reproduces"),
])
def test_verdict_holds_only_if_every_seed_holds(per_seed, expected):
    assert verdict(per_seed) == expected


def test_spread_is_mean_sample_std_and_range():
    s = Spread.of([1.0, 2.0, 4.0])
    assert (s.mean, s.low, s.high) == (pytest.approx(7 / 3), 1.0, 4.0)
    assert s.std == pytest.approx(np.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) / 2))
    assert Spread.of([0.5]).std == 0.0


def test_summarise_aggregates_each_claim_over_seeds():
    checks = {0: [Check("a", 1.0, 2.0, True), Check("b", 3.0, 1.0, False)],
              7: [Check("a", 2.0, 4.0, True), Check("b", 1.0, 5.0, True)]}
    a, b = summarise(checks)
    assert a.verdict == "reproduces" and a.value.mean == 3.0 and a.baseline.mean == 1.5 and a.holds_on == "2/2"
    assert b.verdict == "fails" and b.per_seed == {0: False, 7: True} and b.holds_on == "1/2"
    with pytest.raises(ValueError, match="other claims"):
        summarise({0: [Check("a", 1, 2, True)], 1: [Check("c", 1, 2, True)]})


class FakeLens:
    """The fields of a LensResult that the checks read."""

    def __init__(self, accuracy, saturation, depth, speedup, exit_accuracy):
        self.accuracy = np.asarray(accuracy)
        self.saturation_counts = np.asarray(saturation)
        self.effective_depth_relative = depth
        self.taus = np.array([0.5, 0.9])
        self.speedup = np.asarray(speedup)
        self.exit_accuracy = np.asarray(exit_accuracy)


def result(method, accuracy, cos, saturation, depth, speedup, exits=None):
    lens = FakeLens(accuracy, saturation, depth, speedup, [0.88, 0.88])
    return MethodResult(method, "m", "r", lens, np.asarray(cos), exits)


def test_seed_checks_read_the_numbers_the_claims_name():
    std = result("standard", [0.1, 0.2, 0.3, 0.9], [0.1, 0.2, 0.4, 1.0], [0, 0, 1, 9], 3, [1.0, 1.0])
    ali = result("aligned", [0.1, 0.5, 0.7, 0.88], [0.2, 0.5, 0.7, 1.0], [0, 5, 4, 1], 2, [1.6, 1.5])
    own = FakeLens([0.1, 0.5, 0.7, 0.9], [0, 0, 0, 1], 2, [1.8, 1.7], [0.9, 0.9])
    mex = result("multi-exit", [0.1, 0.2, 0.3, 0.9], [0, 0, 0, 1], [0, 0, 1, 9], 3, [1.0, 1.0], own)
    checks = seed_checks({"standard": std, "aligned": ali, "multi-exit": mex}, 0.1)
    assert [c.holds for c in checks] == [True, True, True, True, True]
    assert checks[0].baseline == pytest.approx(0.25) and checks[0].value == pytest.approx(0.6)
    assert checks[4].baseline == 1.7 and checks[4].value == 1.5
    # token-level runs have no COS to the last layer; no early exits make claim 4 untestable
    std.cos_to_last[:] = np.nan
    own.speedup[:] = 1.0
    checks = seed_checks({"standard": std, "aligned": ali, "multi-exit": mex}, 0.1)
    assert checks[1].holds is None and checks[4].holds is None
