"""`capture --dry-run` and `cka-matrix --dry-run`: what the job would cost, as the server plans it."""

from __future__ import annotations

import json
from dataclasses import asdict

from actstore.cli.common import connect, size_text


def _seconds(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def capture(args) -> int:
    with connect(args) as client:
        plan = client.plan_capture(args.model, args.dataset, pooling=args.pooling, dtype=args.dtype,
                                   max_len=args.max_len, site=args.site,
                                   max_cka_error=getattr(args, "max_cka_error", None))
    if getattr(args, "json", False):
        print(json.dumps(asdict(plan)))
        return 0
    for site, key in plan.sites.items():
        print(f"run {key}  {site}  ({'stored: a cache hit' if plan.stored[site] else 'to capture'})")
    todo = sum(not s for s in plan.stored.values())
    print(f"per run  {plan.rows} rows ({plan.n} samples, pooling {plan.pooling}, max_len {plan.max_len}) x "
          f"layers 0..{plan.num_layers} x {plan.width}, {plan.dtype}; {plan.num_shards} shards")
    print(f"bytes    {size_text(plan.raw_bytes)} raw for the {todo} run(s) to capture, about "
          f"{size_text(plan.stored_bytes)} stored (x{plan.compression:.2f}: {plan.compression_basis})")
    print("time     " + (f"about {_seconds(plan.seconds)} ({plan.seconds_basis})" if plan.seconds
                          else f"no estimate: {plan.seconds_basis}"))
    return 0


def cka_matrix(args) -> int:
    with connect(args) as client:
        plan = client.plan_cka_matrix(args.runs)
    if args.json:
        print(json.dumps(asdict(plan)))
        return 0
    print(f"{plan.blocks} x {plan.blocks} CKA matrix over {len(plan.run_keys)} run(s), {plan.rows} rows"
          + ("  (stored already: a cache hit)" if plan.cached else ""))
    print(f"plan     {plan.mode} space, {plan.tiles} tile(s), {plan.map_tasks} map tasks")
    print(f"memory   {size_text(plan.memory_bytes)} peak accumulator (largest tile), limit "
          f"{size_text(plan.memory_limit_bytes)} (ACTSTORE_MAX_ACCUMULATOR_BYTES)")
    print(f"compute  {plan.flops / 1e9:.3g} GFLOP; {size_text(plan.read_bytes)} of values read (decoded)")
    return 0
