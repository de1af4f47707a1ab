"""The claims of "Tracing Representation Progression" as checks, per seed and over seeds.

A check compares a number of the aligned model with the same number of a baseline (standard
training, or separate exit classifiers) on one seed: `holds` is True or False, or None when the
claim cannot be tested on that seed (e.g. no early exit happens at the threshold, or COS to the
last layer is undefined for a token-level run).

The rule over seeds (`RULE`): a claim **reproduces** only if it holds on every seed; it **does
not reproduce** if it fails on at least one seed; otherwise (it holds where it can be tested but
cannot be tested on some seed) it is **not testable**. Each claim is reported with the mean and the
spread (sample standard deviation, and min..max) of both numbers over the seeds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from actstore.client import LensResult

RULE = ("A claim reproduces only if it holds on every seed; it does not reproduce if it fails on any "
        "seed; otherwise (untestable on some seed, holding on the others) it is not testable.")

VERDICTS = {"reproduces": "**reproduces**", "fails": "**does not reproduce**", "untestable": "**not testable**"}

REPORT_TAU = 0.9  # the exit threshold claim 4 is judged at


@dataclass
class MethodResult:
    """One trained model's answers on the held-out set."""

    method: str
    model: str
    run: str
    lens: LensResult
    cos_to_last: np.ndarray  # NaN for token-level runs (no single vector per sample)
    exits_lens: LensResult | None  # multi-exit: its own classifiers

    @property
    def shallow_accuracy(self) -> float:
        return float(self.lens.accuracy[1:-1].mean())

    @property
    def shallow_cos(self) -> float:
        return float(self.cos_to_last[1:-1].mean())

    @property
    def mean_saturation(self) -> float:
        counts = self.lens.saturation_counts
        return float((np.arange(len(counts)) * counts).sum() / counts.sum())

    def exit_row(self, tau: float, own_exits: bool = False) -> tuple[float, float]:
        lens = self.exits_lens if own_exits and self.exits_lens is not None else self.lens
        i = int(np.argmin(np.abs(lens.taus - tau)))
        return float(lens.exit_accuracy[i]), float(lens.speedup[i])


@dataclass(frozen=True)
class Check:
    """One claim on one seed: `value` (aligned) against `baseline`, and whether the claim holds."""

    claim: str  # a short statement, the same on every seed
    baseline: float
    value: float
    holds: bool | None  # None: not testable on this seed


@dataclass(frozen=True)
class Spread:
    mean: float
    std: float  # sample standard deviation (ddof 1); 0 for one seed
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        x = np.asarray(values, dtype=np.float64)
        return cls(float(x.mean()), float(x.std(ddof=1)) if x.size > 1 else 0.0, float(x.min()), float(x.max()))

    def __str__(self) -> str:
        return f"{self.mean:.4f} ± {self.std:.4f} ({self.low:.4f}..{self.high:.4f})"


@dataclass(frozen=True)
class ClaimSummary:
    claim: str
    baseline: Spread
    value: Spread
    per_seed: dict[int, bool | None]
    verdict: str  # a key of VERDICTS

    @property
    def holds_on(self) -> str:
        tested = [h for h in self.per_seed.values() if h is not None]
        return f"{sum(tested)}/{len(self.per_seed)}"


def seed_checks(results: Mapping[str, MethodResult], epsilon: float) -> list[Check]:
    """The paper's claims on one seed's models (standard, aligned, multi-exit)."""
    std, ali, mex = results["standard"], results["aligned"], results["multi-exit"]
    ali_acc, ali_speed = ali.exit_row(REPORT_TAU)
    _, mex_speed = mex.exit_row(REPORT_TAU, own_exits=True)
    cos_testable = not (np.isnan(std.shallow_cos) or np.isnan(ali.shallow_cos))
    return [
        Check("1a. Aligned training raises shallow-layer accuracy (mean over layers 1..L-1)",
              std.shallow_accuracy, ali.shallow_accuracy, bool(ali.shallow_accuracy > std.shallow_accuracy)),
        Check("1b. It raises the mean COS to the last layer (layers 1..L-1)", std.shallow_cos, ali.shallow_cos,
              bool(ali.shallow_cos > std.shallow_cos) if cos_testable else None),
        Check("2. It moves saturation earlier (mean saturation layer)", std.mean_saturation, ali.mean_saturation,
              bool(ali.mean_saturation < std.mean_saturation)),
        Check(f"3. It lowers the {epsilon}-effective depth (relative variant)",
              float(std.lens.effective_depth_relative), float(ali.lens.effective_depth_relative),
              bool(ali.lens.effective_depth_relative < std.lens.effective_depth_relative)),
        Check(f"4. At tau={REPORT_TAU} its single head exits with >= 0.8x the speed-up of separate classifiers "
              "(baseline: multi-exit's speed-up), at accuracy within 0.05 of standard's full depth",
              mex_speed, ali_speed,
              bool(ali_speed >= 0.8 * mex_speed and ali_acc >= std.lens.accuracy[-1] - 0.05) if mex_speed > 1.05
              else None),
    ]


def verdict(per_seed: Sequence[bool | None]) -> str:
    """`RULE` applied to one claim's per-seed outcomes."""
    if not per_seed:
        raise ValueError("a verdict needs at least one seed")
    if any(h is False for h in per_seed):
        return "fails"
    if all(h is True for h in per_seed):
        return "reproduces"
    return "untestable"


def summarise(checks: Mapping[int, Sequence[Check]]) -> list[ClaimSummary]:
    """Checks by seed (the same claims in the same order on every seed) -> one summary per claim."""
    seeds = list(checks)
    claims = [c.claim for c in checks[seeds[0]]]
    for seed in seeds:
        if [c.claim for c in checks[seed]] != claims:
            raise ValueError(f"seed {seed} checks other claims than seed {seeds[0]}")
    out = []
    for i, claim in enumerate(claims):
        row = [checks[seed][i] for seed in seeds]
        per_seed = {seed: c.holds for seed, c in zip(seeds, row)}
        out.append(ClaimSummary(claim, Spread.of([c.baseline for c in row]), Spread.of([c.value for c in row]),
                                per_seed, verdict(list(per_seed.values()))))
    return out
