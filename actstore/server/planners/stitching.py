"""Model stitching (Brown et al. 2023): fit an affine map from layer a of model A into layer b of
model B on token-level runs, run the rest of B, and report the loss penalty on held-out prompts."""

from __future__ import annotations

from actstore.errors import FailedPrecondition, InvalidArgument, Unavailable
from actstore.options import STITCH, from_wire
from actstore.server.dispatch import get_or_raise
from actstore.server.planners import Planner
from actstore.server.results import MetricResult
from actstore.workers.stitch import StitchPlan, stitch_penalty

STITCH_VERSION = 1


class StitchPlanner(Planner):

    def stitch(self, run_a: str, layer_a: int, run_b: str, layer_b: int, test_fraction: float = 0.0,
               seed: int = 0, refresh: bool = False, *, tune_steps: int = 0, tune_lr: float = 0.0) -> MetricResult:
        checks = self.checks
        a, b = checks.committed_run(run_a), checks.committed_run(run_b)
        checks.check_layers(a, [layer_a], "layer_a")
        checks.check_layers(b, [layer_b], "layer_b")
        if a.pooling != "tokens" or b.pooling != "tokens":
            raise InvalidArgument("stitching feeds every token of A into B: capture both runs with --pooling tokens")
        model_b = self.catalog.models.get(b.model_digest)
        if not model_b.has_head:
            raise FailedPrecondition(f"run B's model {model_b.digest[:12]} ({model_b.arch}) has no head: the "
                                     "stitching penalty is B's task loss, which needs a final norm + classifier or "
                                     "unembedding (a *ForCausalLM or *ForSequence/ImageClassification model)")
        checks.check_same_samples(a, b)
        checks.check_finite(a, [layer_a])
        checks.check_finite(b, [layer_b])
        test_fraction = from_wire(STITCH, "test_fraction", test_fraction)  # in (0, 1)
        seed = from_wire(STITCH, "seed", seed)
        tune_steps = from_wire(STITCH, "tune_steps", tune_steps, limits=self.checks.settings)
        tune_lr = from_wire(STITCH, "tune_lr", tune_lr)
        checks.check_memory(8 * a.rows * (a.width + 2 * b.width + 1), "the stitch fit")
        options = {"layer_a": layer_a, "layer_b": layer_b, "test_fraction": test_fraction, "seed": seed}
        if tune_steps:  # only then, so untuned results keep their keys
            options.update(tune_steps=tune_steps, tune_lr=tune_lr)

        def compute():
            plan = StitchPlan(self.executor.store, a.run_key, layer_a, b.run_key, layer_b, model_b.path,
                              self.catalog.datasets.get(b.dataset_digest).path, b.max_len, test_fraction, seed,
                              tune_steps=tune_steps, tune_lr=tune_lr)
            scalars = get_or_raise(self.executor.device_task(stitch_penalty)(plan),
                                   lambda cause: Unavailable(f"the stitching task failed: {cause}"))
            notes = [f"least-squares affine map fitted on {int(scalars['train_prompts'])} prompts, penalty measured "
                     f"on {int(scalars['test_prompts'])} held-out prompts (seed {seed})"]
            if tune_steps:
                notes.append(f"then tuned by {tune_steps} Adam steps (lr {tune_lr:g}) on B's task loss over the "
                             "training prompts: tuned_penalty")
            return {}, scalars, notes

        return self.results.cached_or_compute("stitch", STITCH_VERSION, options, [a.run_key, b.run_key], refresh,
                                              compute)
