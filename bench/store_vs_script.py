"""The store against the best script a user could write: the full L+1 x L+1 linear CKA matrix.

  * store: `client.cka(run, refresh=True)` on a synthetic float16 run (L+1=7, d=384), counting its
    own reads of the stored chunks (through gRPC, from a fresh query, nothing cached).
  * script (the baseline): the same arrays already in memory as float64 (read time excluded):
    centre each layer once, form the 28 unique `Xi^T Xj` products with multithreaded BLAS, and
    CKA(i, j) = ||Xi^T Xj||_F^2 / (||Xi^T Xi||_F ||Xj^T Xj||_F). Gram-space peers (n x n kernels)
    are not run: they take over a minute at n=4096 and do not fit 24 GB at n=25,000.
  * ratio = store seconds / script seconds (medians of alternated rounds). Target: <= 1.0 at
    n >= 25,000. Agreement: max abs diff of the biased matrices.
  * roofline (measured in the same run, as `cka_roofline.py` does, once in every round beside the
    two sides; the median): one read of the run's stored bytes plus the accumulation syrk on random
    float64 shard blocks over as many processes as the query's map tasks. Target: store <= 1.3x
    the roofline at n >= 25,000.

    python bench/store_vs_script.py [--quick] [--sizes 4096,25000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import benchlib  # noqa: F401  (sets the Ray environment first)
import numpy as np
from benchlib import (
    cores,
    embedded,
    machine,
    median,
    read_files,
    run_files,
    verdict,
    write_result,
    write_synthetic_runs,
)
from cka_roofline import gemm_roofline

TARGET = 1.0
ROOFLINE_TARGET = 1.3


def script_cka(layers: list[np.ndarray]) -> np.ndarray:
    """The careful in-memory float64 script."""
    centred = [x - x.mean(axis=0) for x in layers]
    count = len(centred)
    cross = np.empty((count, count))
    for i in range(count):
        for j in range(i, count):
            cross[i, j] = cross[j, i] = np.sum((centred[i].T @ centred[j]) ** 2)
    norms = np.sqrt(np.diag(cross))
    return cross / np.outer(norms, norms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="4096,25000")
    parser.add_argument("--states", type=int, default=7)
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="n=2048 only, 1 round")
    args = parser.parse_args()
    sizes = [2048] if args.quick else [int(s) for s in args.sizes.split(",")]
    repeats = 1 if args.quick else args.repeats
    info = machine()
    print(f"store vs script: 7 x 7 linear CKA, L+1={args.states}, d={args.width}, float16 runs, sizes {sizes}; "
          f"{cores()} cores, load {info['loadavg_start']}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="actstore-bench-") as tmp, embedded(Path(tmp) / "store") as client:
        for n in sizes:
            run = write_synthetic_runs(client, n, states=args.states, width=args.width, seed=n)[0]
            layers = [client.read_activations(run, layer)[0].astype(np.float64) for layer in range(args.states)]
            client.cka(run, refresh=True)  # warm-up: Ray workers, imports
            store_s, script_s, roofline_s = [], [], []
            for _ in range(repeats):  # the three sides in turn, each round: load changes hit them all
                started = time.perf_counter()
                answer = client.cka(run, refresh=True)
                store_s.append(time.perf_counter() - started)
                started = time.perf_counter()
                reference = script_cka(layers)
                script_s.append(time.perf_counter() - started)
                _, read_seconds = read_files(run_files(client, run))
                roofline_s.append(read_seconds + gemm_roofline(n, client._server.service.settings.shard_rows,
                                                               args.states * args.width, cores())["syrk_seconds"])
            diff = float(np.max(np.abs(answer.biased - reference)))
            ratio = median(store_s) / median(script_s)
            roofline = median(roofline_s)
            rows.append({"n": n, "store_s": median(store_s), "script_s": median(script_s), "ratio": ratio,
                         "roofline_s": roofline, "store_over_roofline": median(store_s) / roofline,
                         "max_abs_diff": diff, "notes": answer.notes})
            print(f"  n={n}: store {median(store_s):.2f} s (its reads included) vs script {median(script_s):.2f} s "
                  f"(reads excluded): store/script {ratio:.2f}; roofline {roofline:.2f} s, store/roofline "
                  f"{median(store_s) / roofline:.2f}; max abs diff {diff:.1e}; {'; '.join(answer.notes)}", flush=True)
            del layers
    large = [row for row in rows if row["n"] >= 25_000]
    for row in large:
        print(f"n={row['n']}: store/script {row['ratio']:.2f} (target <= {TARGET}: "
              f"{verdict(row['ratio'], TARGET, higher_is_better=False)}); store/roofline "
              f"{row['store_over_roofline']:.2f} (target <= {ROOFLINE_TARGET}: "
              f"{verdict(row['store_over_roofline'], ROOFLINE_TARGET, higher_is_better=False)})")
    path = write_result("store_vs_script", {"machine": info, "rows": rows, "target": TARGET,
                                              "roofline_target": ROOFLINE_TARGET})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
