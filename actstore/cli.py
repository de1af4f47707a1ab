"""The `actstore` command. Run `actstore --help`, or `actstore COMMAND --help`."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path

import numpy as np

from actstore.errors import ActStoreError

DEFAULT_ADDRESS = "127.0.0.1:50151"

DESCRIPTION = """\
actstore: a shared store of transformer layer activations, with a query service that computes
CKA, cosine similarity and friends next to the stored chunks.

Where commands run:
  --address HOST:PORT   talk to a running `actstore serve` (also ACTSTORE_ADDRESS)
  --store DIR           open DIR in-process (embedded server + local Ray; ~5 s to start)
  neither               use a server on 127.0.0.1:50151 if one answers, else embed ./actstore-data

Typical session:
  actstore register-model --builtin minilm-l6
  actstore register-dataset --builtin rotten-tomatoes --limit 500
  actstore capture --model minilm-l6 --dataset rotten-tomatoes --pooling mean
  actstore cka RUN --plot cka.png           (RUN: a run key or its first 8+ characters)
"""


def _layers(text: str | None) -> list[int]:
    if not text:
        return []
    layers: list[int] = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            layers.extend(range(int(lo), int(hi) + 1))
        else:
            layers.append(int(part))
    return layers


def _server_answers(address: str) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            stub = health_pb2_grpc.HealthStub(channel)
            return stub.Check(health_pb2.HealthCheckRequest(), timeout=0.5).status == 1
        except grpc.RpcError:
            return False


def connect(args):
    from actstore.client import Client

    address = args.address or os.environ.get("ACTSTORE_ADDRESS")
    if address:
        return Client(address, token=args.token)
    if args.store is None and _server_answers(DEFAULT_ADDRESS):
        return Client(DEFAULT_ADDRESS, token=args.token)
    store = args.store or os.environ.get("ACTSTORE_STORE", "./actstore-data")
    print(f"(embedded server on store {store})", file=sys.stderr)
    return Client.embedded(store)


def _print_table(rows: list[dict], columns: list[str]) -> None:
    if not rows:
        print("(none)")
        return
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for r in rows:
        print("  ".join(str(r[c]).ljust(widths[c]) for c in columns))


# ---- commands -----------------------------------------------------------------------------------
def cmd_serve(args) -> int:
    from actstore.config import Settings
    from actstore.server.app import start_server

    overrides = {k: v for k, v in {"host": args.host, "port": args.port, "store": args.store,
                                   "ray_address": args.ray_address, "metric_device": args.metric_device,
                                   }.items() if v is not None}
    if args.auth:
        overrides["auth"] = True
    server = start_server(Settings(**overrides))
    print(f"actstore serving on {server.address} (store {server.service.settings.store_path}); Ctrl-C stops",
          flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    server.stop()
    return 0


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
    _print_table(rows, ["digest", "aliases", "kind", "arch", "layers", "width", "head"])
    return 0


def cmd_datasets(args) -> int:
    with connect(args) as client:
        rows = [{"digest": d.digest[:12], "aliases": ",".join(d.aliases), "kind": d.kind, "n": d.n,
                 "labels": d.num_labels, "groups": d.has_groups} for d in client.datasets()]
    _print_table(rows, ["digest", "aliases", "kind", "n", "labels", "groups"])
    return 0


def cmd_runs(args) -> int:
    with connect(args) as client:
        rows = [{"run": r.run_key[:16], "model": r.model_digest[:12], "dataset": r.dataset_digest[:12],
                 "pooling": r.pooling, "dtype": r.dtype, "n": r.n, "layers": r.num_layers + 1, "width": r.width,
                 "status": r.status} for r in client.runs(args.model, args.dataset, args.status)]
    _print_table(rows, ["run", "model", "dataset", "pooling", "dtype", "n", "layers", "width", "status"])
    return 0


def cmd_describe(args) -> int:
    with connect(args) as client:
        run = client.describe(args.run)
    print(f"run      {run.run_key}\nstatus   {run.status} ({run.recorded_shards}/{run.num_shards} shards)")
    print(f"model    {run.model_digest[:12]} ({', '.join(run.model_aliases)})")
    print(f"dataset  {run.dataset_digest[:12]} ({', '.join(run.dataset_aliases)})")
    print(f"shape    n={run.n} rows={run.rows} layers=0..{run.num_layers} width={run.width}")
    print(f"storage  {run.dtype}, pooling {run.pooling}, max_len {run.max_len}, {run.stored_bytes / 2**20:.1f} MiB")
    bad = [h for h in run.health if h.nan_count or h.inf_count]
    print("health   " + ("all values finite" if not bad else
                         "; ".join(f"layer {h.layer}: {h.nan_count} NaN, {h.inf_count} Inf" for h in bad)))
    return 0


def cmd_delete(args) -> int:
    with connect(args) as client:
        print(f"deleted run {client.delete_run(args.run)}")
    return 0


def cmd_capture(args) -> int:
    with connect(args) as client:
        result = client.capture(args.model, args.dataset, pooling=args.pooling, dtype=args.dtype,
                                max_len=args.max_len, progress=not args.quiet)
    how = "cache hit: already stored" if result.cache_hit else ("joined a running job" if result.job.joined
                                                              else "captured")
    print(f"run {result.run_key}  ({how})")
    return 0


def cmd_train(args) -> int:
    with connect(args) as client:
        model = client.train(args.recipe, args.method, seed=args.seed, steps=args.steps, smoke=args.smoke,
                             alternating=args.alternating, weights=args.weights, progress=not args.quiet)
    print(f"trained: model {model.digest[:12]} ({', '.join(model.aliases)}); every checkpoint is registered")
    return 0


def cmd_jobs(args) -> int:
    with connect(args) as client:
        rows = [{"job": j.job_id, "kind": j.kind, "status": j.status, "progress": f"{j.done}/{j.total} {j.unit}",
                 "target": j.target[:16], "error": j.error[:60]} for j in client.jobs(args.status)]
    _print_table(rows, ["job", "kind", "status", "progress", "target", "error"])
    return 0


def cmd_watch(args) -> int:
    with connect(args) as client:
        job = client.wait(args.job, progress=True)
    print(f"job {job.job_id} {job.status}")
    return 0


def cmd_cancel(args) -> int:
    with connect(args) as client:
        job = client.cancel(args.job)
    print(f"job {job.job_id}: cancel requested ({job.status})")
    return 0


def _show_matrix(name: str, matrix, layers_a, layers_b, provenance, notes, args, title: str) -> None:
    from actstore.report import heatmap, markdown_matrix

    if args.json:
        print(json.dumps({"metric": name, "matrix": matrix.tolist(), "layers_a": layers_a, "layers_b": layers_b,
                          "cached": provenance.cached, "seconds": provenance.seconds,
                          "run_keys": provenance.run_keys, "notes": notes}))
        return
    print(markdown_matrix(matrix, layers_a, layers_b, digits=3))
    print(f"\n{name}; runs {', '.join(k[:12] for k in provenance.run_keys)}; "
          f"{'cached' if provenance.cached else 'computed'} ({provenance.seconds:.2f} s compute)")
    for note in notes:
        print(f"note: {note}")
    if args.plot:
        heatmap(matrix, Path(args.plot), title=title, xlabel="layer (B)", ylabel="layer (A)",
                xticks=layers_b, yticks=layers_a, vmin=None if "debiased" in name else 0.0)
        print(f"plot written to {args.plot}")


def cmd_cka(args) -> int:
    with connect(args) as client:
        result = client.cka(args.run_a, args.run_b, layers_a=_layers(args.layers_a),
                            layers_b=_layers(args.layers_b), refresh=args.refresh)
    matrix = result.debiased if args.debiased else result.biased
    name = f"linear CKA ({'debiased' if args.debiased else 'biased'})"
    _show_matrix(name, matrix, result.layers_a, result.layers_b, result.provenance, result.notes, args,
                 f"{name}, n={result.n}")
    return 0


def cmd_cos(args) -> int:
    with connect(args) as client:
        result = client.cos(args.run_a, args.run_b, layers_a=_layers(args.layers_a),
                            layers_b=_layers(args.layers_b), center=args.center, refresh=args.refresh)
    _show_matrix(f"sample-wise cosine (mean, center={args.center})", result.mean, result.layers_a,
                 result.layers_b, result.provenance, result.notes, args, f"mean COS, n={result.n}")
    return 0


def cmd_minibatch(args) -> int:
    with connect(args) as client:
        result = client.minibatch_cka(args.run_a, args.run_b, batch_size=args.batch_size,
                                      layers_a=_layers(args.layers_a), layers_b=_layers(args.layers_b),
                                      remainder=args.remainder, refresh=args.refresh)
    _show_matrix(f"minibatch CKA (batch {args.batch_size})", result.values, result.layers_a, result.layers_b,
                 result.provenance, result.notes, args, f"minibatch CKA, batch {args.batch_size}")
    return 0


def cmd_knn(args) -> int:
    with connect(args) as client:
        result = client.mutual_knn(args.run_a, args.run_b, k=args.k, layers_a=_layers(args.layers_a),
                                   layers_b=_layers(args.layers_b), refresh=args.refresh)
    _show_matrix(f"mutual kNN (k={args.k})", result.values, result.layers_a, result.layers_b, result.provenance,
                 result.notes, args, f"mutual kNN alignment, k={args.k}")
    return 0


def _show_curve(name: str, layers, values, provenance, notes, args, bands=None) -> None:
    from actstore.report import curves

    if args.json:
        print(json.dumps({"metric": name, "layers": layers, "values": [float(v) for v in values],
                          "cached": provenance.cached, "run_keys": provenance.run_keys, "notes": notes}))
        return
    for layer, value in zip(layers, values):
        print(f"layer {layer:3d}  {value: .6f}")
    print(f"\n{name}; run {provenance.run_keys[0][:12]}; {'cached' if provenance.cached else 'computed'} "
          f"({provenance.seconds:.2f} s compute)")
    for note in notes:
        print(f"note: {note}")
    if args.plot:
        curves({name: np.asarray(values)}, Path(args.plot), title=name, xlabel="layer", ylabel=name, bands=bands)
        print(f"plot written to {args.plot}")


def cmd_entropy(args) -> int:
    with connect(args) as client:
        result = client.entropy(args.metric.replace("-", "_"), args.run, layers=_layers(args.layers),
                                alpha=args.alpha, normalization=args.normalization, clamp=args.clamp,
                                convention=args.convention, abs_cos=args.abs_cos, permutations=args.permutations,
                                seed=args.seed, exp=args.exp, temperature=args.temperature, refresh=args.refresh)
    _show_curve(args.metric, result.layers, result.values, result.provenance, result.notes, args)
    return 0


def cmd_residual(args) -> int:
    with connect(args) as client:
        result = client.residual_norm(args.run, layers=_layers(args.layers), refresh=args.refresh)
    levels = list(result.quantile_levels)
    bands = {"residual norm ratio": (result.quantiles[:, levels.index(0.25)], result.quantiles[:, levels.index(0.75)])}
    _show_curve("residual norm ratio", result.layers, result.mean, result.provenance, result.notes, args,
                {"residual norm ratio": bands["residual norm ratio"]})
    return 0


def cmd_cka_matrix(args) -> int:
    from actstore.report import heatmap

    with connect(args) as client:
        result = client.cka_matrix(args.runs, refresh=args.refresh, progress=not args.json)
    matrix = result.debiased if args.debiased else result.biased
    labels = [f"{r}:{layer}" for r, layer in zip(result.block_run, result.block_layer)]
    if args.json:
        print(json.dumps({"matrix": matrix.tolist(), "blocks": labels, "runs": result.runs,
                          "cached": result.provenance.cached}))
        return 0
    print(f"{matrix.shape[0]} x {matrix.shape[1]} CKA matrix over runs "
          + ", ".join(f"{i}={k[:12]}" for i, k in enumerate(result.runs))
          + f" ({'cached' if result.provenance.cached else 'computed'}, {result.provenance.seconds:.1f} s)")
    for note in result.notes:
        print(f"note: {note}")
    if args.plot:
        heatmap(matrix, Path(args.plot), title="CKA over all layers of all runs", xlabel="run:layer",
                ylabel="run:layer", xticks=labels, yticks=labels, vmin=None if args.debiased else 0.0)
        print(f"plot written to {args.plot}")
    return 0


def cmd_stitch(args) -> int:
    with connect(args) as client:
        answer = client.stitch(args.run_a, args.layer_a, args.run_b, args.layer_b, test_fraction=args.test_fraction,
                               seed=args.seed, refresh=args.refresh)
    if args.json:
        print(json.dumps(answer.scalars))
        return 0
    s = answer.scalars
    print(f"stitch A layer {args.layer_a} -> B layer {args.layer_b}: penalty {s['penalty']:.4f} "
          f"(B's loss {s['own_loss']:.4f} -> {s['stitched_loss']:.4f} through the stitch); fit R^2 on held-out "
          f"tokens {s['test_r2']:.3f}")
    for note in answer.notes:
        print(f"note: {note}")
    return 0


def cmd_lens(args) -> int:
    from actstore.report import bars, curves

    taus = [float(t) for t in args.taus.split(",")] if args.taus else None
    with connect(args) as client:
        r = client.lens(args.run, epsilon=args.epsilon, taus=taus, heads=args.heads, refresh=args.refresh)
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
        curves({"lens accuracy": r.accuracy}, prefix.with_name(prefix.name + "_accuracy.png"),
               title="logit-lens accuracy per layer", xlabel="layer", ylabel="accuracy", ylim=(0, 1))
        bars({"samples": r.saturation_counts}, prefix.with_name(prefix.name + "_saturation.png"),
             title="saturation layer distribution", xlabel="layer", ylabel="samples")
        print(f"plots written to {prefix}_accuracy.png and {prefix}_saturation.png")
    return 0


def cmd_nc1(args) -> int:
    with connect(args) as client:
        result = client.neural_collapse(args.run, layers=_layers(args.layers), refresh=args.refresh)
    _show_curve("NC1", result.layers, result.values, result.provenance, result.notes, args)
    return 0


def cmd_read(args) -> int:
    import numpy as np

    with connect(args) as client:
        values, ids = client.read_activations(args.run, args.layer, args.start, args.stop)
    np.save(args.out, values)
    print(f"wrote {values.shape} {values.dtype} to {args.out}" + (f" ({len(ids)} sample ids)" if ids else ""))
    return 0


def cmd_token(args) -> int:
    from actstore.config import Settings
    from actstore.server.auth import create_token
    from actstore.store.catalog import Catalog

    settings = Settings(**({"store": args.store} if args.store else {}))
    catalog = Catalog(settings.store_path / "catalog.duckdb")
    try:
        if args.action == "create":
            token = create_token(catalog, args.name, args.role)
            print(f"token for {args.name} ({args.role}), shown once:\n{token}")
        else:
            catalog.revoke_principal(args.name)
            print(f"revoked {args.name}")
    finally:
        catalog.close()
    return 0


def cmd_experiment(args) -> int:
    from actstore.experiment import run_experiment

    run_experiment(args.recipe, Path(args.out or f"actstore-experiment-{args.recipe}"), smoke=args.smoke,
                   seed=args.seed, steps=args.steps, store=args.store, address=args.address, epsilon=args.epsilon)
    return 0


def cmd_demo(args) -> int:
    from actstore.demo import run_demo

    run_demo(out=Path(args.out), store=args.store, n=args.n, address=args.address)
    return 0


# ---- parser -------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    def connection_options(p: argparse.ArgumentParser, default) -> argparse.ArgumentParser:
        p.add_argument("--address", default=default, help="server address HOST:PORT (env ACTSTORE_ADDRESS)")
        p.add_argument("--store", default=default, help="store directory (embedded mode, or what serve owns)")
        p.add_argument("--token", default=default, help="access token if the server requires one (env ACTSTORE_TOKEN)")
        p.add_argument("-v", "--verbose", action="store_true", default=default or False, help="log what happens")
        return p

    parser = connection_options(argparse.ArgumentParser(
        prog="actstore", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter), None)
    # the same options after the command name: `actstore serve --store DIR` works too
    common = connection_options(argparse.ArgumentParser(add_help=False), argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name, func, help_text, description=None):
        p = sub.add_parser(name, help=help_text, description=description or help_text, parents=[common],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(func=func)
        return p

    p = command("serve", cmd_serve, "run the gRPC server (Ray + store + catalog owner)",
                "Serve the store on HOST:PORT. Joins RAY_ADDRESS / --ray-address, else starts a local Ray.\n"
                "Every option is also an ACTSTORE_ environment variable (ACTSTORE_PORT, ...).")
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 50151; 0 picks one)")
    p.add_argument("--ray-address", help="Ray cluster to join (default: RAY_ADDRESS, else a local one)")
    p.add_argument("--auth", action="store_true", help="require tokens (make them with `actstore token create`)")
    p.add_argument("--metric-device", choices=["auto", "cpu", "cuda", "torch-cpu"],
                   help="where metric tasks form their float64 products: auto (default) = CUDA in tasks Ray gives "
                        "a GPU share, numpy/BLAS otherwise; cpu = never a GPU; cuda = always (refused without "
                        "GPUs); torch-cpu = the GPU code path on the CPU, to check agreement")

    p = command("demo", cmd_demo, "the main job: capture MiniLM-L6 and SmolLM2, compare layers, write a report",
                "Embedded by default. Captures MiniLM-L6 and SmolLM2-135M on Rotten Tomatoes reviews, computes\n"
                "within-model CKA and COS matrices and the cross-model CKA matrix, and writes heatmaps and a\n"
                "Markdown report to --out.")
    p.add_argument("--out", default="actstore-demo", help="output folder (default ./actstore-demo)")
    p.add_argument("--n", type=int, default=300, help="number of reviews (default 300)")

    p = command("experiment", cmd_experiment, "aligned vs standard training: train, capture, lens, report",
                "Trains standard, aligned, multi-exit and ce-reg models with one recipe, seed and budget,\n"
                "captures the held-out set, and writes accuracy / COS / saturation plots, effective depths,\n"
                "the multi-exit table and a verdict on each of the paper's claims.")
    p.add_argument("--recipe", default="vit-fmnist", choices=["vit-fmnist", "minilm-rt", "gpt2-austen"])
    p.add_argument("--out", help="output folder (default ./actstore-experiment-RECIPE)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (seconds), for tests")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, help="training steps per method (default: the recipe's)")
    p.add_argument("--epsilon", type=float, default=0.1)

    p = command("register-model", cmd_register_model, "register a local Hugging Face folder or a builtin model")
    p.add_argument("path", nargs="?", help="a HF model folder on the server's file system")
    p.add_argument("--builtin", help="minilm-l6 | smollm2-135m (packaged, offline)")
    p.add_argument("--name", help="alias (default: the builtin or folder name)")

    p = command("register-dataset", cmd_register_dataset, "register a dataset (file, builtin, or texts)",
                "Files: .csv/.jsonl/.json (texts, optional labels/ids/groups) or .npz (images/x, labels/y).\n"
                "Builtins: rotten-tomatoes, fashion-mnist, digits, mnist-5k, austen.")
    p.add_argument("path", nargs="?", help="a dataset file on the server's file system")
    p.add_argument("--builtin", help="a builtin dataset name")
    p.add_argument("--text", action="append", help="an inline text (repeat)")
    p.add_argument("--name", help="alias (default: the builtin or file name)")
    p.add_argument("--limit", type=int, help="keep the first N samples (builtins: after a seeded shuffle)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", help="train | test where the builtin has splits")
    p.add_argument("--text-column")
    p.add_argument("--label-column")
    p.add_argument("--id-column")
    p.add_argument("--group-column", help="augmentation group id per row")
    p.add_argument("--augment-views", type=int, default=0, help="make N seeded augmentations of each text")
    p.add_argument("--augment-method", help="word-dropout | word-swap")

    command("models", cmd_models, "list registered models")
    command("datasets", cmd_datasets, "list registered datasets")
    p = command("runs", cmd_runs, "list stored runs")
    p.add_argument("--model")
    p.add_argument("--dataset")
    p.add_argument("--status", help="running | committed | failed")
    p = command("describe", cmd_describe, "show one run: shape, storage, NaN/Inf health")
    p.add_argument("run")
    p = command("delete", cmd_delete, "delete a run and its cached results (admin)")
    p.add_argument("run")

    p = command("capture", cmd_capture, "store every layer's hidden states of a model on a dataset",
                "Runs as a Ray job with a progress bar. An identical earlier capture is a cache hit;\n"
                "an identical running one is joined; an interrupted one resumes where it stopped.")
    p.add_argument("--model", required=True)
    p.add_argument("--dataset", required=True)
    p.add_argument("--pooling", choices=["cls", "last", "mean", "tokens"],
                   help="default: cls for encoders and vision, last for causal LMs")
    p.add_argument("--dtype", choices=["float16", "float32", "bfloat16"], help="storage dtype (default float16)")
    p.add_argument("--max-len", type=int, help="token limit (default 128)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")

    p = command("train", cmd_train, "train a model (standard / aligned / multi-exit / ce-reg) as a job",
                "Recipes: vit-fmnist (ViT from scratch on Fashion-MNIST), minilm-rt (MiniLM fine-tuned on\n"
                "Rotten Tomatoes), gpt2-austen (small GPT-2 on Jane Austen). Methods: standard (last-layer CE),\n"
                "aligned (one shared head on every layer, lambda_l = 2l/(L(L+1))), multi-exit (a classifier\n"
                "per layer), ce-reg (CE + cosine regulariser). Checkpoints are registered as models;\n"
                "resubmitting the same command resumes from the last checkpoint.")
    p.add_argument("--recipe", required=True, choices=["vit-fmnist", "minilm-rt", "gpt2-austen"])
    p.add_argument("--method", required=True, choices=["standard", "aligned", "multi-exit", "ce-reg"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, help="optimizer steps (default: the recipe's)")
    p.add_argument("--smoke", action="store_true", help="the recipe's tiny size (seconds)")
    p.add_argument("--alternating", action="store_true", help="aligned: last-layer CE on odd steps")
    p.add_argument("--weights", default="linear", choices=["linear", "uniform"], help="aligned layer weights")
    p.add_argument("-q", "--quiet", action="store_true")

    p = command("jobs", cmd_jobs, "list jobs")
    p.add_argument("--status")
    p = command("watch", cmd_watch, "follow a job with a progress bar")
    p.add_argument("job")
    p = command("cancel", cmd_cancel, "cancel a job (a cancelled capture resumes when submitted again)")
    p.add_argument("job")

    def pair_args(p):
        p.add_argument("run_a", help="run key or prefix (rows of the matrix)")
        p.add_argument("run_b", nargs="?", help="second run (columns); default: run_a")
        p.add_argument("--layers-a", help="e.g. 0,3,5 or 2-6 (default: all)")
        p.add_argument("--layers-b", help="as --layers-a")
        p.add_argument("--plot", help="write a heatmap PNG here")
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
        p.add_argument("--refresh", action="store_true", help="recompute even if cached")

    for name, func, help_text in (("cka", cmd_cka, "linear CKA between the layers of one or two runs"),
                                  ("cos", cmd_cos, "sample-wise cosine similarity between layers")):
        p = command(name, func, help_text)
        pair_args(p)
        if name == "cka":
            p.add_argument("--debiased", action="store_true", help="show debiased CKA (default: biased)")
        else:
            p.add_argument("--center", default="global-mean", choices=["global-mean", "none"])

    def curve_args(p, layers: bool = True):
        if layers:
            p.add_argument("--layers", help="e.g. 0-6 (default: all)")
        p.add_argument("--plot", help="write a layer curve PNG here")
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
        p.add_argument("--refresh", action="store_true", help="recompute even if cached")

    p = command("minibatch-cka", cmd_minibatch, "minibatch CKA (Nguyen et al. 2021) between layers")
    pair_args(p)
    p.add_argument("--batch-size", type=int, required=True, help="rows per batch (>= 4)")
    p.add_argument("--remainder", default="drop", choices=["drop", "merge"], help="the short final batch")
    p = command("knn", cmd_knn, "mutual k-nearest-neighbour alignment (Huh et al. 2024) between layers")
    pair_args(p)
    p.add_argument("-k", type=int, default=10, help="neighbours (default 10)")

    p = command("entropy", cmd_entropy, "matrix-entropy family per layer (Skean et al. 2025)",
                "dataset-entropy, effective-rank: pooled runs. prompt-entropy, curvature: token-level runs\n"
                "(--pooling tokens). infonce, dime, lidar: pooled runs of an augmented dataset\n"
                "(register-dataset --augment-views 2).")
    p.add_argument("metric", choices=["dataset-entropy", "prompt-entropy", "effective-rank", "curvature", "infonce",
                                      "dime", "lidar"])
    p.add_argument("run")
    curve_args(p)
    p.add_argument("--alpha", type=float, default=1.0, help="Renyi order (default 1: Shannon)")
    p.add_argument("--normalization", default="raw", choices=["raw", "maxEntropy", "logN", "logD"])
    p.add_argument("--clamp", action="store_true", help="clamp the Gram at 0 (as the reference code does)")
    p.add_argument("--convention", default="diff-erank", choices=["diff-erank", "roy-vetterli"])
    p.add_argument("--abs-cos", action="store_true", help="curvature: |cos| inside the arccos")
    p.add_argument("--permutations", type=int, default=10, help="DiME permutations")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--exp", action="store_true", help="LiDAR: report exp(entropy)")
    p.add_argument("--temperature", type=float, default=0.1, help="InfoNCE temperature")

    p = command("residual-norm", cmd_residual, "||h_l|| / ||h_(l+1) - h_l|| per layer (mean and quantiles)")
    p.add_argument("run")
    curve_args(p)

    p = command("cka-matrix", cmd_cka_matrix, "the full CKA matrix over every layer of several runs, as one job",
                "All runs must hold the same samples. The data is read once; the job shows progress and\n"
                "resumes from stored partial results if cancelled or interrupted.")
    p.add_argument("runs", nargs="+")
    p.add_argument("--debiased", action="store_true")
    p.add_argument("--plot")
    p.add_argument("--json", action="store_true")
    p.add_argument("--refresh", action="store_true")

    p = command("stitch", cmd_stitch, "model stitching penalty: run A's layer into run B's model (Brown et al.)",
                "Both runs token-level (--pooling tokens) on the same dataset with the same tokenisation.")
    p.add_argument("run_a")
    p.add_argument("layer_a", type=int)
    p.add_argument("run_b")
    p.add_argument("layer_b", type=int)
    p.add_argument("--test-fraction", type=float, default=0.25)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.add_argument("--refresh", action="store_true")

    p = command("lens", cmd_lens, "logit lens: per-layer accuracy, saturation, effective depth, exit sweep",
                "Applies the model's own head (final norm + classifier/unembedding) to every stored layer.\n"
                "Classifiers: a cls-pooled run of a labelled dataset. Causal LMs: a token-level run\n"
                "(next-token labels).")
    p.add_argument("run")
    p.add_argument("--epsilon", type=float, default=0.1, help="effective depth tolerance (default 0.1)")
    p.add_argument("--taus", help="exit confidence thresholds, e.g. 0.5,0.8,0.9 (default 0.5..0.99)")
    p.add_argument("--heads", default="shared", choices=["shared", "exits"],
                   help="the model's one head at every layer, or a multi-exit model's own exits")
    p.add_argument("--plot-prefix", help="write PREFIX_accuracy.png and PREFIX_saturation.png")
    p.add_argument("--json", action="store_true")
    p.add_argument("--refresh", action="store_true")
    p = command("nc1", cmd_nc1, "neural collapse NC1 per layer (labelled pooled run)")
    p.add_argument("run")
    curve_args(p)

    p = command("read", cmd_read, "download one layer of a run as .npy (streamed)")
    p.add_argument("run")
    p.add_argument("--layer", type=int, required=True)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--stop", type=int)
    p.add_argument("--out", required=True, help="output .npy path")

    p = command("token", cmd_token, "create or revoke an access token (offline, on the store directly)",
                "Works on the store's catalog directly, so run it while no server owns the store.")
    p.add_argument("action", choices=["create", "revoke"])
    p.add_argument("--name", required=True)
    p.add_argument("--role", default="reader", choices=["reader", "writer", "admin"])
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except ActStoreError as exc:
        print(f"error ({exc.code}): {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
