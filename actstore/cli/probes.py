"""Label sets and probes: `register-labels`, `label-sets`, `probe` (which layer encodes a label)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from actstore.cli.common import (
    SERVER_PATH_HELP,
    add_option,
    connect,
    layers_option,
    output_options,
    print_table,
    server_path,
)
from actstore.options import LABELS, PROBE

PROBE_HELP = """\
A linear probe of each layer: how well its rows predict a label of their sample, on held-out
folds (METRICS.md, "Probes"). The folds come from the sample ids by a documented rule (stratified
by class, a dataset's augmentation groups kept whole), the same for every run of the dataset, so
layers and models are compared on the same splits.

  ridge     streamed per-fold moments, any n; classes one-vs-rest (RidgeClassifier), a continuous
            label set by regression (Ridge, scored by R^2); alpha per fold by an inner
            cross-validation over --alphas, or --alpha
  logistic  multinomial L2 by L-BFGS over the rows in memory (LogisticRegression: --C, --tol,
            --max-iter); classes only; refused beyond the server's memory limit

Scores per layer: accuracy and macro-F1 (and log-loss) or R^2, the mean over folds with its
standard deviation and a 95% interval (corrected resampled t), the majority and chance baselines,
the best layer and the smallest layer within --tolerance of it. --control adds a control task
(the labels permuted, class sizes kept) and selectivity. --against sets one-run metrics per layer
beside the score, with Spearman, Pearson and distance correlations ("Layer by Layer"). Several
runs of one dataset: one table each, and one plot.

examples:
  actstore probe RUN                                     the dataset's own labels, ridge, 5 folds
  actstore probe RUN --labels length --plot p.png        a registered label set
  actstore probe TOKEN_RUN --pool mean --method logistic --control
  actstore probe RUN_A RUN_B --against dataset-entropy,effective-rank --plot lbl.png
  actstore probe TOKEN_A TOKEN_B --pool mean --against skean2025"""


def cmd_register_labels(args) -> int:
    with connect(args) as client:
        labels = client.register_labels(args.dataset, args.file, name=args.name, id_column=args.id_column,
                                        label_column=args.label_column, kind=args.kind)
    classes = f"  classes {', '.join(labels.classes[:8])}{' ...' if len(labels.classes) > 8 else ''}" \
        if labels.classes else ""
    print(f"label set {labels.name!r} ({labels.digest[:12]})  {labels.kind}  {labels.labelled} of {labels.samples} "
          f"samples labelled{classes}")
    return 0


def cmd_label_sets(args) -> int:
    with connect(args) as client:
        rows = [{"dataset": s.dataset_digest[:12], "name": s.name, "digest": s.digest[:12], "kind": s.kind,
                 "labelled": f"{s.labelled}/{s.samples}", "classes": ",".join(s.classes[:6])}
                for s in client.label_sets(args.dataset)]
    print_table(rows, ["dataset", "name", "digest", "kind", "labelled", "classes"])
    return 0


def _options(args) -> dict:
    return {name: getattr(args, name) for name in PROBE}


def _show(result, name: str) -> None:
    metric = result.metric
    has_f1 = "macro_f1_mean" in result.arrays
    control = result.arrays.get(f"control_{metric}_mean")
    print(f"probe of {name} (run {result.provenance.run_keys[0][:12]}): {result.provenance.options['method']}, "
          f"{int(result.scalars['folds'])} folds, n={int(result.scalars['n'])}; "
          f"{'cached' if result.provenance.cached else 'computed'} ({result.provenance.seconds:.2f} s compute)")
    header = f"layer  {metric:>8}   ± std   95% interval    " + ("macro-F1  " if has_f1 else "") + \
             ("control  selectivity" if control is not None else "")
    print(header)
    low, high = result.interval
    std = result.arrays[f"{metric}_std"]
    for i, layer in enumerate(result.layers):
        line = f"{layer:5d}  {result.score[i]:8.4f}  {std[i]:6.4f}  [{low[i]:6.3f}, {high[i]:6.3f}]  "
        if has_f1:
            line += f"{result.arrays['macro_f1_mean'][i]:8.4f}  "
        if control is not None:
            line += f"{control[i]:7.4f}  {result.selectivity[i]:+11.4f}"
        print(line.rstrip())
    s = result.scalars
    print(f"best layer {result.best_layer}: {metric} {s['best_score']:.4f} (last layer {result.layers[-1]}: "
          f"{s['last_score']:.4f}, best - last {s['best_minus_last']:+.4f}); smallest layer within "
          f"{result.provenance.options['tolerance']} of the best: {result.within_layer}")
    if "majority_accuracy" in s:
        print(f"baselines: majority class {s['majority_accuracy']:.4f} (macro-F1 {s['majority_macro_f1']:.4f}), "
              f"chance {s['chance']:.4f}")
    for metric_name, rho in result.correlations.items():
        print(f"against {metric_name}: Spearman {rho['spearman']:+.3f}, Pearson {rho['pearson']:+.3f}, "
              f"distance correlation {rho['dcor']:.3f}")
    for note in result.notes:
        print(f"note: {note}")


def cmd_probe(args) -> int:
    from actstore.report import write_probes

    with connect(args) as client:
        infos = [client.describe(run) for run in args.runs]
        results = client.probe_runs([info.run_key for info in infos], layers=args.layers, refresh=args.refresh,
                                    **_options(args))
    names = [f"{(info.model_aliases or [info.model_digest[:12]])[0]}" for info in infos]
    if args.json:
        print(json.dumps([{"run_key": r.provenance.run_keys[0], "model": name, "layers": r.layers,
                           "metric": r.metric, "score": r.score.tolist(), "scalars": r.scalars,
                           "correlations": r.correlations, "options": r.provenance.options,
                           "cached": r.provenance.cached, "notes": r.notes,
                           **{k: np.asarray(v).tolist() for k, v in r.arrays.items() if k != "classes_json"},
                           "classes": r.classes} for r, name in zip(results, names)]))
        return 0
    for i, (result, name) in enumerate(zip(results, names)):
        if i:
            print()
        _show(result, name)
    if args.plot:
        write_probes(Path(args.plot), results, names, relative=len(results) > 1)
        print(f"plot written to {args.plot}")
    return 0


def add_commands(command) -> None:
    p = command("register-labels", cmd_register_labels, "register labels for a dataset's samples (a probing task)",
                "Labels by sample id for a dataset already registered (and captured): one capture serves many\n"
                "probing tasks. A .csv (header row), .jsonl/.json (records) or .parquet file with an id column\n"
                "(the dataset's sample ids) and a label column; an empty cell leaves its sample unlabelled.\n"
                "Classes or numbers (--kind). The set is content-addressed and changes no dataset digest and no\n"
                "run key; a name is unique within its dataset and never moved to other labels.")
    p.add_argument("dataset", help="the dataset's alias or digest")
    p.add_argument("file", type=server_path, help=f"the label file on the server's file system {SERVER_PATH_HELP}")
    p.add_argument("--name", help="the label set's name (default: the file's stem)")
    for name in LABELS:
        add_option(p, LABELS, name)

    p = command("label-sets", cmd_label_sets, "list the label sets of a dataset (or of all)")
    p.add_argument("dataset", nargs="?", help="a dataset's alias or digest (default: all)")

    p = command("probe", cmd_probe, "linear probe per layer: which layer encodes a label, and how well", PROBE_HELP)
    p.add_argument("runs", nargs="+", metavar="RUN", help="run keys (or 8+ character prefixes); several: runs of one "
                   "dataset, compared on the same folds")
    layers_option(p)
    strength = p.add_mutually_exclusive_group()
    for name in PROBE:
        add_option(strength if name in ("alpha", "alphas") else p, PROBE, name)
    output_options(p, "write a PNG of the score per layer (and of each --against metric) here")
