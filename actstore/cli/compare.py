"""Comparing layers (of one run or two): CKA, COS, minibatch CKA, mutual kNN, the CKA (or streamed
measure) matrix, stitching."""

from __future__ import annotations

import json
from pathlib import Path

from actstore import measures
from actstore.cli import diagnostics, dryrun
from actstore.cli.common import add_measure_options, add_option, connect, given_options, layers_option, output_options
from actstore.errors import InvalidArgument
from actstore.options import SIMILARITY, STITCH


def show_matrix(name: str, matrix, result, args, **plot_options) -> None:
    """Print a layer matrix of `result` (a table, or JSON with --json) and with --plot write the
    answer's own drawing, `result.plot(ax, **plot_options)`."""
    from actstore.report import markdown_matrix, write_matrix_plot

    layers_a, layers_b, provenance, notes = result.layers_a, result.layers_b, result.provenance, result.notes
    bound = getattr(result, "bound_debiased" if plot_options.get("debiased") else "bound_biased", None)
    if args.json:
        print(json.dumps({"metric": name, "matrix": matrix.tolist(), "layers_a": layers_a, "layers_b": layers_b,
                          "cached": provenance.cached, "seconds": provenance.seconds,
                          "run_keys": provenance.run_keys, "notes": notes, "error_bound": provenance.error_bound,
                          "bound": None if bound is None else bound.tolist()}))
        return
    print(markdown_matrix(matrix, layers_a, layers_b, digits=3))
    if bound is not None:
        print(f"\nerror bound of each entry (|{name} - the exact values' answer| <= it, at the confidence the note "
              "says):")
        print(markdown_matrix(bound, layers_a, layers_b, digits=1, notation="e"))
    print(f"\n{name}; runs {', '.join(provenance.run_name(i).label for i in range(len(provenance.run_keys)))}; "
          f"{'cached' if provenance.cached else 'computed'} ({provenance.seconds:.2f} s compute)")
    for note in notes:
        print(f"note: {note}")
    if args.plot:
        write_matrix_plot(Path(args.plot), result, matrix, **plot_options)
        print(f"plot written to {args.plot}")


def refuse_aligned_stats(args) -> None:
    """Intervals, nulls and feature options work on row-aligned runs only: say so instead of
    dropping --align."""
    if args.align != "none":
        raise InvalidArgument(f"--align {args.align} does not combine with --bootstrap, --null, --standardize or "
                              "--exclude-*: ask for the aligned matrix without them")


def cmd_cka(args) -> int:
    if diagnostics.wanted(args):
        refuse_aligned_stats(args)
        return diagnostics.cmd_cka_stats(args)
    with connect(args) as client:
        result = client.cka(args.run_a, args.run_b, layers_a=args.layers_a,
                            layers_b=args.layers_b, align=args.align, word_pool=args.word_pool,
                            refresh=args.refresh)
    matrix = result.debiased if args.debiased else result.biased
    name = f"linear CKA ({'debiased' if args.debiased else 'biased'})"
    show_matrix(name, matrix, result, args, debiased=args.debiased)
    return 0


def cmd_cos(args) -> int:
    if diagnostics.wanted(args):
        refuse_aligned_stats(args)
        return diagnostics.cmd_cos_stats(args)
    with connect(args) as client:
        result = client.cos(args.run_a, args.run_b, layers_a=args.layers_a,
                            layers_b=args.layers_b, center=args.center, align=args.align,
                            word_pool=args.word_pool, refresh=args.refresh, require_bound=args.require_bound)
    show_matrix(f"sample-wise cosine (mean, center={args.center})", result.mean, result, args)
    return 0


def cmd_minibatch(args) -> int:
    with connect(args) as client:
        result = client.minibatch_cka(args.run_a, args.run_b, batch_size=args.batch_size,
                                      layers_a=args.layers_a, layers_b=args.layers_b,
                                      remainder=args.remainder, refresh=args.refresh,
                                      require_bound=args.require_bound)
    batch = result.provenance.options["batch_size"]  # what the server used
    show_matrix(f"minibatch CKA (batch {batch})", result.values, result, args)
    return 0


def cmd_knn(args) -> int:
    with connect(args) as client:
        result = client.mutual_knn(args.run_a, args.run_b, k=args.k, layers_a=args.layers_a,
                                   layers_b=args.layers_b, refresh=args.refresh, require_bound=args.require_bound)
    k = result.provenance.options["k"]  # what the server used
    show_matrix(f"mutual kNN (k={k})", result.values, result, args)
    return 0


def cmd_cka_matrix(args) -> int:
    from actstore.report import write_matrix_plot

    if args.dry_run:
        return dryrun.cka_matrix(args)
    options = given_options(args, args.measure) if args.measure else {}  # a usage error before any connection
    with connect(args) as client:
        if args.measure:
            result = client.measure_matrix(args.runs, args.measure, refresh=args.refresh, progress=not args.json,
                                           **options)
            matrix, name, plot_options = result.values, result.identifier, {}
        else:
            result = client.cka_matrix(args.runs, refresh=args.refresh, progress=not args.json)
            matrix = result.debiased if args.debiased else result.biased
            name, plot_options = "CKA", {"debiased": args.debiased}
    labels = [f"{r}:{layer}" for r, layer in zip(result.block_run, result.block_layer)]
    if args.json:
        print(json.dumps({"matrix": matrix.tolist(), "blocks": labels, "runs": result.runs,
                          "cached": result.provenance.cached}))
        return 0
    print(f"{matrix.shape[0]} x {matrix.shape[1]} {name} matrix over runs "
          + ", ".join(f"{i}={result.provenance.run_name(i).label}" for i in range(len(result.runs)))
          + f" ({'cached' if result.provenance.cached else 'computed'}, {result.provenance.seconds:.1f} s)")
    for note in result.notes:
        print(f"note: {note}")
    if args.plot:
        write_matrix_plot(Path(args.plot), result, matrix, **plot_options)
        print(f"plot written to {args.plot}")
    return 0


def cmd_stitch(args) -> int:
    with connect(args) as client:
        answer = client.stitch(args.run_a, args.layer_a, args.run_b, args.layer_b, test_fraction=args.test_fraction,
                               seed=args.seed, tune_steps=args.tune_steps, tune_lr=args.tune_lr, refresh=args.refresh)
    if args.json:
        print(json.dumps(answer.scalars))
        return 0
    s = answer.scalars
    print(f"stitch A layer {args.layer_a} -> B layer {args.layer_b}: penalty {s['penalty']:.4f} "
          f"(B's loss {s['own_loss']:.4f} -> {s['stitched_loss']:.4f} through the stitch); fit R^2 on held-out "
          f"tokens {s['test_r2']:.3f}")
    if "tuned_penalty" in s:
        print(f"after {int(s['tune_steps'])} tuning steps: penalty {s['tuned_penalty']:.4f} (B's loss through the "
              f"stitch {s['tuned_stitched_loss']:.4f}; on the training prompts {s['train_stitched_loss']:.4f} -> "
              f"{s['tuned_train_stitched_loss']:.4f})")
    for note in answer.notes:
        print(f"note: {note}")
    return 0


def _pair_args(p) -> None:
    p.add_argument("run_a", help="run key or prefix (rows of the matrix)")
    p.add_argument("run_b", nargs="?", help="second run (columns); default: run_a")
    layers_option(p, "--layers-a")
    layers_option(p, "--layers-b", "as --layers-a")
    output_options(p, "write a heatmap PNG here")


def add_commands(command) -> None:
    p = command("cka", cmd_cka, "linear CKA between the layers of one or two runs")
    _pair_args(p)
    add_option(p, SIMILARITY, "debiased")
    diagnostics.add_stats_flags(p, "cka")
    add_option(p, SIMILARITY, "align")
    add_option(p, SIMILARITY, "word_pool")
    p = command("cos", cmd_cos, "sample-wise cosine similarity between layers")
    _pair_args(p)
    add_option(p, SIMILARITY, "center")
    diagnostics.add_stats_flags(p, "cos")
    add_option(p, SIMILARITY, "align")
    add_option(p, SIMILARITY, "word_pool")
    add_option(p, SIMILARITY, "require_bound")

    p = command("minibatch-cka", cmd_minibatch, "minibatch CKA (Nguyen et al. 2021) between layers")
    _pair_args(p)
    add_option(p, SIMILARITY, "batch_size", required=True,
               help=f"rows per batch (>= {SIMILARITY.batch_size.minimum})")
    add_option(p, SIMILARITY, "remainder")
    add_option(p, SIMILARITY, "require_bound")
    p = command("knn", cmd_knn, "mutual k-nearest-neighbour alignment (Huh et al. 2024) between layers")
    _pair_args(p)
    add_option(p, SIMILARITY, "k", "-k")
    add_option(p, SIMILARITY, "require_bound")

    p = command("cka-matrix", cmd_cka_matrix, "the full CKA matrix over every layer of several runs, as one job",
                "All runs must hold the same samples. The data is read once; the job shows progress and\n"
                "resumes from stored partial results if cancelled or interrupted.")
    p.add_argument("runs", nargs="+")
    add_option(p, SIMILARITY, "debiased")
    add_option(p, SIMILARITY, "measure", choices=[m.identifier for m in measures.measures(measures.MOMENTS)],
               help="a streamed measure instead of linear CKA (actstore measures)")  # what the matrix job computes
    add_measure_options(p, measures.MOMENTS)
    output_options(p, "write a heatmap PNG here")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan (feature/Gram space, tiles, map tasks), peak memory and FLOPs; compute nothing")

    p = command("stitch", cmd_stitch, "model stitching penalty: run A's layer into run B's model (Brown et al.)",
                "Both runs token-level (--pooling tokens) on the same dataset with the same tokenisation.")
    p.add_argument("run_a")
    p.add_argument("layer_a", type=int)
    p.add_argument("run_b")
    p.add_argument("layer_b", type=int)
    add_option(p, STITCH, "test_fraction")
    add_option(p, STITCH, "seed")
    add_option(p, STITCH, "tune_steps")
    add_option(p, STITCH, "tune_lr")
    output_options(p, plot=None)
