"""Matrix-entropy queries (Skean et al. 2025): dataset and prompt entropy, effective rank,
curvature, and the augmentation-invariance family (InfoNCE, DiME, LiDAR); formulas in
`metrics.entropy`."""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from actstore.errors import FailedPrecondition, InvalidArgument
from actstore.measures.families import PRESET_ASKS
from actstore.metrics import entropy as ent
from actstore.metrics import entropy_presets as presets
from actstore.options import ENTROPY
from actstore.server.planners import Family, Planner, register_family
from actstore.server.planners.word_entropy import WordEntropyPlanner
from actstore.server.requests import EntropyQuery
from actstore.server.results import MetricResult
from actstore.store.catalog import RunRecord
from actstore.store.datasets import load_dataset
from actstore.workers.metric_tasks import PerLayer


class EntropyPlanner(Planner):

    def entropy(self, query: EntropyQuery) -> MetricResult:
        metric, record, chosen, refresh = query.metric, query.run, query.layers, query.refresh
        if query.options["preset"] != "none":
            return self._preset(query)
        options: dict[str, Any] = query.result_options
        if query.options["align"] == "words":  # a token-level run's words: the same units whatever the tokenizer
            return WordEntropyPlanner(self.parts).entropy(metric, record, chosen, options, query.options["word_pool"],
                                                          refresh)
        token_level = metric in ("prompt_entropy", "curvature")
        if token_level != (record.pooling == "tokens"):
            raise InvalidArgument(
                f"{metric} needs a {'token-level' if token_level else 'pooled'} run; run {record.run_key[:12]} is "
                f"pooled '{record.pooling}': capture with "
                f"{'--pooling tokens' if token_level else '--pooling mean (or cls/last) or give --align words'}")
        if metric == "dataset_entropy":
            self._check_normalization(record, options["normalization"])
        compute = {
            "dataset_entropy": self._dataset_entropy, "effective_rank": self._dataset_entropy,
            "prompt_entropy": self._prompt_metric, "curvature": self._prompt_metric,
            "infonce": self._invariance, "dime": self._invariance, "lidar": self._invariance,
        }.get(metric)
        if compute is None:
            raise InvalidArgument(f"entropy metric {metric!r} is unknown")
        return self.parts.results.cached_or_compute(metric, ent.DEFINITION_VERSION, options, [record.run_key], refresh,
                                                    lambda: compute(metric, record, chosen, options))

    def _preset(self, query: EntropyQuery) -> MetricResult:
        """A reference pipeline by name (`metrics.entropy_presets`), from a token-level run."""
        preset, metric, record, layers = query.options["preset"], query.metric, query.run, query.layers
        fixed = presets.SKEAN2025
        if metric not in presets.SKEAN2025_METRICS:
            raise InvalidArgument(f"preset {preset} covers {', '.join(presets.SKEAN2025_METRICS[:-1])} and "
                                  f"{presets.SKEAN2025_METRICS[-1]}, not {metric}")
        if record.pooling != "tokens":
            raise InvalidArgument(f"preset {preset} starts from token rows; run {record.run_key[:12]} is pooled "
                                  f"'{record.pooling}': capture with --pooling tokens")
        # the preset fixes these; the wire cannot tell a default from a choice, so a default passes
        asked = {name: query.options[name] for name in PRESET_ASKS}
        differ = [f"{name}={value}" for name, value in asked.items()
                  if value != fixed[name] and value != ENTROPY[name].default]
        if differ:
            raise InvalidArgument(f"preset {preset} fixes {', '.join(f'{k}={v}' for k, v in fixed.items())}; "
                                  f"drop {', '.join(differ)}")
        options = {"layers": layers, "preset": preset}
        return self.parts.results.cached_or_compute(
            metric, ent.DEFINITION_VERSION, options, [record.run_key], query.refresh,
            lambda: self._preset_values(preset, metric, record, layers, fixed))

    @staticmethod
    def _check_prompts(what: str, run: RunRecord, offsets: np.ndarray, least_tokens: int,
                       least_prompts: int) -> None:
        """Refuse a per-prompt metric of a run (its token `offsets`) with fewer than `least_prompts`
        prompts of at least `least_tokens` tokens (shorter ones are skipped), before any task runs."""
        lengths = np.diff(offsets)
        enough = int(np.sum(lengths >= least_tokens))
        if enough < least_prompts:
            raise FailedPrecondition(f"{what} needs at least {least_prompts} prompt(s) of {least_tokens} or more "
                                     f"tokens; run {run.run_key[:12]} has {enough} of its {lengths.size}: capture "
                                     "a dataset with more (or longer) texts")

    @staticmethod
    def _check_normalization(run: RunRecord, normalization: str) -> None:
        """Refuse a normalization that divides by log 1 = 0 for this run's n samples and width d."""
        divides_by = {"maxEntropy": ("min(n, d)", min(run.rows, run.width)), "logN": ("n", run.rows),
                      "logD": ("d", run.width)}
        if normalization in divides_by and divides_by[normalization][1] < 2:
            name, value = divides_by[normalization]
            raise FailedPrecondition(f"normalization {normalization} divides by log {name} = log {value} = 0: run "
                                     f"{run.run_key[:12]} holds n={run.rows} samples of width d={run.width}; use "
                                     "--normalization raw, or capture at least 2 samples")

    def _preset_values(self, preset: str, metric: str, run: RunRecord, layers: list[int], fixed: dict):
        if metric == "dataset_entropy":  # a d x d sum and at most d pooled rows per layer
            self.parts.checks.check_memory(2 * 8 * run.width**2 * len(layers),
                                           f"{len(layers)} d x d scatter matrices and pooled rows (d={run.width})")
        make = {"dataset_entropy": lambda: presets.ReferenceDatasetEntropyAccumulator(run.width),
                "prompt_entropy": lambda: ent.PromptEntropyAccumulator(fixed["alpha"], fixed["normalization"],
                                                                       fixed["clamp"]),
                "curvature": presets.ReferenceCurvatureAccumulator}[metric]
        offsets = self.parts.arrays.offsets(run.run_key)
        # all three skip prompts of one token; dataset entropy needs two pooled prompts to compare
        self._check_prompts(f"preset {preset} {metric}", run, offsets, 2, 2 if metric == "dataset_entropy" else 1)
        total = self.parts.executor.map_prompts(offsets, run.run_key, layers,
                                                lambda: PerLayer([make() for _ in layers]))
        first = total.accumulators[0]
        finish = ((lambda acc: acc.finalize(fixed["alpha"], fixed["normalization"])) if metric == "dataset_entropy"
                  else (lambda acc: acc.finalize()))
        notes = [f"{first.skipped} prompts were too short and skipped"] if first.skipped else []
        return ({"values": np.asarray([finish(acc) for acc in total.accumulators], dtype=np.float64)},
                {"prompts": float(first.n if metric == "dataset_entropy" else first.count)}, notes)

    def _dataset_entropy(self, metric: str, run: RunRecord, layers: list[int], options: dict):
        means = self.parts.arrays.means(run.run_key)
        clamp_small = options.get("clamp") and run.rows <= run.width
        if clamp_small:
            self.parts.checks.check_in_memory(run, 1, square=True)
        else:
            self.parts.checks.check_memory(8 * run.width**2 * len(layers),
                                           f"{len(layers)} d x d scatter matrices (d={run.width})")
        if clamp_small:  # the clamped n x n Gram cannot be streamed: n <= d keeps it small
            fn = partial(ent.dataset_entropy, alpha=options["alpha"], normalization=options["normalization"],
                         clamp=True)
            values = self.parts.executor.evaluate_layers(run.run_key, layers, fn)
        else:
            accumulators = PerLayer([ent.DatasetEntropyAccumulator(means[layer]) for layer in layers])
            total = self.parts.executor.map_reduce(run.rows, [(run.run_key, layers)], accumulators)
            if metric == "effective_rank":
                values = [acc.effective_rank(options["convention"]) for acc in total.accumulators]
            else:
                values = [acc.finalize(options["alpha"], options["normalization"], options["clamp"])
                          for acc in total.accumulators]
        return {"values": np.asarray(values, dtype=np.float64)}, {"n": float(run.rows)}, []

    def _prompt_metric(self, metric: str, run: RunRecord, layers: list[int], options: dict):
        make = (lambda: ent.PromptEntropyAccumulator(options["alpha"], options["normalization"], options["clamp"])
                ) if metric == "prompt_entropy" else (lambda: ent.CurvatureAccumulator(options["abs_cos"]))
        offsets = self.parts.arrays.offsets(run.run_key)
        accumulator = ent.PromptEntropyAccumulator if metric == "prompt_entropy" else ent.CurvatureAccumulator
        self._check_prompts(metric, run, offsets, accumulator.min_tokens, 1)
        total = self.parts.executor.map_prompts(offsets, run.run_key, layers,
                                                lambda: PerLayer([make() for _ in layers]))
        first = total.accumulators[0]
        notes = [f"{first.skipped} prompts were too short and skipped"] if first.skipped else []
        return ({"values": np.asarray([acc.finalize() for acc in total.accumulators], dtype=np.float64)},
                {"prompts": float(first.count)}, notes)

    def _invariance(self, metric: str, run: RunRecord, layers: list[int], options: dict):
        data = load_dataset(self.parts.executor.store.local(self.parts.catalog.datasets.get(run.dataset_digest).path))
        if data.groups is None:
            raise FailedPrecondition(
                f"{metric} needs augmentation groups: register the dataset with --augment-views 2 (or a "
                "--group-column), then capture it")
        self.parts.checks.check_in_memory(run, 1, square=metric != "lidar")
        groups = np.asarray(data.groups)
        if metric == "lidar" and np.unique(groups).size < 2:
            raise FailedPrecondition(f"lidar needs at least 2 groups of views (Sigma_b is over the group means); "
                                     f"run {run.run_key[:12]}'s dataset has {np.unique(groups).size}: register more "
                                     "texts with --augment-views 2 or more")
        if metric == "lidar":
            fn = partial(_lidar_value, groups=groups, alpha=options["alpha"], exp=options["exp"])
            notes = []
        else:
            first, second = _first_two_views(groups)
            notes = [f"views 0 and 1 of {len(first)} groups"]
            fn = partial(_paired_value, metric=metric, first=first, second=second, options=options)
        values = self.parts.executor.evaluate_layers(run.run_key, layers, fn)
        if metric == "infonce":  # the score 1 - L/log n per layer, and the loss L itself
            return ({"values": np.asarray([v.score for v in values]), "loss": np.asarray([v.loss for v in values])},
                    {"n": float(run.rows)}, notes)
        return {"values": np.asarray(values, dtype=np.float64)}, {"n": float(run.rows)}, notes


def _first_two_views(groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row indices of the first and second view of every group that has two."""
    first, second = {}, {}
    for row, group in enumerate(groups.tolist()):
        if group not in first:
            first[group] = row
        elif group not in second:
            second[group] = row
    paired = [g for g in first if g in second]
    if len(paired) < 2:
        raise FailedPrecondition("fewer than 2 groups have two views: augment with --augment-views 2 or more")
    return np.array([first[g] for g in paired]), np.array([second[g] for g in paired])


def _paired_value(z: np.ndarray, metric: str, first: np.ndarray, second: np.ndarray, options: dict):
    if metric == "infonce":
        return ent.infonce(z[first], z[second], options["temperature"])
    return ent.dime(z[first], z[second], options["alpha"], options["permutations"], options["seed"])


def _lidar_value(z: np.ndarray, groups: np.ndarray, alpha: float, exp: bool) -> float:
    return ent.lidar(z, groups, alpha=alpha, exp=exp)


register_family(Family("entropy", EntropyQuery, EntropyPlanner, "entropy"))
