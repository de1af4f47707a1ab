"""Sentiment probes of MiniLM-L6 and SmolLM2-135M on Rotten Tomatoes, with the "Layer by Layer"
correlations of the entropy family (issue 34's evaluation): writes a report and a figure.

For each model: a mean-pooled run and a token-level run of the same n reviews (the builtin
dataset's seeded sample, max_len 128). Per layer: the ridge probe of the reviews' fresh/rotten
labels (5 folds of the sample ids, alpha by inner cross-validation) with its control task, the
logistic probe, and beside them dataset entropy and effective rank (pooled run), prompt entropy and
curvature (token-level run, the probe pooled by the mean of each review's tokens), and the
skean2025 preset's three; then their Spearman, Pearson and distance correlations with the probe
accuracy over the layers. Everything is asked of the service; the script only formats answers.

    python scripts/probe_experiment.py [--n 2000] [--store ./actstore-data] [--out docs/experiments/probes-rt]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from actstore.client import Client
from actstore.client.probes import plot_probes

MODELS = (("minilm-l6", "MiniLM-L6"), ("smollm2-135m", "SmolLM2-135M"))
POOLED = ("dataset-entropy", "effective-rank")
TOKENS = ("prompt-entropy", "curvature", "skean2025")


def table(result, label: str) -> str:
    rows = ["| layer | accuracy (mean +- std) | 95% interval | macro-F1 | control | selectivity | logistic |",
            "|---|---|---|---|---|---|---|"]
    low, high = result["ridge"].interval
    ridge, logistic = result["ridge"], result["logistic"]
    for i, layer in enumerate(ridge.layers):
        rows.append(f"| {layer} | {ridge.score[i]:.4f} +- {ridge.arrays['accuracy_std'][i]:.4f} | "
                    f"[{low[i]:.3f}, {high[i]:.3f}] | {ridge.arrays['macro_f1_mean'][i]:.4f} | "
                    f"{ridge.arrays['control_accuracy_mean'][i]:.4f} | {ridge.selectivity[i]:+.4f} | "
                    f"{logistic.score[i]:.4f} |")
    s = ridge.scalars
    summary = (f"{label}: best layer {ridge.best_layer} of {ridge.layers[-1]} (accuracy {s['best_score']:.4f}; the "
               f"last layer {s['last_score']:.4f}, so the best is {s['best_minus_last']:+.4f} over it); the smallest "
               f"layer within 0.01 of the best: {ridge.within_layer}; majority class {s['majority_accuracy']:.4f}. "
               f"Logistic: best layer {logistic.best_layer} ({logistic.scalars['best_score']:.4f}), last "
               f"{logistic.scalars['last_score']:.4f}.")
    return summary + "\n\n" + "\n".join(rows)


def correlations(results, labels) -> str:
    rows = ["| model | metric | Spearman | Pearson | distance correlation |", "|---|---|---|---|---|"]
    for result, label in zip(results, labels):
        for probe in (result["pooled_against"], result["token_against"]):
            for name, rho in probe.correlations.items():
                rows.append(f"| {label} | {name} | {rho['spearman']:+.3f} | {rho['pearson']:+.3f} | "
                            f"{rho['dcor']:.3f} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--store", default="./actstore-data")
    parser.add_argument("--out", default="docs/experiments/probes-rt")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results, labels, seconds = [], [], {}
    with Client.embedded(args.store) as client:
        name = f"rotten-tomatoes-{args.n}"
        dataset = client.register_dataset(builtin="rotten-tomatoes", limit=args.n, seed=0, name=name)
        for builtin, label in MODELS:
            t = time.perf_counter()
            client.register_model(builtin=builtin)
            pooled = client.capture(builtin, name, pooling="mean", progress=True).run_key
            tokens = client.capture(builtin, name, pooling="tokens", progress=True).run_key
            seconds[f"{label}: captures"] = time.perf_counter() - t
            t = time.perf_counter()
            result = {"ridge": client.probe(pooled, control=True),
                      "logistic": client.probe(pooled, method="logistic", standardize=True),
                      "pooled_against": client.probe(pooled, against=list(POOLED)),
                      "token_against": client.probe(tokens, pool="mean", against=list(TOKENS))}
            seconds[f"{label}: probes and metrics"] = time.perf_counter() - t
            results.append(result)
            labels.append(label)
            print(table(result, label), flush=True)
    plot_probes([r["pooled_against"] for r in results], labels).savefig(out / "probe_pooled.png", dpi=110)
    plot_probes([r["token_against"] for r in results], labels).savefig(out / "probe_tokens.png", dpi=110)
    report = (
        f"# Sentiment probes of MiniLM-L6 and SmolLM2-135M ({dataset.n} Rotten Tomatoes reviews)\n\n"
        "Written by `python scripts/probe_experiment.py`"
        f" (n={args.n}). Labels: the reviews' fresh/rotten. Ridge probe per layer of the mean-pooled runs, 5 folds "
        "of the sample ids (the same for both models), alpha per fold by inner cross-validation; the control task "
        "permutes the labels (selectivity = accuracy - control accuracy); logistic: L2, C=1, standardised.\n\n"
        + "\n\n".join(table(r, label) for r, label in zip(results, labels))
        + "\n\n## Layer by Layer: the entropy family against the probe accuracy, over the layers\n\n"
        "Pooled-run metrics against the pooled run's probe; token-level metrics (and the skean2025 preset) "
        "against the probe of the token-level run pooled by each review's mean token.\n\n"
        + correlations(results, labels)
        + "\n\n![pooled](probe_pooled.png)\n\n![tokens](probe_tokens.png)\n\n## Timings\n\n"
        + "\n".join(f"- {k}: {v:.0f} s" for k, v in seconds.items())
        + f"\n- total: {time.perf_counter() - started:.0f} s\n")
    (out / "report.md").write_text(report)
    print(f"wrote {out / 'report.md'}")


if __name__ == "__main__":
    main()
