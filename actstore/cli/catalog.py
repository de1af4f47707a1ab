"""What the store holds: register models and datasets, list and describe runs, read, delete."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from actstore.cli.common import SERVER_PATH_HELP, add_option, connect, print_table, server_path
from actstore.errors import FailedPrecondition, InvalidArgument
from actstore.options import DATASETS


def cmd_register_model(args) -> int:
    with connect(args) as client:
        model = client.register_model(args.path, builtin=args.builtin, name=args.name)
    print(f"model {model.digest[:12]}  {model.kind} {model.arch}  layers 0..{model.num_layers}  "
          f"width {model.hidden_size}  aliases {', '.join(model.aliases)}")
    return 0


def cmd_register_dataset(args) -> int:
    texts = None
    if args.text:
        texts = args.text
    with connect(args) as client:
        dataset = client.register_dataset(
            args.path, builtin=args.builtin, texts=texts, name=args.name, limit=args.limit, seed=args.seed,
            split=args.split, text_column=args.text_column, label_column=args.label_column,
            id_column=args.id_column, group_column=args.group_column, augment_views=args.augment_views,
            augment_method=args.augment_method)
    print(f"dataset {dataset.digest[:12]}  {dataset.kind}  n={dataset.n}  labels={dataset.num_labels}  "
          f"aliases {', '.join(dataset.aliases)}")
    return 0


def cmd_models(args) -> int:
    with connect(args) as client:
        rows = [{"digest": m.digest[:12], "aliases": ",".join(m.aliases), "kind": m.kind, "arch": m.arch,
                 "layers": m.num_layers, "width": m.hidden_size, "head": m.has_head} for m in client.models()]
    print_table(rows, ["digest", "aliases", "kind", "arch", "layers", "width", "head"])
    return 0


def cmd_datasets(args) -> int:
    with connect(args) as client:
        rows = [{"digest": d.digest[:12], "aliases": ",".join(d.aliases), "kind": d.kind, "n": d.n,
                 "labels": d.num_labels, "groups": d.has_groups} for d in client.datasets()]
    print_table(rows, ["digest", "aliases", "kind", "n", "labels", "groups"])
    return 0


def cmd_runs(args) -> int:
    with connect(args) as client:
        rows = [{"run": r.run_key[:16], "model": r.model_digest[:12], "dataset": r.dataset_digest[:12],
                 "site": r.site, "pooling": r.pooling, "dtype": r.dtype, "n": r.n, "layers": r.num_layers + 1,
                 "width": r.width, "status": r.status}
                for r in client.runs(args.model, args.dataset, args.status, args.site)]
    print_table(rows, ["run", "model", "dataset", "site", "pooling", "dtype", "n", "layers", "width", "status"])
    return 0


def cmd_describe(args) -> int:
    with connect(args) as client:
        run = client.describe(args.run)
    print(f"run      {run.run_key}\nstatus   {run.status} ({run.recorded_shards}/{run.num_shards} shards)")
    print(f"model    {run.model_digest[:12]} ({', '.join(run.model_aliases)})")
    print(f"dataset  {run.dataset_digest[:12]} ({', '.join(run.dataset_aliases)})")
    print(f"site     {run.site}" + (f" ({run.site_modules}; layer 0 = embeddings)" if run.site_modules else ""))
    print(f"shape    n={run.n} rows={run.rows} layers=0..{run.num_layers} width={run.width}")
    print(f"storage  {run.dtype}, pooling {run.pooling}, max_len {run.max_len}, {run.stored_bytes / 2**20:.1f} MiB")
    bad = [h for h in run.health if h.nan_count or h.inf_count]
    print("health   " + ("all values finite" if not bad else
                         "; ".join(f"layer {h.layer}: {h.nan_count} NaN, {h.inf_count} Inf" for h in bad)))
    stats = [{"layer": h.layer, "mean": f"{h.mean:.4g}", "std": f"{h.std:.4g}", "row norm": f"{h.norm_mean:.4g}",
              "norm std": f"{h.norm_std:.4g}", "min": f"{h.min:.4g}", "max": f"{h.max:.4g}"}
             for h in run.health if h.mean is not None]
    if stats:
        print("\nper-layer statistics of the stored values (over rows and features; row norm = L2 norm of a row):")
        print_table(stats, ["layer", "mean", "std", "row norm", "norm std", "min", "max"])
    if run.rounding:
        print(f"\nwhat {run.dtype} storage did to each layer, measured at capture from the exact values (the bound "
              "on CKA with a layer, with probability >= 99.95% over the stochastic rounding; the sure bound: its "
              "angle, arccos CKA(exact, stored); an answer adds its two sides', each taken at the answer's CKA):")
        print_table([{"layer": r.layer, "stored": r.stored, "rel. error": f"{r.rel_frobenius:.3g}",
                      "max |error|": f"{r.max_abs:.3g}", "CKA bound": f"{r.bound_biased:.3g}",
                      "debiased bound": f"{r.bound_debiased:.3g}", "sure bound": f"{r.angle_biased:.3g}"}
                     for r in run.rounding],
                    ["layer", "stored", "rel. error", "max |error|", "CKA bound", "debiased bound", "sure bound"])
    return 0


def cmd_delete(args) -> int:
    with connect(args) as client:
        print(f"deleted run {client.delete_run(args.run)}")
    return 0


def npy_target(out: str, run: str, layer: int) -> Path:
    """Where `read --out` writes: OUT itself (with .npy added, as numpy would), or RUN-layerK.npy
    inside OUT when it is a folder. A missing folder is refused before anything is read."""
    target = Path(out).expanduser()
    if target.is_dir():
        target = target / f"{run}-layer{layer}.npy"
    elif target.suffix != ".npy":
        target = target.with_name(target.name + ".npy")
    if not target.parent.is_dir():
        raise InvalidArgument(f"--out {out}: the folder {target.parent} does not exist: create it or write elsewhere")
    return target


def cmd_read(args) -> int:
    target = npy_target(args.out, args.run, args.layer)
    with connect(args) as client:
        values, ids = client.read_activations(args.run, args.layer, args.start, args.stop)
    try:
        np.save(target, values)
    except OSError as exc:
        raise FailedPrecondition(f"cannot write {target} ({exc.strerror}): choose another --out") from None
    print(f"wrote {values.shape} {values.dtype} to {target}" + (f" ({len(ids)} sample ids)" if ids else ""))
    return 0


def add_commands(command) -> None:
    p = command("register-model", cmd_register_model, "register a local Hugging Face folder or a builtin model")
    p.add_argument("path", nargs="?", type=server_path,
                   help=f"a HF model folder on the server's file system {SERVER_PATH_HELP}")
    p.add_argument("--builtin", help="minilm-l6 | smollm2-135m (packaged, offline)")
    p.add_argument("--name", help="alias (default: the builtin or folder name)")

    p = command("register-dataset", cmd_register_dataset, "register a dataset (file, builtin, or texts)",
                "Files: .csv/.jsonl/.json/.parquet/.arrow (texts, optional labels/ids/groups), a Hugging Face\n"
                "save_to_disk folder (the same columns; --split picks a split of a DatasetDict; a ClassLabel\n"
                "label column keeps its class names; image columns are not read: images come as .npz) or .npz\n"
                "(images/x, labels/y). --limit keeps the first N rows of a file.\n"
                "Builtins: rotten-tomatoes, fashion-mnist, digits, mnist-5k, austen.")
    p.add_argument("path", nargs="?", type=server_path,
                   help=f"a dataset file or Hugging Face dataset folder on the server's file system {SERVER_PATH_HELP}")
    p.add_argument("--builtin", help="a builtin dataset name")
    p.add_argument("--text", action="append", help="an inline text (repeat)")
    p.add_argument("--name", help="alias (default: the builtin or file name)")
    add_option(p, DATASETS, "limit")
    add_option(p, DATASETS, "seed")
    p.add_argument("--split", help="train | test where the builtin has splits; a split of a DatasetDict folder")
    add_option(p, DATASETS, "text_column")
    p.add_argument("--label-column")
    p.add_argument("--id-column")
    p.add_argument("--group-column", help="augmentation group id per row")
    add_option(p, DATASETS, "augment_views")
    add_option(p, DATASETS, "augment_method")

    command("models", cmd_models, "list registered models")
    command("datasets", cmd_datasets, "list registered datasets")
    p = command("runs", cmd_runs, "list stored runs")
    p.add_argument("--model")
    p.add_argument("--dataset")
    p.add_argument("--status", help="running | committed | failed")
    p.add_argument("--site", help="only runs of this capture site (resid_post, attn_out, mlp_out or a pattern)")
    p = command("describe", cmd_describe, "show one run: site, shape, storage, NaN/Inf health, layer statistics")
    p.add_argument("run")
    p = command("delete", cmd_delete, "delete a run and its cached results (admin)")
    p.add_argument("run")

    p = command("read", cmd_read, "download one layer of a run as .npy (streamed)")
    p.add_argument("run")
    p.add_argument("--layer", type=int, required=True)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--stop", type=int)
    p.add_argument("--out", required=True, help="output .npy path, or a folder to write RUN-layerK.npy in")
