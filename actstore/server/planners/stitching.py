"""Model stitching (Brown et al. 2023): fit an affine map from layer a of model A into layer b of
model B on token-level runs, run the rest of B, and report the loss penalty on held-out prompts."""

from __future__ import annotations

from actstore.errors import FailedPrecondition, InvalidArgument, Unavailable
from actstore.server.dispatch import get_or_raise
from actstore.server.planners import Family, Planner, register_family
from actstore.server.requests import StitchQuery
from actstore.server.results import MetricResult
from actstore.workers.stitch import StitchPlan, stitch_penalty

STITCH_VERSION = 1


class StitchPlanner(Planner):

    def stitch(self, query: StitchQuery) -> MetricResult:
        checks, a, b, layer_a, layer_b = self.parts.checks, query.a, query.b, query.layer_a, query.layer_b
        test_fraction, seed, tune_steps, tune_lr = query.test_fraction, query.seed, query.tune_steps, query.tune_lr
        if a.pooling != "tokens" or b.pooling != "tokens":
            raise InvalidArgument("stitching feeds every token of A into B: capture both runs with --pooling tokens")
        model_b = self.parts.catalog.models.get(b.model_digest)
        if not model_b.has_head:
            raise FailedPrecondition(f"run B's model {model_b.digest[:12]} ({model_b.arch}) has no head: the "
                                     "stitching penalty is B's task loss, which needs a final norm + classifier or "
                                     "unembedding (a *ForCausalLM or *ForSequence/ImageClassification model)")
        checks.check_same_samples(a, b)
        checks.check_finite(a, [layer_a])
        checks.check_finite(b, [layer_b])
        checks.check_memory(8 * a.rows * (a.width + 2 * b.width + 1), "the stitch fit")
        options = query.result_options

        def compute():
            plan = StitchPlan(self.parts.executor.store, a.run_key, layer_a, b.run_key, layer_b, model_b.path,
                              self.parts.catalog.datasets.get(b.dataset_digest).path, b.max_len, test_fraction, seed,
                              tune_steps=tune_steps, tune_lr=tune_lr)
            scalars = get_or_raise(self.parts.executor.device_task(stitch_penalty)(plan),
                                   lambda cause: Unavailable(f"the stitching task failed: {cause}"))
            notes = [f"least-squares affine map fitted on {int(scalars['train_prompts'])} prompts, penalty measured "
                     f"on {int(scalars['test_prompts'])} held-out prompts (seed {seed})"]
            if tune_steps:
                notes.append(f"then tuned by {tune_steps} Adam steps (lr {tune_lr:g}) on B's task loss over the "
                             "training prompts: tuned_penalty")
            return {}, scalars, notes

        return self.parts.results.cached_or_compute("stitch", STITCH_VERSION, options, [a.run_key, b.run_key],
                                                    query.refresh, compute)


register_family(Family("stitch", StitchQuery, StitchPlanner, "stitch"))
