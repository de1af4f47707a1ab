"""Bootstrap CI overhead: a CKA pair query with B Poisson-bootstrap replicates vs the same query
without, same data, same server.

Data: two synthetic float16 runs of the same samples (`benchlib.write_synthetic_runs(runs=2)`),
written straight into an embedded server's store. Every timed call goes through the public client:

  * baseline: `client.cka(run_a, run_b, layers_a=[l], layers_b=[l], refresh=True)` (one layer
    pair, biased and debiased; the service picks feature or Gram space);
  * with intervals: `client.cka_stats(..., bootstrap=B, bootstrap_method=--method, refresh=True)`
    (the same pair, plus the percentile intervals of both variants from B replicates); the report
    says which bootstrap ran (auto chooses, `actstore/server/planners/cka_bootstrap.py`).

Alternated --repeats rounds; ratio = median with / median without. Target <= 3x at B = 200.

Cost model (multiply-adds; D = dx + dy, R = B + 1 weight rows with the sample itself, P = 3
block products (A,B), (A,A), (B,B)):

  * baseline: min(n D^2 / 2 feature, n^2 D / 2 Gram);
  * exact bootstrap (`uncertain_cka`): the rows kept and, per strip of the upper triangle of the
    Grams (at least four strips once n > 1024, so the triangle with its diagonal squares is 5/8
    of the square), the two Grams and P Hadamard quadratics `w^T (K o L) w` for every weight row:
    5/8 n^2 (D + P R), plus `Kw` (2 n D R). Its ratio grows with n / D: about 5/4 (1 + 3R/D)
    where the baseline is in Gram space (n < D), 5/4 n (D + 3R) / D^2 once n > D;
  * grouped bootstrap (`grouped_cka`, G groups): the per-group moments are the baseline's syrk,
    n D^2 / 2, and the finalize, independent of n, 2 G^2 da db per product (the Frobenius Gram
    Q and the S_h t_k of the cubic tensor T; half for (A,A) and (B,B), from their upper
    triangles) plus G^3 (da + R) for T and the replicates: the ratio falls towards 1 as n grows.
    The products run in two tasks here, (A,B) beside (A,A) and (B,B), each reading every row.

    python bench/bootstrap_ci.py [--quick] [--n 1024] [--replicates 200] [--repeats 3] [--method auto]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import benchlib  # noqa: F401  (sets the Ray environment first)
import numpy as np
from benchlib import cores, embedded, machine, median, verdict, write_result, write_synthetic_runs

from actstore.metrics.similarity.grouped_cka import grouped_bootstrap_cost
from actstore.metrics.similarity.streaming import cka_mode_costs
from actstore.metrics.similarity.uncertain_cka import exact_bootstrap_cost
from actstore.options import UNCERTAINTY

TARGET = 3.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1024, help="samples (default 1024)")
    parser.add_argument("--replicates", type=int, default=200, help="bootstrap replicates B (default 200)")
    parser.add_argument("--width", type=int, default=384, help="d (default 384)")
    parser.add_argument("--layer", type=int, default=3, help="the layer compared in both runs (default 3)")
    parser.add_argument("--repeats", type=int, default=3, help="alternated rounds (default 3; medians)")
    parser.add_argument("--method", default="auto", choices=("auto", "exact", "grouped"),
                        help="the bootstrap asked for (default auto: the service chooses by modelled cost)")
    groups = UNCERTAINTY.bootstrap_groups.default
    parser.add_argument("--groups", type=int, default=groups, help=f"G of the grouped bootstrap (default {groups})")
    parser.add_argument("--quick", action="store_true", help="tiny run: n=256, B=50, 1 round")
    args = parser.parse_args()
    if args.quick:
        args.n, args.replicates, args.repeats = 256, 50, 1
    info = machine()
    print(f"bootstrap CI overhead: n={args.n}, d={args.width}, B={args.replicates}, one layer pair of two float16 "
          f"runs; {cores()} cores, load {info['loadavg_start']}", flush=True)
    widths, pair = [args.width, args.width], [(0, 1)]
    model = {"baseline": min(cka_mode_costs(widths, args.n).values()),
             "exact": exact_bootstrap_cost(widths, pair, args.n, args.replicates),
             "grouped": grouped_bootstrap_cost(widths, pair, args.n, args.replicates, args.groups)}
    with tempfile.TemporaryDirectory() as tmp, embedded(Path(tmp) / "store") as client:
        run_a, run_b = write_synthetic_runs(client, args.n, runs=2, width=args.width)
        pair = {"layers_a": [args.layer], "layers_b": [args.layer], "refresh": True}
        client.cka(run_a, run_b, **pair)  # warm: Ray workers, imports, the page cache
        client.cka_stats(run_a, run_b, bootstrap=2, **pair)
        plain, boot = [], []
        for _ in range(args.repeats):
            started = time.perf_counter()
            base = client.cka(run_a, run_b, **pair)
            plain.append(time.perf_counter() - started)
            started = time.perf_counter()
            stats = client.cka_stats(run_a, run_b, bootstrap=args.replicates, bootstrap_method=args.method,
                                     bootstrap_groups=args.groups, **pair)
            boot.append(time.perf_counter() - started)
        diff = float(np.abs(stats.biased - base.biased).max())
    ratio = median(boot) / median(plain)
    method = stats.provenance.options["bootstrap_method"]
    ran = f"{method}, G={stats.provenance.options['bootstrap_groups']}" if method == "grouped" else method
    print(f"  without intervals: {median(plain):.3f} s  ({', '.join(f'{t:.3f}' for t in plain)}; {base.notes[0]})")
    print(f"  with B={args.replicates}:      {median(boot):.3f} s  ({', '.join(f'{t:.3f}' for t in boot)}; "
          f"{ran} bootstrap, asked {args.method})")
    print(f"  CKA {stats.biased[0, 0]:.4f}, 95% interval [{stats.biased_ci[0, 0, 0]:.4f}, "
          f"{stats.biased_ci[0, 0, 1]:.4f}]; point estimates agree to {diff:.1e}")
    print(f"  cost model (multiply-adds): baseline {model['baseline']:.3g}, exact bootstrap {model['exact']:.3g} "
          f"({model['exact'] / model['baseline']:.1f}x), grouped {model['grouped']:.3g} "
          f"({model['grouped'] / model['baseline']:.1f}x)")
    print(f"ratio {ratio:.2f}x (target <= {TARGET}x): {verdict(ratio, TARGET, higher_is_better=False)}")
    write_result("bootstrap_ci", {"n": args.n, "width": args.width, "replicates": args.replicates,
                                  "method_asked": args.method, "method": method, "groups": args.groups,
                                  "seconds_plain": plain, "seconds_bootstrap": boot, "ratio": ratio,
                                  "agreement": diff, "model": model, "machine": info})


if __name__ == "__main__":
    main()
