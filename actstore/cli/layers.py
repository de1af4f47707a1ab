"""One value (or distribution) per layer of a run: the entropy family, residual norm, logit lens, NC1."""

from __future__ import annotations

import json
from pathlib import Path

from actstore import measures
from actstore.cli.common import add_option, connect, layers_option, output_options
from actstore.options import ENTROPY, LENS


def show_curve(name: str, values, result, args) -> None:
    """Print one value per layer of `result` (or JSON with --json); --plot writes its own drawing."""
    from actstore.report import write_plot

    layers, provenance, notes = result.layers, result.provenance, result.notes
    if args.json:
        print(json.dumps({"metric": name, "layers": layers, "values": [float(v) for v in values],
                          "cached": provenance.cached, "run_keys": provenance.run_keys, "notes": notes}))
        return
    for layer, value in zip(layers, values):
        print(f"layer {layer:3d}  {value: .6f}")
    print(f"\n{name}; run {provenance.run_name(0).label}; {'cached' if provenance.cached else 'computed'} "
          f"({provenance.seconds:.2f} s compute)")
    for note in notes:
        print(f"note: {note}")
    if args.plot:
        write_plot(Path(args.plot), result.plot)
        print(f"plot written to {args.plot}")


def cmd_entropy(args) -> int:
    with connect(args) as client:
        result = client.entropy(args.metric.replace("-", "_"), args.run, layers=args.layers,
                                alpha=args.alpha, normalization=args.normalization, clamp=args.clamp,
                                convention=args.convention, abs_cos=args.abs_cos, permutations=args.permutations,
                                seed=args.seed, exp=args.exp, temperature=args.temperature, preset=args.preset,
                                align=args.align, word_pool=args.word_pool, refresh=args.refresh)
    show_curve(args.metric, result.values, result, args)
    return 0


def cmd_residual(args) -> int:
    with connect(args) as client:
        result = client.residual_norm(args.run, layers=args.layers, refresh=args.refresh)
    show_curve("residual norm ratio", result.mean, result, args)
    return 0


def cmd_lens(args) -> int:
    from actstore.report import write_plot

    with connect(args) as client:
        r = client.lens(args.run, epsilon=args.epsilon, taus=args.taus, heads=args.heads, refresh=args.refresh)
    if args.json:
        print(json.dumps({"accuracy": r.accuracy.tolist(), "saturation_counts": r.saturation_counts.tolist(),
                          "effective_depth": r.effective_depth, "effective_depth_relative": r.effective_depth_relative,
                          "taus": r.taus.tolist(), "exit_accuracy": r.exit_accuracy.tolist(),
                          "speedup": r.speedup.tolist(), "exits": r.exits.tolist(), "n": r.n}))
        return 0
    print("layer  accuracy  saturated here  saturated by here")
    for layer, (acc, count, cum) in enumerate(zip(r.accuracy, r.saturation_counts, r.saturation_cumulative)):
        print(f"{layer:5d}  {acc:8.4f}  {int(count):14d}  {int(cum):10d} ({cum / r.n:.0%})")
    print(f"\n{args.epsilon}-effective depth: {r.effective_depth} (absolute), {r.effective_depth_relative} "
          f"(relative to the last layer); n={r.n}")
    print("\ntau    accuracy  speed-up  exits per layer 1..L")
    for tau, acc, speed, exits in zip(r.taus, r.exit_accuracy, r.speedup, r.exits):
        print(f"{tau:5.2f}  {acc:8.4f}  {speed:8.3f}  {' '.join(str(int(m)) for m in exits)}")
    for note in r.notes:
        print(f"note: {note}")
    if args.plot_prefix:
        prefix = Path(args.plot_prefix)
        for show in ("accuracy", "saturation"):
            write_plot(prefix.with_name(f"{prefix.name}_{show}.png"), lambda ax, show=show: r.plot(ax, show=show))
        print(f"plots written to {prefix}_accuracy.png and {prefix}_saturation.png")
    return 0


def cmd_nc1(args) -> int:
    with connect(args) as client:
        result = client.neural_collapse(args.run, layers=args.layers, refresh=args.refresh)
    show_curve("NC1", result.values, result, args)
    return 0


def _curve_args(p) -> None:
    layers_option(p)
    output_options(p, "write a layer curve PNG here")


def add_commands(command) -> None:
    metrics = measures.measures(query="entropy")  # the registry's entropy family: names, summaries, sources
    p = command("entropy", cmd_entropy, "matrix-entropy family per layer (Skean et al. 2025)",
                "\n".join(f"  {m.identifier.replace('_', '-')}: {m.summary} ({m.source})" for m in metrics) + "\n\n"
                "dataset-entropy, effective-rank: pooled runs. prompt-entropy, curvature: token-level runs\n"
                "(--pooling tokens). infonce, dime, lidar: pooled runs of an augmented dataset\n"
                "(register-dataset --augment-views 2).\n"
                "--align words (token-level run): pool each word's tokens first (--word-pool mean|last);\n"
                "dataset-entropy and effective-rank then run over all word vectors, prompt-entropy and\n"
                "curvature over each text's words, so two models with different tokenizers give curves\n"
                "over the same units. `actstore measures` lists each metric's options.")
    p.add_argument("metric", choices=[m.identifier.replace("_", "-") for m in metrics])
    p.add_argument("run")
    _curve_args(p)
    for name in ENTROPY:
        if name != "metric":
            add_option(p, ENTROPY, name)

    p = command("residual-norm", cmd_residual, "||h_l|| / ||h_(l+1) - h_l|| per layer (mean and quantiles)")
    p.add_argument("run")
    _curve_args(p)

    p = command("lens", cmd_lens, "logit lens: per-layer accuracy, saturation, effective depth, exit sweep",
                "Applies the model's own head (final norm + classifier/unembedding) to every stored layer.\n"
                "Classifiers: a cls-pooled run of a labelled dataset. Causal LMs: a token-level run\n"
                "(next-token labels).")
    p.add_argument("run")
    add_option(p, LENS, "epsilon")
    add_option(p, LENS, "taus")
    add_option(p, LENS, "heads")
    p.add_argument("--plot-prefix", help="write PREFIX_accuracy.png and PREFIX_saturation.png")
    output_options(p, plot=None)
    p = command("nc1", cmd_nc1, "neural collapse NC1 per layer (labelled pooled run)")
    p.add_argument("run")
    _curve_args(p)
