"""Work that runs as a job: capture, train, verify, and following or cancelling jobs."""

from __future__ import annotations

import json
from dataclasses import asdict

from actstore.cli import dryrun
from actstore.cli.common import add_option, connect, print_table
from actstore.options import CAPTURE, TRAIN

SITES_HELP = """\
Sites (--site, TransformerLens hook names; layer l is block l's output, layer 0 the embeddings
for every site, so a layer number names the same block in every site):
  resid_post  blocks.{i}.hook_resid_post: the block's output (the residual stream)
              BERT encoder.layer.{i} | GPT-2 transformer.h.{i} | Llama model.layers.{i} | ViT layers.{i}
  attn_out    blocks.{i}.hook_attn_out: what attention adds to the stream
              BERT encoder.layer.{i}.attention.output.dense | GPT-2 transformer.h.{i}.attn
              | Llama model.layers.{i}.self_attn | ViT layers.{i}.attention
  mlp_out     blocks.{i}.hook_mlp_out: what the MLP adds to the stream
              BERT encoder.layer.{i}.output.dense | GPT-2 transformer.h.{i}.mlp
              | Llama model.layers.{i}.mlp | ViT layers.{i}.mlp
  PATTERN     any module path of the model with * for the block index, e.g. model.layers.*.mlp.down_proj
              (its output must have the hidden size)
Several sites (--site resid_post,attn_out,mlp_out) come from one forward pass: one run per site."""


def cmd_capture(args) -> int:
    if args.dry_run:
        return dryrun.capture(args)
    with connect(args) as client:
        result = client.capture(args.model, args.dataset, pooling=args.pooling, dtype=args.dtype,
                                max_len=args.max_len, site=args.site, progress=not args.quiet,
                                max_cka_error=args.max_cka_error)
    how = "cache hit: already stored" if result.cache_hit else ("joined a running job" if result.job.joined
                                                              else "captured")
    for site, key in result.runs.items():
        print(f"run {key}  {site}  ({how})")
    return 0


def cmd_train(args) -> int:
    with connect(args) as client:
        model = client.train(args.recipe, args.method, seed=args.seed, steps=args.steps, smoke=args.smoke,
                             alternating=args.alternating, weights=args.weights, beta=args.beta,
                             progress=not args.quiet)
    print(f"trained: model {model.digest[:12]} ({', '.join(model.aliases)}); every checkpoint is registered")
    return 0


def cmd_verify(args) -> int:
    with connect(args) as client:
        report = client.verify(args.runs, all_runs=args.all, repair=args.repair, progress=not args.quiet)
    if args.json:
        print(json.dumps(asdict(report), indent=2))
        return 1 if report.damaged else 0
    print_table([{"run": r.run_key[:16], "status": r.status, "shards": r.shards,
                  "damaged shards": _shards_text(r.damaged_shards),
                  "recapture": "yes" if r.recapture else "no", "catalog": r.run_status} for r in report.runs],
                ["run", "status", "shards", "damaged shards", "recapture", "catalog"])
    damage = [{"run": r.run_key[:12], "array": d.array, "shard": "all" if d.shard < 0 else d.shard,
               "layer": "all" if d.layer < 0 else d.layer, "why": d.reason[:100]}
              for r in report.runs for d in r.damage]
    if damage:
        print()
        print_table(damage, ["run", "array", "shard", "layer", "why"])
    if report.recapture:
        print()
        advice = ("repaired: submit the same capture again to rewrite what was dropped" if report.repair else
                  "capture these again; `actstore verify RUN --repair` (admin) first drops only the damaged shards")
        print(f"{len(report.recapture)} run(s) to recapture ({advice}):")
        for key in report.recapture:
            print(f"  {key}")
    return 1 if report.damaged else 0


def _shards_text(shards: list[int]) -> str:
    """'-' for none, else the count and the indices: '1 (shard 0)', '2 (shards 0,3)'."""
    if not shards:
        return "-"
    return f"{len(shards)} ({'shard' if len(shards) == 1 else 'shards'} {','.join(map(str, shards))})"


def cmd_jobs(args) -> int:
    with connect(args) as client:
        rows = [{"job": j.job_id, "kind": j.kind, "status": j.status, "progress": f"{j.done}/{j.total} {j.unit}",
                 "target": j.target[:16], "error": j.error[:60]} for j in client.jobs(args.status)]
    print_table(rows, ["job", "kind", "status", "progress", "target", "error"])
    return 0


def cmd_watch(args) -> int:
    with connect(args) as client:
        job = client.wait(args.job, progress=True)
    print(f"job {job.job_id} {job.status}")
    return 0


def cmd_cancel(args) -> int:
    with connect(args) as client:
        job = client.cancel(args.job)
    if job.finished:
        print(f"job {job.job_id} already finished ({job.status}): nothing to cancel")
    else:
        print(f"job {job.job_id}: cancel requested ({job.status})")
    return 0


def add_commands(command) -> None:
    p = command("capture", cmd_capture, "store every layer's hidden states of a model on a dataset",
                "Runs as a Ray job with a progress bar. An identical earlier capture is a cache hit;\n"
                "an identical running one is joined; an interrupted one resumes where it stopped.\n\n"
                + SITES_HELP)
    p.add_argument("--model", required=True)
    p.add_argument("--dataset", required=True)
    add_option(p, CAPTURE, "pooling")
    add_option(p, CAPTURE, "dtype")
    add_option(p, CAPTURE, "max_len")
    add_option(p, CAPTURE, "site")
    add_option(p, CAPTURE, "max_cka_error")
    p.add_argument("--dry-run", action="store_true",
                   help="print the run keys, rows, shards, bytes (stored bytes from the compression of similar "
                        "committed runs) and an estimated time from this server's recent captures; capture nothing")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")

    p = command("train", cmd_train, "train a model (standard / aligned / multi-exit / ce-reg) as a job",
                "Recipes: vit-fmnist (ViT from scratch on Fashion-MNIST), minilm-rt (MiniLM fine-tuned on\n"
                "Rotten Tomatoes), gpt2-austen (small GPT-2 on Jane Austen). Methods: standard (last-layer CE),\n"
                "aligned (one shared head on every layer, lambda_l = 2l/(L(L+1))), multi-exit (a classifier\n"
                "per layer), ce-reg (CE + cosine regulariser). Checkpoints are registered as models;\n"
                "resubmitting the same command resumes from the last checkpoint.")
    add_option(p, TRAIN, "recipe", required=True)
    add_option(p, TRAIN, "method", required=True)
    add_option(p, TRAIN, "seed")
    add_option(p, TRAIN, "steps")
    add_option(p, TRAIN, "smoke")
    add_option(p, TRAIN, "alternating")
    add_option(p, TRAIN, "weights")
    add_option(p, TRAIN, "beta")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")

    p = command("verify", cmd_verify, "read every chunk of runs and report what is damaged (a scrub)",
                "Runs as a Ray job with a progress bar: every chunk's crc32c, the arrays' shapes and dtypes\n"
                "against the run's spec, and the catalog's chunk rows against the shards present. Prints a\n"
                "table and exits 1 when anything is damaged. --repair (admin) then drops the damaged shards, so\n"
                "submitting the same capture again recaptures only those.")
    p.add_argument("runs", nargs="*", metavar="RUN", help="run keys or their first 8+ characters")
    p.add_argument("--all", action="store_true", help="every run in the catalog")
    p.add_argument("--repair", action="store_true",
                   help="drop the damaged shards (bytes and chunk rows) so a capture rewrites them (admin)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")

    p = command("jobs", cmd_jobs, "list jobs")
    p.add_argument("--status")
    p = command("watch", cmd_watch, "follow a job with a progress bar")
    p.add_argument("job")
    p = command("cancel", cmd_cancel, "cancel a job (a cancelled capture resumes when submitted again)")
    p.add_argument("job")
