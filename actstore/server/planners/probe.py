"""The probe family (METRICS.md, "Probes"): how well each layer of a run predicts a label set of its
samples, on held-out folds fixed by the sample ids; with a control task, and the per-layer metrics
of "Layer by Layer" set beside the score.

One module: the typed query (`ProbeQuery`, resolved once from a `MetricCall` of the spec "probe"),
its planner and the family's registration; the numerics are `metrics.probes`, the map tasks
`workers.probe_tasks`.

- ridge: one streamed pass accumulates every layer's per-fold moments (`FoldMoments`; the layers
  in groups that fit `max_accumulator_bytes`) over the executor's fixed range groups, merged in
  group order (`Executor.fold`: the same bits on any cluster); a task per layer fits every fold
  from the merged moments; regression scores come from the moments, classification takes a
  second pass of predictions (`FoldConfusion`).
- logistic: one task per layer holds its labelled rows and fits every fold (`fit_logistic`),
  refused with RESOURCE_EXHAUSTED beyond `max_accumulator_bytes`.
- against: each named metric through the engine's one door (`parts.answer`), cached on its own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray

from actstore import measures
from actstore.errors import ActStoreError, FailedPrecondition, InvalidArgument
from actstore.metrics import probes
from actstore.metrics.entropy_presets import SKEAN2025_METRICS
from actstore.server.dispatch import gather
from actstore.server.executor import remote
from actstore.server.planners import Family, Planner, register_family
from actstore.server.requests import MetricCall
from actstore.server.results import MetricResult
from actstore.server.runs import RunChecks
from actstore.store.catalog import LabelSetRecord, RunRecord
from actstore.store.datasets import load_dataset
from actstore.store.datasets.labels import load_label_set
from actstore.workers.metric_tasks import PerLayer, deal, prompt_ranges
from actstore.workers.probe_tasks import Features, accumulate_samples, finalize_ridge, logistic_layer

RIDGE_ONLY, LOGISTIC_ONLY = ("alpha", "alphas"), ("C", "tol", "max_iter")
PRESETS = {"skean2025": SKEAN2025_METRICS}
ROW_CHUNK = 4096  # samples a logistic task reads at a time


@dataclass(frozen=True)
class Against:
    """A metric set beside the probe score: its spec, the options it is asked with, its name."""

    spec: measures.Measure
    given: Mapping[str, Any]
    name: str


def against_metrics(names: list[str]) -> tuple[Against, ...]:
    """The metrics `--against` names: one-run metrics with a per-layer curve, or a preset's."""
    chosen: list[Against] = []
    for name in names:
        if name in PRESETS:
            chosen += [Against(measures.get(m), {"preset": name}, f"{m}[{name}]") for m in PRESETS[name]]
            continue
        spec = measures.get(name.replace("-", "_"))
        if spec.runs != 1 or not spec.curve or spec.query == "probe":
            curves = ", ".join(m.identifier for m in measures.measures(query=None)
                               if m.curve and m.query != "probe")
            raise InvalidArgument(f"--against {name}: {spec.identifier} has no value per layer of one run to set "
                                  f"beside the probe; take one of {curves}, or {', '.join(PRESETS)}")
        chosen.append(Against(spec, {}, spec.identifier))
    if len({a.name for a in chosen}) != len(chosen):
        raise InvalidArgument("--against names a metric twice: name each once")
    return tuple(chosen)


@dataclass(frozen=True)
class ProbeQuery:
    """A probe of a committed run: its layers (all when none given, each finite), the PROBE options
    resolved and checked, the label set (None: the dataset's own labels) and the metrics to set
    beside the score."""

    run: RunRecord
    layers: list[int]
    options: dict[str, Any]
    labels: LabelSetRecord | None
    against: tuple[Against, ...] = field(default=())
    refresh: bool = False

    @staticmethod
    def resolve(checks: RunChecks, call: MetricCall) -> ProbeQuery:
        options = call.spec.resolve(call.given, checks.settings)
        method = options["method"]
        given = [name for name, value in call.given.items() if value is not None]
        other, takes = (LOGISTIC_ONLY, RIDGE_ONLY) if method == "ridge" else (RIDGE_ONLY, LOGISTIC_ONLY)
        wrong = [name for name in given if name in other]
        if wrong:
            raise InvalidArgument(f"{', '.join(wrong)} {'is' if len(wrong) == 1 else 'are'} not an option of the "
                                  f"{method} probe (it takes {', '.join(takes)}): drop "
                                  f"{'it' if len(wrong) == 1 else 'them'}, or ask for the other --method")
        if method == "ridge" and options["alpha"] is None and options["folds"] < 3:
            raise InvalidArgument(f"the inner cross-validation that picks alpha from --alphas uses the other outer "
                                  f"folds, so it needs --folds 3 or more (got {options['folds']}): ask for more "
                                  "folds, or give --alpha")
        run = checks.committed_run(call.run_a)
        layers = checks.check_layers(run, list(call.layers_a), "layer")
        checks.check_finite(run, layers)
        if run.pooling == "tokens" and options["pool"] is None:
            raise InvalidArgument(f"run {run.run_key[:12]} is token-level (one row per token): name how each "
                                  "sample's tokens are pooled first with --pool mean, last or cls")
        if run.pooling != "tokens" and options["pool"] is not None:
            raise InvalidArgument(f"run {run.run_key[:12]} is pooled '{run.pooling}' already (one row per sample): "
                                  "drop --pool")
        labels = (None if options["labels"] is None
                  else checks.catalog.label_sets.get(run.dataset_digest, options["labels"]))
        if method == "logistic" and labels is not None and labels.kind == "continuous":
            raise InvalidArgument(f"label set {labels.name!r} is continuous: the logistic probe predicts classes; "
                                  "probe it with --method ridge (a ridge regression, scored by R^2)")
        return ProbeQuery(run, layers, options, labels, against_metrics(options["against"] or []), call.refresh)

    @property
    def result_options(self) -> dict[str, Any]:
        """What names the result: the layers, the label set's digest, and the options the method
        uses (the control's seed only with the control, the outlier rule only when applied)."""
        o = self.options
        method = {"alpha": o["alpha"], "alphas": o["alphas"]} if o["method"] == "ridge" else {
            "C": o["C"], "tol": o["tol"], "max_iter": o["max_iter"]}
        return {"layers": self.layers, "labels": self.labels.digest if self.labels else "dataset",
                "method": o["method"], **method, "folds": o["folds"], "pool": o["pool"], "control": o["control"],
                **({"control_seed": o["control_seed"]} if o["control"] else {}),
                "standardize": o["standardize"], "exclude_dims": o["exclude_dims"] or [],
                "exclude_outliers": o["exclude_outliers"],
                **({"outlier_sigmas": o["outlier_sigmas"]} if o["exclude_outliers"] else {}),
                "tolerance": o["tolerance"], "against": [a.name for a in self.against]}

    @property
    def features(self) -> Features:
        o = self.options
        return Features(tuple(o["exclude_dims"] or ()), o["exclude_outliers"], o["outlier_sigmas"], o["standardize"])


@dataclass
class Targets:
    """The probed samples: each sample's fold (-1: no label), its class code or value for the task
    and for its control (one column each), and what the answer says about them."""

    fold: np.ndarray
    task: np.ndarray  # (n, 1 or 2): codes (int, -1 unlabelled) or values (float)
    classes: list[str]  # empty for a continuous target
    unlabelled: int
    label_name: str

    @property
    def categorical(self) -> bool:
        return bool(self.classes)


class ProbePlanner(Planner):

    def probe(self, query: ProbeQuery) -> MetricResult:
        return self.parts.results.cached_or_compute("probe", probes.DEFINITION_VERSION, query.result_options,
                                                    [query.run.run_key], query.refresh, lambda: self._compute(query))

    # ---- the labels and folds -------------------------------------------------------------------
    def _targets(self, query: ProbeQuery) -> Targets:
        run, options = query.run, query.options
        data = load_dataset(self.parts.executor.store.local(self.parts.catalog.datasets.get(run.dataset_digest).path))
        ids = self.parts.arrays.sample_ids(run.run_key)
        if query.labels is None:
            codes = np.asarray(self.parts.checks.labels(run), dtype=np.int64)
            names = data.label_names or [str(c) for c in range(int(codes.max()) + 1)]
            per_sample, kind, label_name = codes, "categorical", "the dataset's labels"
        else:
            stored, _, _ = load_label_set(self.parts.executor.store.local(query.labels.path))
            per_dataset_sample = stored.per_sample()
            if ids == data.sample_ids:
                per_sample = per_dataset_sample
            else:  # a run of the dataset in another order: matched by sample id
                position = {sample: i for i, sample in enumerate(data.sample_ids)}
                per_sample = per_dataset_sample[[position[sample] for sample in ids]]
            names, kind = list(stored.classes or []), stored.kind
            label_name = f"label set {query.labels.name!r} ({query.labels.digest[:12]})"
        labelled = per_sample >= 0 if kind == "categorical" else ~np.isnan(per_sample)
        if not labelled.any():
            raise FailedPrecondition(f"no sample of run {run.run_key[:12]} has a label in {label_name}")
        groups = None if data.groups is None else np.asarray(data.groups)
        where = np.flatnonzero(labelled)
        kept_ids = [ids[i] for i in where]
        kept_groups = None if groups is None else groups[where]
        k = options["folds"]
        if kind == "categorical":
            present, codes = np.unique(per_sample[where], return_inverse=True)
            classes = [names[c] for c in present]
            if len(classes) < 2:
                raise FailedPrecondition(f"every labelled sample of run {run.run_key[:12]} is of the one class "
                                         f"{classes[0]!r} in {label_name}: a probe needs two or more classes")
            self._check_folds(codes, classes, kept_ids, kept_groups, k)
            values: np.ndarray = codes.astype(np.int64)
        else:
            classes, values = [], per_sample[where]
            units = len(set(kept_groups.tolist())) if kept_groups is not None else len(kept_ids)
            if units < k:
                raise InvalidArgument(f"{units} labelled samples (or groups) for {k} folds: every fold needs a "
                                      f"held-out part; ask for --folds {max(2, units)} or fewer")
            if np.ptp(values) == 0:
                raise FailedPrecondition(f"every labelled sample has the same value in {label_name}: there is "
                                         "nothing to predict")
        fold = np.full(len(ids), -1, dtype=np.int64)
        fold[where] = probes.assign_folds(kept_ids, k, values if classes else None, kept_groups)
        columns = [values]
        if options["control"]:
            columns.append(probes.control_labels(values, kept_ids, options["control_seed"], kept_groups))
        task = np.full((len(ids), len(columns)), -1 if classes else np.nan,
                       dtype=np.int64 if classes else np.float64)
        task[where] = np.column_stack(columns)
        return Targets(fold, task, classes, int(len(ids) - len(where)), label_name)

    @staticmethod
    def _check_folds(codes: np.ndarray, classes: list[str], ids: list[str], groups: np.ndarray | None,
                     k: int) -> None:
        """Every class needs a unit (sample or group) in every fold: else a fold's held-out part
        lacks the class, or its training part never saw it."""
        for code, name in enumerate(classes):
            members = codes == code
            units = len(set(groups[members].tolist())) if groups is not None else int(members.sum())
            if units < k:
                remedy = f"ask for --folds {units} or fewer" if units >= 2 else "leave the class out of the label set"
                raise FailedPrecondition(f"class {name!r} has {units} labelled sample{'s' if units != 1 else ''} "
                                         f"{'(groups) ' if groups is not None else ''}for {k} folds, so a fold would "
                                         f"hold none of it: {remedy}")

    # ---- the computation ------------------------------------------------------------------------
    def _compute(self, query: ProbeQuery):
        targets = self._targets(query)
        run, options = query.run, query.options
        offsets = self.parts.arrays.offsets(run.run_key) if run.pooling == "tokens" else None
        n = len(targets.fold)
        ranges = self._sample_ranges(run, offsets, n, options["folds"])
        shared = {"fold": ray.put(targets.fold), "offsets": ray.put(offsets)}
        if options["method"] == "ridge":
            scores, extra, notes = self._ridge(query, targets, ranges, shared)
        else:
            scores, extra, notes = self._logistic(query, targets, shared)
        return self._answer(query, targets, scores, extra, notes)

    def _sample_ranges(self, run: RunRecord, offsets: np.ndarray | None, n: int, folds: int
                       ) -> list[list[tuple[int, int]]]:
        """Contiguous sample ranges of about a shard each (a token-level run's: of its token shards),
        dealt into groups, one map task each. The count is the executor's fixed `groups`, fewer where
        a group's moments (folds x d^2 float64 a layer) would outweigh the float16 rows it reads
        (n / groups x d a layer): a function of the run and the folds, never of the cluster, so the
        same stored bytes give the same bits anywhere."""
        shard_rows = self.parts.arrays.layout(run.run_key).shard_rows
        groups = max(1, min(self.parts.executor.groups, 2 * n // (8 * folds * run.width)))
        if offsets is None:
            return deal([(s, min(s + shard_rows, n)) for s in range(0, n, shard_rows)], groups)
        return deal(prompt_ranges(offsets, shard_rows), groups)

    def _layer_groups(self, run: RunRecord, layers: list[int], per_layer: int) -> list[list[int]]:
        """The layers in groups whose accumulators, one per map task in flight and the merged one,
        fit the limit."""
        tasks = self.parts.executor.parts + 1
        self.parts.checks.check_memory(per_layer * tasks,
                                       f"the probe's per-fold moments of one layer ({run.width} wide, x {tasks} tasks)",
                                       "ask for fewer --folds, or probe a narrower site")
        size = max(1, self.parts.executor.settings.max_accumulator_bytes // (per_layer * tasks))
        return [layers[i: i + size] for i in range(0, len(layers), size)]

    def _ridge(self, query: ProbeQuery, targets: Targets, ranges, shared):
        run, layers, options = query.run, query.layers, query.options
        k, categorical = options["folds"], targets.categorical
        columns = targets.task.shape[1]
        width_t = (1 if len(targets.classes) <= 2 else len(targets.classes)) if categorical else 1
        self.parts.checks.check_memory(8 * len(targets.fold) * width_t * columns,
                                       f"the probe's targets ({width_t * columns} columns for "
                                       f"{len(targets.classes)} classes x {len(targets.fold)} samples)",
                                       "probe fewer classes (merge rare ones in the label set)")
        if categorical:
            classes = len(targets.classes)
            side = np.hstack([probes.class_targets(targets.task[:, c], classes) for c in range(columns)])
        else:
            side = np.nan_to_num(targets.task)
        groups = [slice(c * width_t, (c + 1) * width_t) for c in range(columns)]
        side_ref = ray.put(side)
        pool = options["pool"]
        submit = self.parts.executor.device_task(accumulate_samples)

        def passed(accumulators: list, layers_of_pass: list[int], side_of_pass) -> PerLayer:
            """One pass over every range group, each layer's accumulator merged in group order."""
            executor = self.parts.executor
            return executor.fold(lambda r: submit(executor.store, run.run_key, layers_of_pass, r, pool,
                                                  shared["offsets"], shared["fold"], side_of_pass,
                                                  PerLayer(accumulators)), ranges)

        reduce = remote(finalize_ridge, num_cpus=1).remote
        fits: list = []
        for group in self._layer_groups(run, layers, probes.FoldMoments.estimate_nbytes(run.width, k, side.shape[1])):
            total = passed([probes.FoldMoments(run.width, k, side.shape[1]) for _ in group], group, side_ref)
            fits += [reduce(query.features, groups, options["alpha"], options["alphas"], moments)
                     for moments in total.accumulators]  # the layers' fits side by side
        fits = gather(fits)
        extra = {"alpha": np.stack([fit.alphas[:, 0] for fit in fits])}
        if columns > 1:
            extra["control_alpha"] = np.stack([fit.alphas[:, 1] for fit in fits])
        extra["kept_dims"] = np.asarray([len(fit.keep) for fit in fits], dtype=np.float64)
        if not categorical:
            r2 = np.asarray([[[probes.r2(fit.heldout_sse[f, c], fit.heldout_sst[f, c]) for f in range(k)]
                              for fit in fits] for c in range(columns)])
            return {"r2": r2}, extra, []
        confusion = [probes.FoldConfusion(fit, groups, len(targets.classes)) for fit in fits]
        counts = np.stack(passed(confusion, layers, ray.put(targets.task)).finalize())  # (layers, columns, folds, C, C)
        return _class_scores(counts), extra, []

    def _logistic(self, query: ProbeQuery, targets: Targets, shared):
        run, layers, options = query.run, query.layers, query.options
        if not targets.categorical:
            raise InvalidArgument("the logistic probe predicts classes; a continuous target takes --method ridge")
        labelled = int((targets.fold >= 0).sum())
        self.parts.checks.check_memory(8 * 3 * max(len(targets.fold), labelled) * run.width,
                                       f"the logistic probe of one layer ({labelled} labelled rows x {run.width} in "
                                       "memory)",
                                       "use --method ridge (streamed, any n), or probe fewer samples")
        submit = self.parts.executor.device_task(logistic_layer)
        codes_ref = ray.put(targets.task)
        results = gather([submit(self.parts.executor.store, run.run_key, layer, options["pool"], shared["offsets"],
                                 shared["fold"], codes_ref, len(targets.classes), query.features, options["C"],
                                 options["tol"], options["max_iter"]) for layer in layers])
        counts = np.stack([r.counts for r in results])  # (layers, groups, folds, C, C)
        scores = _class_scores(counts)
        scores["log_loss"] = np.stack([r.log_loss for r in results]).transpose(1, 0, 2)
        iterations = np.stack([r.iterations[0] for r in results])
        unconverged = int((~np.stack([r.converged for r in results]).astype(bool)).sum())
        notes = [f"L-BFGS stopped at max_iter={options['max_iter']} before its tolerance in {unconverged} fit(s): "
                 "raise --max-iter, or --standardize the features"] if unconverged else []
        return scores, {"iterations": iterations}, notes

    # ---- the answer -----------------------------------------------------------------------------
    def _answer(self, query: ProbeQuery, targets: Targets, scores: dict[str, np.ndarray], extra: dict, notes: list):
        layers, options, k = query.layers, query.options, query.options["folds"]
        fold = targets.fold
        sizes = np.bincount(fold[fold >= 0], minlength=k)
        labelled = int(sizes.sum())
        test_fraction = float(np.mean(sizes / (labelled - sizes)))
        primary = "accuracy" if targets.categorical else "r2"
        arrays: dict[str, np.ndarray] = {"layers": np.asarray(layers, dtype=np.int64),
                                         "fold_sizes": sizes.astype(np.int64), **extra}
        for name, values in scores.items():  # values: (columns, layers, folds); column 1 is the control
            for column, prefix in enumerate(("", "control_")[: len(values)]):
                arrays[prefix + name] = values[column]
                summaries = [probes.summarise(row, test_fraction) for row in values[column]]
                for part in ("mean", "std", "low", "high"):
                    arrays[f"{prefix}{name}_{part}"] = np.asarray([getattr(s, part) for s in summaries])
        arrays["score"] = arrays[f"{primary}_mean"]
        if options["control"]:
            arrays["selectivity"] = arrays["score"] - arrays[f"control_{primary}_mean"]
        best, within = probes.best_layers(arrays["score"], options["tolerance"])
        scalars = {"n": float(labelled), "unlabelled": float(targets.unlabelled), "folds": float(k),
                   "best_layer": float(layers[best]) if best >= 0 else float("nan"),
                   "within_layer": float(layers[within]) if within >= 0 else float("nan"),
                   "best_score": float(arrays["score"][best]) if best >= 0 else float("nan"),
                   "last_score": float(arrays["score"][-1])}
        scalars["best_minus_last"] = scalars["best_score"] - scalars["last_score"]
        notes = [f"folds: {probes.FOLD_RULE}", *notes]
        if targets.categorical:
            classes = len(targets.classes)
            codes = targets.task[:, 0]
            train_counts = np.stack([np.bincount(codes[(fold >= 0) & (fold != f)], minlength=classes)
                                     for f in range(k)])
            majority = probes.majority_baseline(train_counts, [codes[fold == f] for f in range(k)], classes)
            scalars.update(classes=float(classes), chance=1.0 / classes, majority_accuracy=majority[0],
                           majority_macro_f1=majority[1])
            arrays["class_counts"] = np.bincount(codes[fold >= 0], minlength=classes).astype(np.int64)
            arrays["classes_json"] = np.frombuffer(json.dumps(targets.classes).encode(), dtype=np.uint8).copy()
            notes.append(f"{targets.label_name}: {classes} classes ({', '.join(targets.classes[:10])}"
                         f"{', ...' if classes > 10 else ''}); baselines: majority accuracy {majority[0]:.4f}, "
                         f"chance {1 / classes:.4f}")
        else:
            scalars["baseline_r2"] = 0.0
            notes.append(f"{targets.label_name}: continuous, scored by held-out R^2 (the training mean scores <= 0)")
        if targets.unlabelled:
            notes.append(f"{targets.unlabelled} of {len(fold)} samples have no label and are left out")
        if options["method"] == "ridge" and options["alpha"] is None:
            notes.append("alpha per fold by an inner cross-validation over the other folds (held-out squared error)")
        if query.against:
            arrays["against_values"], arrays["correlations"] = self._against(query, arrays["score"])
            notes.append(f"against: {', '.join(a.name for a in query.against)} (rows of against_values and "
                         "correlations; correlations: Spearman, Pearson, distance correlation over the layers where "
                         "both are finite, NaN with fewer than 3)")
        return arrays, scalars, notes

    def _against(self, query: ProbeQuery, score: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each metric's value at the probed layers (NaN where it has none), and its Spearman,
        Pearson and distance correlation with the probe score over the layers where both are finite."""
        layers = query.layers
        values = np.full((len(query.against), len(layers)), np.nan)
        correlations = np.full((len(query.against), 3), np.nan)
        for i, metric in enumerate(query.against):
            try:
                answer = self.parts.answer(MetricCall(metric.spec, query.run.run_key, given=metric.given))
            except ActStoreError as exc:
                raise type(exc)(f"--against {metric.name}: {exc}") from None
            curve = np.asarray(answer.arrays[metric.spec.curve], dtype=np.float64)
            values[i] = [curve[layer] if layer < len(curve) else np.nan for layer in layers]
            both = np.isfinite(values[i]) & np.isfinite(score)
            if both.sum() >= 3:
                a, b = values[i][both], score[both]
                correlations[i] = (probes.spearman(a, b), probes.pearson(a, b), probes.distance_correlation(a, b))
        return values, correlations


def _class_scores(counts: np.ndarray) -> dict[str, np.ndarray]:
    """Accuracy and macro-F1 per (column, layer, fold) from counts (layers, columns, folds, C, C)."""
    per = np.moveaxis(counts, 1, 0)  # (columns, layers, folds, C, C)
    return {"accuracy": np.vectorize(probes.accuracy, signature="(c,c)->()")(per),
            "macro_f1": np.vectorize(probes.macro_f1, signature="(c,c)->()")(per)}


register_family(Family("probe", ProbeQuery, ProbePlanner, "probe"))
