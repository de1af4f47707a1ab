"""The client's probes (`Client.probes`: "which layer encodes this?", METRICS.md "Probes"), over
a dataset's labels or a label set the catalog registered (`Client.catalog.register_labels`).

    c.register_labels("rotten-tomatoes", "lengths.csv", id_column="id", label_column="words", name="length")
    c.label_sets("rotten-tomatoes")                             # Listing[LabelSetInfo]
    p = c.probe(run)                                            # the dataset's own labels, ridge, 5 folds
    p = c.probe(run, labels="length", method="ridge")           # a continuous target: R^2 per layer
    p = c.probe(token_run, pool="mean", method="logistic", control=True, against=["dataset-entropy"])
    p.best_layer, p.score, p.selectivity, p.correlations        # per layer; p.plot(); p.to_pandas()
    results = c.probe_runs([run_a, run_b], against=["skean2025"])  # several models of one dataset

The probe goes through the generic `Measure` RPC (the spec "probe"), so its answer is cached
under its result key like every metric's, the label set's digest in it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from actstore import measures
from actstore._proto.actstore.v1 import actstore_pb2 as pb
from actstore.client import plots
from actstore.client.arguments import checking_arguments, options
from actstore.client.catalog import Catalog
from actstore.client.display import Shown, Summary
from actstore.client.frames import pandas
from actstore.client.names import short_name
from actstore.client.results import Provenance, QueryAnswer
from actstore.client.transport import Connection
from actstore.errors import InvalidArgument
from actstore.options import PROBE


@dataclass(frozen=True)
class ProbeResult(Shown):
    """A probe of one run: per probed layer (`layers`), the mean score over folds (`score`: accuracy
    for classes, R^2 for a continuous target), every score per fold (`arrays["accuracy"]`, `...["macro_f1"]`,
    `["log_loss"]`, `["r2"]`: layers x folds) with `_mean`, `_std`, `_low`, `_high` (the 95%
    corrected resampled t interval), the control task's (`control_...`) and `selectivity`; the
    best layer and the smallest within `tolerance` of it; baselines; with `against`, each metric's
    values per layer and its Spearman, Pearson and distance correlation with the score."""

    arrays: dict[str, np.ndarray]
    scalars: dict[str, float]
    provenance: Provenance
    notes: list[str] = field(default_factory=list)

    @staticmethod
    def from_answer(answer: QueryAnswer) -> ProbeResult:
        return ProbeResult(answer.arrays, answer.scalars, answer.provenance, answer.notes)

    @property
    def layers(self) -> list[int]:
        return [int(layer) for layer in self.arrays["layers"]]

    @property
    def metric(self) -> str:
        """The primary score: accuracy (classes) or r2 (a continuous target)."""
        return "accuracy" if "accuracy" in self.arrays else "r2"

    @property
    def score(self) -> np.ndarray:
        return self.arrays["score"]

    @property
    def interval(self) -> tuple[np.ndarray, np.ndarray]:
        return self.arrays[f"{self.metric}_low"], self.arrays[f"{self.metric}_high"]

    @property
    def selectivity(self) -> np.ndarray | None:
        return self.arrays.get("selectivity")

    @property
    def best_layer(self) -> int:
        return int(self.scalars["best_layer"])

    @property
    def within_layer(self) -> int:
        """The smallest layer whose score is within `tolerance` of the best one's."""
        return int(self.scalars["within_layer"])

    @property
    def classes(self) -> list[str]:
        raw = self.arrays.get("classes_json")
        return [] if raw is None else json.loads(bytes(np.asarray(raw, dtype=np.uint8)).decode())

    @property
    def baseline(self) -> float:
        """The majority class's accuracy (classes) or 0 (R^2)."""
        return self.scalars.get("majority_accuracy", self.scalars.get("baseline_r2", 0.0))

    @property
    def against(self) -> list[str]:
        return list(self.provenance.options.get("against", []))

    @property
    def correlations(self) -> dict[str, dict[str, float]]:
        """Per `against` metric: its spearman, pearson and dcor with the score over the layers."""
        values = self.arrays.get("correlations", np.empty((0, 3)))
        return {name: dict(zip(("spearman", "pearson", "dcor"), map(float, row)))
                for name, row in zip(self.against, values)}

    def to_pandas(self):
        """One row per probed layer: the score's mean, std and interval, the control's and the
        selectivity where asked, and each `against` metric."""
        columns = {"layer": self.layers}
        for name in ("accuracy", "macro_f1", "log_loss", "r2"):
            if f"{name}_mean" in self.arrays:
                for part in ("mean", "std", "low", "high"):
                    columns[f"{name}_{part}"] = self.arrays[f"{name}_{part}"]
                if f"control_{name}_mean" in self.arrays:
                    columns[f"control_{name}_mean"] = self.arrays[f"control_{name}_mean"]
        if self.selectivity is not None:
            columns["selectivity"] = self.selectivity
        for name, row in zip(self.against, self.arrays.get("against_values", [])):
            columns[name] = row
        return pandas().DataFrame(columns)

    def plot(self, ax=None, *, label: str | None = None, relative: bool = False, **style):
        """Draw the score per layer with its interval band (the control's dashed, the majority
        baseline dotted, the best layer marked) on `ax` (a new figure's when None); `relative` puts
        layer / last layer on the x axis (models of other depths side by side). Returns the Axes."""
        ax = plots.new_axes(ax, (6.4, 4.0))
        x, xlabel = plots.layer_axis(self.layers, relative)
        line = plots.curve(ax, x, self.score, band=self.interval, label=label or self.metric, **style)
        control = self.arrays.get(f"control_{self.metric}_mean")
        if control is not None:
            ax.plot(x, control, linestyle="--", color=line.get_color(), alpha=0.7,
                    label=f"{label or ''} control".strip())
        if "majority_accuracy" in self.scalars:
            ax.axhline(self.scalars["majority_accuracy"], color="0.5", linestyle=":", linewidth=1)
        best = self.layers.index(self.best_layer)
        ax.plot([x[best]], [self.score[best]], marker="*", markersize=12, color=line.get_color())
        return plots.label(ax, f"probe of {short_name(self.provenance.run_name(0))}: best layer {self.best_layer}"
                           if label is None else "probe per layer", xlabel, f"held-out {self.metric.replace('_', '-')}")

    def summary(self) -> Summary:
        s = self.scalars
        low, high = (values[self.layers.index(self.best_layer)] for values in self.interval)
        facts = [("n", str(int(s["n"]))), ("best layer", f"{self.best_layer}: {self.metric} {s['best_score']:.4f}"),
                 ("interval", f"95% corrected resampled t over {int(s['folds'])} folds at the best layer: "
                              f"[{low:.4f}, {high:.4f}]"),
                 ("last layer", f"{self.layers[-1]}: {s['last_score']:.4f}")]
        if "majority_accuracy" in s:
            facts.append(("majority baseline", f"{s['majority_accuracy']:.4f}"))
        facts += [(f"against {name}", f"Spearman {rho['spearman']:+.3f}") for name, rho in self.correlations.items()]
        return Summary(f"{self.provenance.options.get('method', '')} probe over {len(self.layers)} layers".strip(),
                       self.provenance, facts, self.notes)

    def __repr__(self) -> str:
        return (f"ProbeResult(run={self.provenance.run_keys[0][:12]}, {self.metric} over {len(self.layers)} layers, "
                f"best layer {self.best_layer} ({self.scalars['best_score']:.4f}), last "
                f"{self.scalars['last_score']:.4f}, n={int(self.scalars['n'])})")


def plot_probes(results: Sequence[ProbeResult], labels: Sequence[str] | None = None, *, relative: bool = True):
    """One figure: every result's score per (relative) layer, and one panel per `against` metric
    of the first result (each run's curve, its Spearman rho in the legend). Returns the Figure."""
    against = results[0].against
    figure, axes = plots.pyplot().subplots(1, 1 + len(against), figsize=(5.2 * (1 + len(against)), 4.0),
                                           squeeze=False)
    draw_probes(axes[0], results, labels, relative=relative)
    figure.tight_layout()
    return figure


def draw_probes(axes, results: Sequence[ProbeResult], labels: Sequence[str] | None = None, *, relative: bool = True):
    """`plot_probes` into `axes`: 1 + len(against) Axes of a figure the caller made."""
    against = results[0].against
    axes = np.asarray(axes).reshape(1, -1)
    names = list(labels or [short_name(r.provenance.run_name(0)) for r in results])
    for result, name in zip(results, names):
        result.plot(axes[0, 0], label=name, relative=relative)
        x, xlabel = plots.layer_axis(result.layers, relative)
        for panel, metric in enumerate(against, start=1):
            row = result.against.index(metric)
            rho = result.correlations[metric]["spearman"]
            plots.curve(axes[0, panel], x, result.arrays["against_values"][row], label=f"{name} (Spearman {rho:+.2f})")
    for panel, metric in enumerate(against, start=1):
        plots.label(axes[0, panel], metric, xlabel, "")
    return axes


@checking_arguments
@dataclass(eq=False)
class Probes:
    """Linear probes of runs' layers against a dataset's labels or a registered label set
    (`Catalog.register_labels`), through the generic `Measure` RPC."""

    connection: Connection
    catalog: Catalog

    @options(PROBE)
    def probe(self, run: str, *, labels: str | None = PROBE.labels.default, method: str = PROBE.method.default,
              folds: int = PROBE.folds.default, alpha: float | None = PROBE.alpha.default,
              alphas: Sequence[float] | None = None, C: float = PROBE.C.default, tol: float = PROBE.tol.default,
              max_iter: int = PROBE.max_iter.default, pool: str | None = PROBE.pool.default,
              control: bool = PROBE.control.default, control_seed: int = PROBE.control_seed.default,
              tolerance: float = PROBE.tolerance.default, against: Sequence[str] | str | None = None,
              standardize: bool = PROBE.standardize.default, exclude_dims: Sequence[int] | None = None,
              exclude_outliers: bool = PROBE.exclude_outliers.default,
              outlier_sigmas: float = PROBE.outlier_sigmas.default, layers: Sequence[int] | None = None,
              refresh: bool = False) -> ProbeResult:
        """A linear probe of every layer of `run` (or `layers`): how well the layer's rows predict
        `labels` (a registered label set of the run's dataset; default its own labels) on held-out
        folds of the sample ids (`folds`, stratified, the same for every run of the dataset).
        method="ridge" (streamed, any n; `alpha`, or one per fold from `alphas` by inner CV) or
        "logistic" (L2, L-BFGS in memory; `C`, `tol`, `max_iter`). A token-level run needs `pool`.
        `control`: the same probe of a seeded relabelling, and selectivity. `against`: one-run
        per-layer metrics (e.g. "dataset-entropy", or "skean2025") set beside the score, with their
        correlations over the layers (Skean et al. 2025). Returns a `ProbeResult`."""
        given = {"labels": labels, "method": method, "folds": folds, "alpha": alpha, "alphas": alphas, "pool": pool,
                 "control": control, "control_seed": control_seed, "tolerance": tolerance, "against": against,
                 "standardize": standardize, "exclude_dims": exclude_dims, "exclude_outliers": exclude_outliers,
                 "outlier_sigmas": outlier_sigmas}
        if method == "logistic":  # the other method's options are not sent at their defaults
            given.update(C=C, tol=tol, max_iter=max_iter, alphas=None)
        else:
            untouched = {"C": PROBE.C.default, "tol": PROBE.tol.default, "max_iter": PROBE.max_iter.default}
            given.update({k: v for k, v in {"C": C, "tol": tol, "max_iter": max_iter}.items() if v != untouched[k]})
        spec = measures.get("probe")
        request = pb.MeasureRequest(measure="probe", run_a=run, layers_a=list(layers or []), refresh=refresh,
                                    options_json=json.dumps(spec.check(given)))
        return ProbeResult.from_answer(QueryAnswer.from_proto(self.connection.query.Measure(request)))

    def probe_runs(self, runs: Sequence[str], **options: Any) -> list[ProbeResult]:
        """`probe` of several runs of one dataset with the same options (paired: the same folds)."""
        infos = [self.catalog.describe(run) for run in runs]
        datasets = {info.dataset_digest for info in infos}
        if len(datasets) > 1:
            raise InvalidArgument(f"the runs are of {len(datasets)} datasets: a comparison across models probes runs "
                                  "of one dataset (the same samples and folds)")
        return [self.probe(info.run_key, **options) for info in infos]
