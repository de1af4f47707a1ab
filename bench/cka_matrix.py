"""CKA matrix: the full (L+1) x (L+1) linear CKA of a stored run vs a naive pair-by-pair peer.

Store side: the packaged MiniLM (6 blocks, so L+1 = 7 states) captured on n rotten-tomatoes
reviews (pooling mean, float16, max_len 128) beforehand, untimed; then `client.cka(run,
refresh=True)` is timed (the query only: Ray map tasks over the stored chunks, float64
streaming accumulator, reduce; refresh skips the result cache). Repeated --repeats times; the
speed-up uses the median.

Baseline (naive peer, same process): the same stored activations read with
`client.read_activations` (untimed) and cast to float32 in memory; then for each of the 49
ordered layer pairs (or the 28 unique ones with --pairs 28, mirrored), independently: the n x n
Gram matrices K = X X^T and L = Y Y^T, centred with H = I - 11^T/n as H K H and H L H (matrix
products; --center means subtracts row/column means instead), HSIC as Frobenius inner products
(np.sum(A * B), as the repo's test reference does; --frobenius vdot uses np.vdot, whose BLAS
float32 accumulation over n^2 terms costs ~1e-4 of accuracy at n=4096),
CKA = <Kc, Lc> / sqrt(<Kc, Kc> <Lc, Lc>). All in float32.

Accuracy: max |store - naive| over the biased matrices (target <= 1e-6). A float64 reference
computed in feature space from the same arrays is also printed, to show which side any
difference comes from.

    python bench/cka_matrix.py [--quick] [--n 4096] [--pairs 49|28] [--center H|means] [--repeats 3]
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
    register_reviews,
    verdict,
    write_result,
)

SPEEDUP_TARGET = 5.0
DIFF_TARGET = 1e-6


def frobenius_sum(a: np.ndarray, b: np.ndarray) -> float:
    """<A, B>_F as np.sum(A * B): numpy's pairwise summation, in float32 here."""
    return float(np.sum(a * b))


def frobenius_vdot(a: np.ndarray, b: np.ndarray) -> float:
    """<A, B>_F as np.vdot: a BLAS dot, which accumulates in float32 for float32 inputs."""
    return float(np.vdot(a, b))


def naive_cka(x: np.ndarray, y: np.ndarray, h: np.ndarray | None, frobenius=frobenius_sum) -> float:
    k = x @ x.T
    l_ = y @ y.T
    if h is not None:
        kc = h @ k @ h
        lc = h @ l_ @ h
    else:
        kc = k - k.mean(axis=0, keepdims=True) - k.mean(axis=1, keepdims=True) + k.mean()
        lc = l_ - l_.mean(axis=0, keepdims=True) - l_.mean(axis=1, keepdims=True) + l_.mean()
    kl = frobenius(kc, lc)
    kk = frobenius(kc, kc)
    ll = frobenius(lc, lc)
    return kl / np.sqrt(kk * ll)


def reference_cka(layers: list[np.ndarray]) -> np.ndarray:
    """Biased linear CKA in float64 via the feature-space identity <Kc, Lc> = ||Yc^T Xc||_F^2."""
    centred = [x.astype(np.float64) - x.astype(np.float64).mean(axis=0) for x in layers]
    self_norm = [np.linalg.norm(x.T @ x) for x in centred]
    b = len(layers)
    out = np.empty((b, b))
    for i in range(b):
        for j in range(b):
            out[i, j] = np.linalg.norm(centred[j].T @ centred[i]) ** 2 / (self_norm[i] * self_norm[j])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=4096, help="reviews captured (default 4096)")
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--pooling", default="mean")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--shard-rows", type=int, default=256, help="samples per shard (default: Settings' 256)")
    parser.add_argument("--pairs", type=int, choices=(49, 28), default=49,
                        help="naive peer: all 49 ordered pairs (default) or the 28 unique ones, mirrored")
    parser.add_argument("--center", choices=("H", "means"), default="H",
                        help="naive peer's centring: H K H matrix products (default) or row/column means")
    parser.add_argument("--frobenius", choices=("sum", "vdot"), default="sum",
                        help="naive peer's Frobenius inner product: np.sum(A * B) (default, pairwise summation) "
                             "or np.vdot (BLAS, float32 accumulation: ~1e-4 off at n=4096)")
    parser.add_argument("--repeats", type=int, default=3, help="timed store queries (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny run: n=256, shard-rows=64")
    args = parser.parse_args()
    if args.quick:
        args.n, args.shard_rows = 256, 64

    info = machine()
    print(f"CKA matrix: n={args.n} pooling={args.pooling} dtype={args.dtype} naive pairs={args.pairs} "
          f"center={args.center} frobenius={args.frobenius}; {cores()} cores, load {info['loadavg_start']}")

    with tempfile.TemporaryDirectory(prefix="actstore-bench-") as tmp, \
            embedded(Path(tmp) / "store", shard_rows=args.shard_rows) as client:
        client.register_model(builtin="minilm-l6")
        register_reviews(client, args.n, args.seed, name="reviews")
        started = time.perf_counter()
        run = client.capture("minilm-l6", "reviews", pooling=args.pooling, dtype=args.dtype,
                             max_len=args.max_len).run_key
        capture_seconds = time.perf_counter() - started
        described = client.describe(run)
        states = described.num_layers + 1
        print(f"  captured run {run[:12]} ({args.n} x {states} x {described.width}) in {capture_seconds:.1f} s "
              "(untimed for the comparison)")

        store_seconds, server_seconds = [], []
        for _ in range(args.repeats):
            started = time.perf_counter()
            result = client.cka(run, refresh=True)
            store_seconds.append(time.perf_counter() - started)
            server_seconds.append(result.provenance.seconds)
            assert not result.provenance.cached and result.n == args.n
        store = result.biased
        print("  store cka(refresh=True): " + ", ".join(f"{s:.3f}" for s in store_seconds)
              + f" s (server compute {', '.join(f'{s:.3f}' for s in server_seconds)} s); "
              + "; ".join(result.notes))

        started = time.perf_counter()
        layers = [client.read_activations(run, layer)[0].astype(np.float32) for layer in range(states)]
        read_seconds = time.perf_counter() - started

    print(f"  read {states} layers into float32 arrays: {read_seconds:.2f} s (untimed for the comparison)")
    h = None
    if args.center == "H":
        h = (np.eye(args.n, dtype=np.float32) - np.float32(1.0 / args.n)).astype(np.float32)
    frobenius = frobenius_sum if args.frobenius == "sum" else frobenius_vdot
    naive = np.empty((states, states))
    pairs = [(i, j) for i in range(states) for j in range(states) if args.pairs == 49 or j >= i]
    started = time.perf_counter()
    for count, (i, j) in enumerate(pairs, 1):
        naive[i, j] = naive_cka(layers[i], layers[j], h, frobenius)
        if args.pairs == 28:
            naive[j, i] = naive[i, j]
        if count % 7 == 0:
            print(f"    naive: {count}/{len(pairs)} pairs, {time.perf_counter() - started:.1f} s", flush=True)
    naive_seconds = time.perf_counter() - started
    reference = reference_cka(layers)

    store_median = median(store_seconds)
    speedup = naive_seconds / store_median
    diff = float(np.max(np.abs(store - naive)))
    store_vs_ref = float(np.max(np.abs(store - reference)))
    naive_vs_ref = float(np.max(np.abs(naive - reference)))
    print(f"baseline: naive pair-by-pair float32 CKA ({len(pairs)} pairs, n x n Grams, centre {args.center}, "
          f"Frobenius {args.frobenius}): "
          f"{naive_seconds:.2f} s ({naive_seconds / len(pairs):.3f} s/pair)")
    print(f"store: client.cka(run, refresh=True) median {store_median:.3f} s (first {store_seconds[0]:.3f} s)")
    print(f"speed-up = {speedup:.1f}x [target >= {SPEEDUP_TARGET:g}x: {verdict(speedup, SPEEDUP_TARGET)}] "
          f"(vs the first query: {naive_seconds / store_seconds[0]:.1f}x)")
    print(f"max |biased store - naive| = {diff:.2e} [target <= {DIFF_TARGET:g}: "
          f"{verdict(diff, DIFF_TARGET, higher_is_better=False)}]")
    print(f"  vs a float64 reference: store {store_vs_ref:.2e}, naive float32 {naive_vs_ref:.2e}")
    with np.printoptions(precision=4, suppress=True):
        print("  store biased CKA:\n" + str(store))

    path = write_result("cka_matrix", {
        "quick": args.quick, "params": vars(args), "machine": info, "run": run, "states": states,
        "baseline": f"naive float32 pair-by-pair n x n Gram CKA, {len(pairs)} pairs, centre {args.center}, "
                    f"Frobenius {args.frobenius}",
        "capture_seconds": capture_seconds, "read_seconds": read_seconds,
        "store_seconds": store_seconds, "store_server_seconds": server_seconds, "store_median_seconds": store_median,
        "naive_seconds": naive_seconds, "naive_pairs": len(pairs), "speedup": speedup,
        "speedup_vs_first_query": naive_seconds / store_seconds[0],
        "max_abs_diff_biased": diff, "max_abs_diff_store_vs_float64": store_vs_ref,
        "max_abs_diff_naive_vs_float64": naive_vs_ref,
        "targets": {"speedup": SPEEDUP_TARGET, "max_abs_diff": DIFF_TARGET},
        "pass": {"speedup": speedup >= SPEEDUP_TARGET, "max_abs_diff": diff <= DIFF_TARGET},
        "store_biased": store, "naive_biased": naive,
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
