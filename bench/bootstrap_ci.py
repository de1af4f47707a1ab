"""Bootstrap CI overhead: a CKA pair query with B Poisson-bootstrap replicates vs the same query
without, same data, same server.

Data: two synthetic float16 runs of the same samples (`benchlib.write_synthetic_runs(runs=2)`),
written straight into an embedded server's store. Every timed call goes through the public client:

  * baseline: `client.cka(run_a, run_b, layers_a=[l], layers_b=[l], refresh=True)` (one layer
    pair, biased and debiased; the service picks feature or Gram space);
  * with intervals: `client.cka_stats(..., bootstrap=B, refresh=True)` (the same pair, plus the
    percentile intervals of both variants from B replicates).

Alternated --repeats rounds; ratio = median with / median without. Target <= 3x at B = 200.

Cost model (multiply-adds; D = dx + dy, R = B + 1 weight rows with the sample itself): the
bootstrap keeps the rows and, per strip of the upper triangle of the Grams, forms the two Grams
(n^2 D / 2 over all strips) and three Hadamard quadratics `w^T (K o L) w`, `w^T (K o K) w`,
`w^T (L o L) w` for every weight row (3 n^2 R / 2), plus `Kw` (2 n D R). The baseline is
min(n D^2 / 2 feature, n^2 D / 2 Gram). So the ratio grows with n / D: about 1 + 3R/D where the
baseline is in Gram space (n < D), and n (D + 3R) / D^2 once n > D.

    python bench/bootstrap_ci.py [--quick] [--n 1024] [--replicates 200] [--repeats 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import benchlib  # noqa: F401  (sets the Ray environment first)
import numpy as np
from benchlib import cores, embedded, machine, median, verdict, write_result, write_synthetic_runs

TARGET = 3.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1024, help="samples (default 1024)")
    parser.add_argument("--replicates", type=int, default=200, help="bootstrap replicates B (default 200)")
    parser.add_argument("--width", type=int, default=384, help="d (default 384)")
    parser.add_argument("--layer", type=int, default=3, help="the layer compared in both runs (default 3)")
    parser.add_argument("--repeats", type=int, default=3, help="alternated rounds (default 3; medians)")
    parser.add_argument("--quick", action="store_true", help="tiny run: n=256, B=50, 1 round")
    args = parser.parse_args()
    if args.quick:
        args.n, args.replicates, args.repeats = 256, 50, 1
    info = machine()
    print(f"bootstrap CI overhead: n={args.n}, d={args.width}, B={args.replicates}, one layer pair of two float16 "
          f"runs; {cores()} cores, load {info['loadavg_start']}", flush=True)
    d, r = 2 * args.width, args.replicates + 1
    model = {"baseline": min(args.n * d * d / 2, args.n**2 * d / 2), "bootstrap": args.n**2 * (d + 3 * r) / 2}
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
            stats = client.cka_stats(run_a, run_b, bootstrap=args.replicates, **pair)
            boot.append(time.perf_counter() - started)
        diff = float(np.abs(stats.biased - base.biased).max())
    ratio = median(boot) / median(plain)
    print(f"  without intervals: {median(plain):.3f} s  ({', '.join(f'{t:.3f}' for t in plain)}; {base.notes[0]})")
    print(f"  with B={args.replicates}:      {median(boot):.3f} s  ({', '.join(f'{t:.3f}' for t in boot)})")
    print(f"  CKA {stats.biased[0, 0]:.4f}, 95% interval [{stats.biased_ci[0, 0, 0]:.4f}, "
          f"{stats.biased_ci[0, 0, 1]:.4f}]; point estimates agree to {diff:.1e}")
    print(f"  cost model (multiply-adds): baseline {model['baseline']:.3g}, bootstrap {model['bootstrap']:.3g} "
          f"({model['bootstrap'] / model['baseline']:.1f}x)")
    print(f"ratio {ratio:.2f}x (target <= {TARGET}x): {verdict(ratio, TARGET, higher_is_better=False)}")
    write_result("bootstrap_ci", {"n": args.n, "width": args.width, "replicates": args.replicates,
                                  "seconds_plain": plain, "seconds_bootstrap": boot, "ratio": ratio,
                                  "agreement": diff, "model": model, "machine": info})


if __name__ == "__main__":
    main()
