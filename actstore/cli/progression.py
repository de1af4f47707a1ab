"""`actstore progression`: a metric per layer over a model's registered training steps."""

from __future__ import annotations

import json
from pathlib import Path

from actstore.cli.common import add_option, connect, layers_option, output_options, print_table
from actstore.options import CAPTURE, PROGRESSION


def cmd_progression(args) -> int:
    from actstore.report import write_plot

    with connect(args) as client:
        result = client.progression(args.model, args.dataset, metric=args.metric, layers=args.layers,
                                    pooling=args.pooling, max_len=args.max_len, progress=not args.json)
    if args.json:
        print(json.dumps({"metric": result.metric, "model": result.base, "steps": result.steps.tolist(),
                          "layers": result.layers, "values": result.values.tolist(), "runs": result.runs}))
        return 0
    rows = [{"step": int(step), **{f"layer {layer}": f"{v:.4f}" for layer, v in zip(result.layers, row)}}
            for step, row in zip(result.steps, result.values)]
    print_table(rows, ["step", *(f"layer {layer}" for layer in result.layers)])
    print(f"\n{result.metric} of {result.base} over {len(result.steps)} registered steps")
    if args.plot:
        write_plot(Path(args.plot), result.plot)
        print(f"plot written to {args.plot}")
    return 0


def add_commands(command) -> None:
    p = command("progression", cmd_progression, "a metric per layer over a model's registered training steps",
                "Captures every registered checkpoint (NAME@stepK, as `actstore train` registers them) of MODEL\n"
                "on --dataset and plots one curve per layer over the steps (Skean et al. 2025):\n"
                "cka-to-final (CKA of each layer to the same layer of the final step), dataset-entropy, or\n"
                "lens-accuracy (logit lens with each checkpoint's own head). Captures and queries are cached.")
    p.add_argument("model", help="the training run's name (e.g. vit-fmnist-aligned-s0), a NAME@stepK alias or "
                                 "a checkpoint's digest")
    p.add_argument("--dataset", required=True, help="the dataset to capture every checkpoint on")
    add_option(p, PROGRESSION, "metric")
    add_option(p, CAPTURE, "pooling")
    add_option(p, CAPTURE, "max_len")
    layers_option(p)
    output_options(p, "write the curves (one per layer, over the steps) as a PNG here")
