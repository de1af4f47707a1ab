"""Streamed Procrustes / CCA vs linear CKA on the same data: the full 7 x 7 layer matrix between two
synthetic runs (n = 100k, L+1 = 7, d = 384, float16; `benchlib.write_synthetic_runs`, as
cka_roofline.py makes them) through the public client.

Timed, alternated per round on the same warm server:
  * baseline: `client.cka(run_a, run_b, refresh=True)`: Ray map tasks accumulate the moments
    (feature space at this n), merge, finalize biased and debiased CKA.
  * `client.measure(M, run_a, run_b, refresh=True)` for M = procrustes-distance=angular,
    cca-squared_score (and, with --all, every streamed measure): the same map tasks over the same
    shards (MomentMeasures: the feature-space moments), then per block one eigen-decomposition
    and per layer pair one d x d SVD.
Reported: median wall per query and the ratio measure / CKA (no target in the issue; the pass over
the data is the same, so the ratio shows what the d^3 finalize adds). A correctness check: one
layer pair of each measure against the one-pass float64 formula on the stored rows.

    python bench/procrustes_cca.py [--quick] [--n 100000] [--repeats 3] [--all]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import benchlib  # noqa: F401  (sets the Ray environment first)
import numpy as np
from benchlib import cores, embedded, machine, median, write_result, write_synthetic_runs

MAIN_MEASURES = ("procrustes-distance=angular", "cca-squared_score")
ALL_MEASURES = ("procrustes-distance=angular", "procrustes-distance=euclidean",
                "shape_metric-alpha={alpha}-distance=angular", "cca-squared_score", "cca-score",
                "svcca-var=0.99-score", "pwcca-score")  # those the in-memory baseline below computes


def one_pass(client, run_a: str, run_b: str, measure: str) -> float:
    """The measure between layer 0 of A and layer 6 of B on the stored rows, in memory (float64)."""
    from actstore.metrics import similarity as sim

    x = client.read_activations(run_a, 0)[0].astype(np.float64)
    y = client.read_activations(run_b, 6)[0].astype(np.float64)
    if measure.startswith("procrustes"):
        return sim.procrustes_distance(x, y, measure.split("=")[1])
    if measure.startswith("shape_metric"):
        return sim.shape_metric(x, y, 1.0)
    return sim.cca_similarity(x, y, measure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=100_000, help="samples per run (default 100000)")
    parser.add_argument("--states", type=int, default=7, help="L+1 stored states (default 7)")
    parser.add_argument("--width", type=int, default=384, help="d (default 384)")
    parser.add_argument("--repeats", type=int, default=3, help="alternated rounds (default 3; medians)")
    parser.add_argument("--all", action="store_true", help="time every streamed measure, not only two")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="small run: n=8192 (CKA still picks feature space), "
                        "1 round")
    args = parser.parse_args()
    if args.quick:
        args.n, args.repeats = 8192, 1
    measures = ALL_MEASURES if args.all else MAIN_MEASURES
    info = machine()
    print(f"streamed measures vs CKA: n={args.n}, L+1={args.states}, d={args.width}, float16, two runs; "
          f"{cores()} cores, load {info['loadavg_start']}", flush=True)
    walls: dict[str, list[float]] = {"cka": [], **{m: [] for m in measures}}
    with tempfile.TemporaryDirectory(prefix="actstore-bench-") as tmp, embedded(Path(tmp) / "store") as client:
        run_a, run_b = write_synthetic_runs(client, args.n, runs=2, states=args.states, width=args.width,
                                            seed=args.seed)
        client.cka(run_a, run_b, refresh=True)  # warm-up: Ray workers started, first-use allocations
        answers = {}
        for _ in range(args.repeats):
            started = time.perf_counter()
            cka = client.cka(run_a, run_b, refresh=True)
            walls["cka"].append(time.perf_counter() - started)
            for measure in measures:
                started = time.perf_counter()
                answers[measure] = client.measure(measure, run_a, run_b, refresh=True)
                walls[measure].append(time.perf_counter() - started)
        checks = {m: {"query": float(answers[m].values[0, 6]), "one_pass": one_pass(client, run_a, run_b, m)}
                  for m in measures}
    baseline = median(walls["cka"])
    print(f"CKA (biased + debiased) 7 x 7: {baseline:.2f} s ({'; '.join(cka.notes)})")
    rows = []
    for measure in measures:
        wall = median(walls[measure])
        check = checks[measure]
        difference = abs(check["query"] - check["one_pass"])
        rows.append({"measure": measure, "walls": walls[measure], "wall_median": wall, "ratio": wall / baseline,
                     "check": check, "abs_difference": difference})
        print(f"{measure} 7 x 7: {wall:.2f} s = {wall / baseline:.2f}x CKA; layer (0, 6) {check['query']:.6f} vs "
              f"one-pass {check['one_pass']:.6f} (|diff| {difference:.1e})")
    path = write_result("procrustes_cca", {
        "quick": args.quick, "params": vars(args), "machine": info,
        "baseline": "client.cka(run_a, run_b, refresh=True) on the same runs, alternated",
        "cka_walls": walls["cka"], "cka_wall_median": baseline, "results": rows,
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
