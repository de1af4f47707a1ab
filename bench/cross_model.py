"""Cross-model CKA: one `cka_matrix` job over M runs vs M(M+1)/2 separate pairwise matrix queries.

Data: M synthetic runs over the same samples (`benchlib.write_synthetic_runs(runs=M)`: identical
sample ids and one dataset record, so the service accepts them as comparable; each run has its own
mixing matrix and outlier dimensions, layer l+1 = layer l + noise). They are written straight into
the embedded server's store through its in-process service (RunLayout and RunRecord with
placeholder model and dataset records, `service.arrays.write_shard` + chunk metadata through
`service.catalog.chunks.insert` per shard, `catalog.runs.commit`), because capturing real models
would dominate the run. Every timed call goes through the public client (gRPC).

  * job: `client.cka_matrix(runs, refresh=True)`: one job (submit, watch its progress stream,
    fetch the stored result) returning the (M(L+1)) x (M(L+1)) biased and debiased CKA matrices.
  * baseline, same server, measured side by side (--repeats rounds of job then baseline): the
    M(M+1)/2 = 10 pairwise matrix queries `client.cka(run_i, run_j, refresh=True)` for i <= j,
    each an (L+1) x (L+1) matrix (i == j: the run against itself).
  * agreement: every pairwise answer against its block of the job's matrix (biased and
    debiased), max abs diff over all blocks.
  * ratio = baseline seconds / job seconds (medians). Target >= 3x.
  * the mode each path chose is printed (the notes of the answers), with the FLOP model below,
    and the peak RSS increase of the server and the Ray workers during the job (sampled every
    50 ms, as in cka_roofline.py).

Cost model (multiply-adds, D = total width of the blocks of one accumulator, B = its blocks, w
their width), the service's own (`similarity.cka_mode_costs`): feature space n D^2 / 2 (one syrk
per chunk) + n B D, Gram space n^2 D / 2 (a Gram per block, symmetric) + n^2 B^2 / 2 (the
pairwise Frobenius products). The service picks the cheaper one that fits its memory limit
(`similarity.choose_cka_mode`).

    python bench/cross_model.py [--quick] [--n 4096] [--runs 4] [--repeats 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import benchlib  # noqa: F401  (sets the Ray environment first)
import numpy as np
from benchlib import (
    RssSampler,
    cores,
    embedded,
    machine,
    median,
    release_free_heap,
    verdict,
    write_result,
    write_synthetic_runs,
)

from actstore.metrics.similarity import cka_mode_costs

SPEEDUP_TARGET = 3.0
DIFF_TARGET = 1e-9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=4096, help="samples (default 4096)")
    parser.add_argument("--runs", type=int, default=4, help="M runs (default 4)")
    parser.add_argument("--states", type=int, default=7, help="L+1 stored states per run (default 7)")
    parser.add_argument("--width", type=int, default=384, help="d (default 384)")
    parser.add_argument("--shard-rows", type=int, default=256, help="samples per shard (default: Settings' 256)")
    parser.add_argument("--repeats", type=int, default=2, help="rounds of job + baseline (default 2; medians)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny run: n=512, 1 round")
    args = parser.parse_args()
    if args.quick:
        args.n, args.repeats = 512, 1
    m, states = args.runs, args.states
    pairs = [(i, j) for i in range(m) for j in range(i, m)]

    info = machine()
    print(f"cross-model CKA: M={m} runs, n={args.n}, L+1={states}, d={args.width}, float16; "
          f"{len(pairs)} pairwise queries as the baseline; {cores()} cores, load {info['loadavg_start']}", flush=True)
    model = {
        "job": cka_mode_costs([args.width] * (m * states), args.n),
        "pairwise_self": cka_mode_costs([args.width] * states, args.n),
        "pairwise_cross": cka_mode_costs([args.width] * (2 * states), args.n),
    }
    best = {k: min(v.values()) for k, v in model.items()}
    baseline_best = m * best["pairwise_self"] + (len(pairs) - m) * best["pairwise_cross"]
    baseline_feature = m * model["pairwise_self"]["feature"] + (len(pairs) - m) * model["pairwise_cross"]["feature"]
    print(f"  FLOP model (multiply-adds): job feature {model['job']['feature']:.3g}, gram {model['job']['gram']:.3g}; "
          f"pairwise total, all feature {baseline_feature:.3g}, cheaper mode each {baseline_best:.3g}; "
          f"best-vs-best ratio {baseline_best / best['job']:.2f}x", flush=True)

    job_seconds, base_seconds, memories = [], [], []
    with tempfile.TemporaryDirectory(prefix="actstore-bench-") as tmp, \
            embedded(Path(tmp) / "store", shard_rows=args.shard_rows) as client:
        runs = write_synthetic_runs(client, args.n, runs=m, states=states, width=args.width, seed=args.seed)
        started = time.perf_counter()
        client.cka(runs[0], runs[1], refresh=True)
        print(f"  warm-up: one pairwise query, untimed ({time.perf_counter() - started:.1f} s; starts the Ray "
              "workers)", flush=True)
        for round_ in range(args.repeats):
            release_free_heap()
            sampler = RssSampler(0.05).start()
            started = time.perf_counter()
            job = client.cka_matrix(runs, refresh=True)
            job_seconds.append(time.perf_counter() - started)
            memories.append(sampler.stop())
            started = time.perf_counter()
            answers = {}
            for i, j in pairs:
                answers[i, j] = client.cka(runs[i], runs[j], refresh=True)
                assert not answers[i, j].provenance.cached
            base_seconds.append(time.perf_counter() - started)
            print(f"  round {round_ + 1}: job {job_seconds[-1]:.2f} s ({'; '.join(job.notes)}), "
                  f"{len(pairs)} pairwise queries {base_seconds[-1]:.2f} s", flush=True)
        notes = {f"{i},{j}": answers[i, j].notes for i, j in pairs}

    diffs_biased, diffs_debiased = {}, {}
    for (i, j), answer in answers.items():
        rows, cols = slice(i * states, (i + 1) * states), slice(j * states, (j + 1) * states)
        diffs_biased[f"{i},{j}"] = float(np.max(np.abs(job.biased[rows, cols] - answer.biased)))
        diffs_debiased[f"{i},{j}"] = float(np.max(np.abs(job.debiased[rows, cols] - answer.debiased)))
    diff = max(max(diffs_biased.values()), max(diffs_debiased.values()))
    job_median, base_median = median(job_seconds), median(base_seconds)
    speedup = base_median / job_median
    memory = max(memories, key=lambda x: x["sum_of_increases_mib"])
    modes = sorted({note for ns in notes.values() for note in ns if "space" in note})
    print(f"baseline: {len(pairs)} pairwise client.cka(run_i, run_j, refresh=True), i <= j: median {base_median:.2f} s "
          f"({', '.join(f'{s:.2f}' for s in base_seconds)}); modes: {'; '.join(modes)}")
    print(f"job: client.cka_matrix({m} runs, refresh=True): median {job_median:.2f} s "
          f"({', '.join(f'{s:.2f}' for s in job_seconds)}); {'; '.join(job.notes)}")
    print(f"speed-up = {speedup:.2f}x [target >= {SPEEDUP_TARGET:g}x: {verdict(speedup, SPEEDUP_TARGET)}]")
    print(f"max |job block - pairwise| over {len(pairs)} blocks: biased {max(diffs_biased.values()):.2e}, "
          f"debiased {max(diffs_debiased.values()):.2e} [<= {DIFF_TARGET:g}: "
          f"{verdict(diff, DIFF_TARGET, higher_is_better=False)}]")
    print(f"job peak memory increase: sum of per-process {memory['sum_of_increases_mib']:.0f} MiB "
          f"(server +{memory['per_process'][0]['increase_mib']:.0f} MiB; peak of summed RSS "
          f"{memory['peak_sum_mib']:.0f} MiB)")
    with np.printoptions(precision=3, suppress=True, linewidth=200):
        print("  job biased CKA, block (0, 1):\n" + str(job.biased[:states, states:2 * states]))

    path = write_result("cross_model", {
        "quick": args.quick, "params": vars(args), "machine": info, "runs": runs,
        "baseline": f"{len(pairs)} pairwise client.cka(run_i, run_j, refresh=True) queries, i <= j",
        "flop_model": model, "flop_model_pairwise_best": baseline_best, "flop_model_pairwise_feature": baseline_feature,
        "job_seconds": job_seconds, "job_median_seconds": job_median,
        "job_notes": job.notes, "baseline_seconds": base_seconds, "baseline_median_seconds": base_median,
        "baseline_notes": notes, "speedup": speedup,
        "max_abs_diff_biased": diffs_biased, "max_abs_diff_debiased": diffs_debiased, "max_abs_diff": diff,
        "job_memory": memory,
        "targets": {"speedup": SPEEDUP_TARGET, "max_abs_diff": DIFF_TARGET},
        "pass": {"speedup": speedup >= SPEEDUP_TARGET, "max_abs_diff": diff <= DIFF_TARGET},
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
