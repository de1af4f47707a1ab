"""The client's training (`Client.training`): a recipe trained as a job, and checkpoint progression
(Skean et al. 2025, "training progression" figures): one metric per layer over a model's
registered training steps.

Training registers every checkpoint as a model named `NAME@stepK` (`Training.train`). The query
captures each checkpoint on a dataset (or finds the stored run) and asks one metric per layer:

- `cka-to-final`: linear CKA (biased) between layer l at step K and layer l of the final (largest)
  step, on the same samples; 1 at the final step by definition;
- `dataset-entropy`: dataset entropy per layer (METRICS.md definition, options.ENTROPY defaults);
- `lens-accuracy`: logit-lens accuracy per layer with the checkpoint's own head.

It orchestrates existing captures and queries, so every number is cached where they are.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from actstore._proto.actstore.v1 import actstore_pb2 as pb
from actstore.client import plots
from actstore.client.arguments import checking_arguments, options
from actstore.client.captures import Captures
from actstore.client.catalog import Catalog
from actstore.client.display import Shown, Summary, layer_span, value_range
from actstore.client.queries import Queries
from actstore.client.results import JobInfo, ModelInfo
from actstore.client.transport import Connection
from actstore.errors import InvalidArgument, NotFound
from actstore.options import CAPTURE, PROGRESSION, TRAIN, trained_model_name

_STEP = re.compile(r"^(?P<base>.+)@step(?P<step>\d+)$")


@dataclass(frozen=True, repr=False)
class ProgressionResult(Shown):
    metric: str
    base: str  # the training run's name (aliases base@stepK)
    steps: np.ndarray  # (S,), increasing
    layers: list[int]
    values: np.ndarray  # (S, len(layers)): values[s, i] = metric of layer layers[i] at steps[s]
    models: list[str]  # the checkpoints' digests, by step
    runs: list[str]  # their run keys on the dataset, by step

    def plot(self, ax=None, **style):
        """Draw one curve per layer of the metric over the training steps on `ax` (a new figure's
        when None); returns the Axes."""
        return plots.progression(ax, self, **style)

    def summary(self) -> Summary:
        return Summary(f"{self.metric} of {self.base} over {len(self.steps)} steps, layers {layer_span(self.layers)}",
                       None, [("steps", ", ".join(map(str, self.steps.tolist()))),
                              ("values", value_range(self.values))])


@checking_arguments
@dataclass(eq=False)
class Training:
    """Training a recipe as a job, its registered checkpoints (`training_steps`), and one metric per
    layer across them (`progression`), through the catalog, captures and queries."""

    connection: Connection
    catalog: Catalog
    captures: Captures
    queries: Queries

    @options(TRAIN, leave=("recipe",))
    def train(self, recipe: str, method: str, *, seed: int = TRAIN.seed.default,
              steps: int | None = TRAIN.steps.default, smoke: bool = TRAIN.smoke.default,
              alternating: bool = TRAIN.alternating.default, weights: str = TRAIN.weights.default,
              beta: float | None = TRAIN.beta.default, progress: bool = False) -> ModelInfo:
        """Train `recipe` with `method` (standard | aligned | multi-exit | ce-reg) as a job; every
        checkpoint is registered as a model named RECIPE-METHOD-sSEED@stepK, with each option given
        that changes the training in the name (`options.trained_model_name`: RECIPE-METHOD-betaB-sSEED
        with an explicit `beta`, ...-steps400-sSEED with `steps`); the name without @step follows the
        newest. Returns the final model.
        Resubmitting resumes a stopped run."""
        job = JobInfo.from_proto(self.connection.capture.SubmitTrain(pb.TrainRequest(
            recipe=recipe, method=method, seed=seed, steps=steps, smoke=smoke, alternating=alternating,
            weights=weights, **({} if beta is None else {"beta": beta}))))
        if not job.finished:
            self.captures.wait(job.job_id, progress=progress, description=f"train {recipe} {method}")
        name = trained_model_name(recipe, method, seed, smoke, steps, alternating, weights, beta)
        return next(m for m in self.catalog.models() if name in m.aliases)

    def training_steps(self, model: str) -> tuple[str, list[tuple[int, str]]]:
        """(base name, [(step, digest), ...] by step) of the training run `model` belongs to: its name
        (e.g. vit-fmnist-aligned-s0), one of its `@stepK` aliases, or a checkpoint's digest (prefix)."""
        models = self.catalog.models()
        bases = {m.group("base") for info in models for m in map(_STEP.match, info.aliases) if m}
        named = _STEP.match(model)
        base = named.group("base") if named else model
        if base not in bases:
            owner = next((info for info in models if model in info.aliases or info.digest.startswith(model)), None)
            found = [m.group("base") for m in map(_STEP.match, owner.aliases if owner else []) if m]
            if not found:
                raise NotFound(f"{model!r} names no trained model with registered steps (aliases NAME@stepK): "
                               "train one with `actstore train`, or name it as `actstore models` lists it")
            base = found[0]
        steps = {int(m.group("step")): info.digest for info in models for m in map(_STEP.match, info.aliases)
                 if m and m.group("base") == base}
        return base, sorted(steps.items())

    @options(PROGRESSION, CAPTURE)
    def progression(self, model: str, dataset: str, *, metric: str = PROGRESSION.metric.default,
                    layers: Sequence[int] | None = None, pooling: str | None = CAPTURE.pooling.default,
                    max_len: int | None = CAPTURE.max_len.default, progress: bool = False) -> ProgressionResult:
        """`metric` (cka-to-final | dataset-entropy | lens-accuracy) per layer at every registered
        training step of `model`, capturing each checkpoint on `dataset` (pooling: the capture's)."""
        base, steps = self.training_steps(model)
        runs = [self.captures.capture(digest, dataset, pooling=pooling, max_len=max_len, progress=progress).run_key
                for _, digest in steps]
        depth = self.catalog.describe(runs[-1]).num_layers
        chosen = list(layers) if layers else list(range(depth + 1))  # empty or None: every layer
        if any(not 0 <= layer <= depth for layer in chosen):
            raise InvalidArgument(f"layers {chosen} must lie in 0..{depth}")
        rows = []
        for run in runs:
            if metric == "cka-to-final":
                rows.append(np.diag(self.queries.cka(run, runs[-1], layers_a=chosen, layers_b=chosen).biased))
            elif metric == "dataset-entropy":
                rows.append(self.queries.entropy("dataset_entropy", run, layers=chosen).values)
            else:
                rows.append(self.queries.lens(run).accuracy[chosen])
        return ProgressionResult(metric, base, np.array([s for s, _ in steps]), chosen,
                                 np.asarray(rows, dtype=np.float64), [d for _, d in steps], runs)
