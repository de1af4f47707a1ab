"""Depth queries over one run: the logit lens with saturation and effective depth (Jiang et al.
2024), the residual norm ratio, and neural collapse NC1; formulas in `metrics.lens`."""

from __future__ import annotations

import numpy as np

from actstore.errors import FailedPrecondition, InvalidArgument
from actstore.metrics import lens
from actstore.metrics import similarity as sim
from actstore.server.dispatch import gather
from actstore.server.executor import merged
from actstore.server.planners import Family, Planner, register_family
from actstore.server.requests import LensQuery, NeuralCollapseQuery, ResidualNormQuery
from actstore.server.results import MetricResult
from actstore.workers.metric_tasks import PerLayer


class DepthPlanner(Planner):

    def residual_norm(self, query: ResidualNormQuery) -> MetricResult:
        record, chosen = query.run, query.layers
        options = {"layers": chosen}

        def compute():
            read = [x for layer in chosen for x in (layer, layer + 1)]
            total = self.parts.executor.map_reduce(record.rows, [(record.run_key, read)],
                                                   lens.ResidualNormAccumulator(len(chosen)))
            mean, quantiles = total.finalize()
            notes = ([f"{int(total.unchanged.sum())} samples had h_(l+1) == h_l (infinite ratio, excluded)"]
                     if total.unchanged.any() else [])
            return ({"mean": mean, "quantiles": quantiles, "quantile_levels": np.asarray(sim.QUANTILE_LEVELS)},
                    {"n": float(record.rows)}, notes)

        return self.parts.results.cached_or_compute("residual_norm_ratio", lens.DEFINITION_VERSION, options,
                                                    [record.run_key], query.refresh, compute)

    def lens(self, query: LensQuery) -> MetricResult:
        record, epsilon, taus, heads = query.run, query.epsilon, query.taus, query.heads
        model = self.parts.catalog.models.get(record.model_digest)
        if not model.has_head:
            raise FailedPrecondition(f"model {model.digest[:12]} ({model.arch}) has no head to apply: the lens "
                                     "needs a final norm + classifier or unembedding (a *ForCausalLM or "
                                     "*ForSequence/ImageClassification model)")
        if heads == "exits" and not (self.parts.executor.store.local(model.path) / "exit_heads.safetensors").exists():
            raise FailedPrecondition(f"model {model.digest[:12]} has no exit heads: heads='exits' is for models "
                                     "trained with --method multi-exit")
        self.parts.checks.check_finite(record, list(range(record.num_layers + 1)))
        next_token = model.kind == "causal-lm"
        if next_token and record.pooling != "tokens":
            raise InvalidArgument("the lens of a causal LM predicts each next token: capture with --pooling tokens")
        if not next_token and record.pooling not in ("cls", "last"):
            raise InvalidArgument(f"the classifier reads one position, but run {record.run_key[:12]} is pooled "
                                  f"'{record.pooling}': capture with the model's own pooling (cls for BERT/ViT)")
        labels = None if next_token else self.parts.checks.labels(record)
        options = {"epsilon": epsilon, "taus": taus, "heads": heads}

        def compute():
            from actstore.workers.lens_tasks import LensPlan, lens_partial  # torch: only where it is needed

            plan = LensPlan(self.parts.executor.store, record.run_key, record.num_layers + 1, model.path, next_token,
                            heads == "exits")
            groups = self.parts.executor.row_groups(record.rows)
            submit = self.parts.executor.device_task(lens_partial)
            empty = lens.LensAccumulator(record.num_layers, np.asarray(taus))
            summary = merged(gather([submit(plan, g, labels, empty) for g in groups])).finalize()
            depth = {variant: float(lens.effective_depth(summary.accuracy, epsilon, variant))
                     for variant in ("absolute", "relative")}
            arrays = {
                "accuracy": summary.accuracy,
                "saturation_counts": summary.saturation_counts,
                "saturation_cumulative": summary.saturation_cumulative,
                "taus": np.asarray([row.tau for row in summary.exits]),
                "exits": np.stack([row.exits for row in summary.exits]),
                "exit_accuracy": np.asarray([row.accuracy for row in summary.exits]),
                "speedup": np.asarray([row.speedup for row in summary.exits]),
            }
            scalars = {"effective_depth": depth["absolute"], "effective_depth_relative": depth["relative"],
                       "n": float(summary.saturation_counts.sum())}
            notes = ["next-token labels; each prompt's last token has none and is left out"] if next_token else []
            return arrays, scalars, notes

        return self.parts.results.cached_or_compute("logit_lens", lens.DEFINITION_VERSION, options, [record.run_key],
                                                    query.refresh, compute)

    def neural_collapse(self, query: NeuralCollapseQuery) -> MetricResult:
        record, chosen, rcond = query.run, query.layers, query.rcond
        labels = self.parts.checks.labels(record)
        classes = np.unique(labels)
        if classes.size < 2:
            raise FailedPrecondition(f"NC1 needs at least 2 classes (Sigma_B is over the class means); run "
                                     f"{record.run_key[:12]}'s {record.rows} labels hold {classes.size}: capture a "
                                     "dataset with samples of two or more labels")
        options = {"layers": chosen, "rcond": rcond}

        def compute():
            empty = PerLayer([lens.NC1Accumulator() for _ in chosen])
            total = self.parts.executor.map_reduce(record.rows, [(record.run_key, chosen)], empty, labels=labels)
            values = np.asarray([acc.finalize(rcond) for acc in total.accumulators], dtype=np.float64)
            return {"values": values}, {"n": float(record.rows), "classes": float(classes.size)}, []

        return self.parts.results.cached_or_compute("nc1", lens.DEFINITION_VERSION, options, [record.run_key],
                                                    query.refresh, compute)


register_family(Family("residual_norm", ResidualNormQuery, DepthPlanner, "residual_norm"))
register_family(Family("lens", LensQuery, DepthPlanner, "lens"))
register_family(Family("neural_collapse", NeuralCollapseQuery, DepthPlanner, "neural_collapse"))
