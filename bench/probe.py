"""The streamed ridge probe of every layer against a careful in-memory script (issue 34).

  * store: `client.probe(run, labels=..., refresh=True)` on a synthetic float16 run (L+1=7, d=384;
    `benchlib.write_synthetic_runs`), a 3-class label set registered by sample id (the argmax of
    three of the samples' latent dimensions, so layers carry the label with noise): 5 folds, alpha
    per fold picked from the 13-value grid by the inner cross-validation, its reads included,
    through gRPC, nothing cached.
  * script (the baseline): the same rows already in memory as float16 (reads excluded), the same
    folds; per layer: upcast to float64, the per-fold moments `X_f^T X_f`, `X_f^T Y`, sums with
    multithreaded BLAS; one eigendecomposition of every inner training part (all folds but two:
    10 for 5 folds) serving the whole grid, the chosen alpha's fit from one more per outer fold,
    predictions of the held-out rows; the accuracy per fold: the store's algebra. A user with
    scikit-learn's RidgeClassifierCV over the same grid and folds refits each (fold, alpha) from
    the rows (about 20x the work), so the script is the fair peer.
  * ratio = store seconds / script seconds (medians of alternated rounds). Target: <= 1.0.
    Agreement: every layer's per-fold accuracies equal.
  * peak memory: the RSS increase of the server process and every Ray process during the store's
    probe (`benchlib.RssSampler`), at n = 25k, 50k, 100k. Target: flat (the largest n's increase
    at most 1.5x the smallest's): the moments are O(folds x d^2), whatever n.

    python bench/probe.py [--quick] [--sizes 25000,50000,100000] [--repeats 3]
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
    synthetic_latents,
    verdict,
    write_result,
    write_synthetic_runs,
)

from actstore.metrics.probes import assign_folds

TARGET = 1.0
FLATNESS_TARGET = 1.5
ALPHAS = tuple(float(10.0 ** (k / 2)) for k in range(-6, 7))


def script_probe(layers: list[np.ndarray], codes: np.ndarray, fold: np.ndarray, k: int) -> np.ndarray:
    """The careful in-memory script: (layers, folds) held-out accuracies of the ridge classifier."""
    classes = int(codes.max()) + 1
    targets = -np.ones((len(codes), classes))
    targets[np.arange(len(codes)), codes] = 1.0
    accuracy = np.empty((len(layers), k))
    members = [np.flatnonzero(fold == f) for f in range(k)]
    for index, stored in enumerate(layers):
        x = stored.astype(np.float64)
        parts = []
        for rows in members:
            xf, yf = x[rows], targets[rows]
            parts.append((len(rows), xf.sum(0), xf.T @ xf, yf.sum(0), xf.T @ yf, (yf * yf).sum(0)))
        total = [sum(p[i] for p in parts) for i in range(6)]

        def minus(a, *bs):
            return [a[i] - sum(b[i] for b in bs) for i in range(6)]

        def solver(train):
            n, s, g, sy, gxy, _ = train
            mean, ymean = s / n, sy / n
            values, vectors = np.linalg.eigh(g - np.outer(s, mean))
            return mean, ymean, np.maximum(values, 0), vectors, vectors.T @ (gxy - np.outer(s, ymean))

        inner = {}  # the part without folds f and g, decomposed once for (f, g) and (g, f)
        for f in range(k):
            errors = np.zeros(len(ALPHAS))
            for g in range(k):
                if g == f:
                    continue
                pair = (min(f, g), max(f, g))
                if pair not in inner:
                    inner[pair] = solver(minus(total, parts[pair[0]], parts[pair[1]]))
                mean, ymean, values, vectors, q = inner[pair]
                n, s, gg, sy, gxy, syy = parts[g]
                sxx = gg - np.outer(s, mean) - np.outer(mean, s) + n * np.outer(mean, mean)
                sxy = gxy - np.outer(s, ymean) - np.outer(mean, sy) + n * np.outer(mean, ymean)
                szz = (syy - 2 * ymean * sy + n * ymean**2).sum()
                for j, alpha in enumerate(ALPHAS):
                    w = vectors @ (q / (values + alpha)[:, None])
                    errors[j] += szz - 2 * np.sum(w * sxy) + np.sum(w * (sxx @ w))
            alpha = ALPHAS[len(ALPHAS) - 1 - int(np.argmin(errors[::-1]))]
            mean, ymean, values, vectors, q = solver(minus(total, parts[f]))
            weights = vectors @ (q / (values + alpha)[:, None])
            scores = (x[members[f]] - mean) @ weights + ymean
            accuracy[index, f] = np.mean(scores.argmax(1) == codes[members[f]])
    return accuracy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="25000,50000,100000")
    parser.add_argument("--states", type=int, default=7)
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="n=4096 only, 1 round")
    args = parser.parse_args()
    sizes = [4096] if args.quick else sorted(int(s) for s in args.sizes.split(","))
    repeats = 1 if args.quick else args.repeats
    info = machine()
    print(f"probe: ridge per layer, {args.folds} folds, 13-alpha inner CV, L+1={args.states}, d={args.width}, float16 "
          f"runs, sizes {sizes}; {cores()} cores, load {info['loadavg_start']}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="actstore-bench-") as tmp, embedded(Path(tmp) / "store") as client:
        shard_rows = client._server.service.settings.shard_rows
        for i, n in enumerate(sizes):
            seed = 100 + i
            ids = [f"s{j:07d}" for j in range(n)]
            codes = synthetic_latents(n, shard_rows, seed=seed)[:, :3].argmax(axis=1)
            dataset = client.register_dataset(texts=["."] * n, sample_ids=ids, name=f"probe-{n}")
            client.register_labels(dataset.digest, sample_ids=ids, labels=codes.tolist(), name="latent-class")
            run = write_synthetic_runs(client, n, states=args.states, width=args.width, seed=seed,
                                       dataset_digest=dataset.digest)[0]
            layers = [client.read_activations(run, layer)[0] for layer in range(args.states)]
            fold = assign_folds(ids, args.folds, codes)
            client.probe(run, labels="latent-class", folds=args.folds, refresh=True)  # warm-up: workers, imports
            store_s, script_s, memories = [], [], []
            for _ in range(repeats):  # the sides in turn, each round: load changes hit both
                release_free_heap()
                sampler = RssSampler(0.05).start()
                started = time.perf_counter()
                answer = client.probe(run, labels="latent-class", folds=args.folds, refresh=True)
                store_s.append(time.perf_counter() - started)
                memories.append(sampler.stop())
                started = time.perf_counter()
                reference = script_probe(layers, codes, fold, args.folds)
                script_s.append(time.perf_counter() - started)
            equal = bool(np.array_equal(answer.arrays["accuracy"], reference))
            memory = max(memories, key=lambda m: m["sum_of_increases_mib"])
            ratio = median(store_s) / median(script_s)
            rows.append({"n": n, "store_s": median(store_s), "script_s": median(script_s), "ratio": ratio,
                         "accuracies_equal": equal, "memory": memory, "best_layer": answer.best_layer,
                         "score": answer.score.tolist()})
            print(f"  n={n}: store {median(store_s):.2f} s (reads included) vs script {median(script_s):.2f} s (reads "
                  f"excluded): store/script {ratio:.2f}; per-fold accuracies equal: {equal}; peak memory increase "
                  f"{memory['sum_of_increases_mib']:.0f} MiB; accuracy per layer "
                  f"{', '.join(f'{v:.3f}' for v in answer.score)}", flush=True)
            del layers
    worst = max(row["ratio"] for row in rows)
    peaks = [row["memory"]["sum_of_increases_mib"] for row in rows]
    flatness = peaks[-1] / max(peaks[0], 1.0)
    increases = ", ".join(f"n={row['n']} {peak:.0f} MiB" for row, peak in zip(rows, peaks))
    print(f"store/script worst {worst:.2f} (target <= {TARGET}: {verdict(worst, TARGET, higher_is_better=False)}); "
          f"peak memory increase {increases}: "
          f"{flatness:.2f}x from the smallest n to the largest (target <= {FLATNESS_TARGET}: "
          f"{verdict(flatness, FLATNESS_TARGET, higher_is_better=False)}); accuracies equal: "
          f"{all(row['accuracies_equal'] for row in rows)}")
    path = write_result("probe", {"machine": info, "rows": rows, "target": TARGET, "flatness": flatness,
                                  "flatness_target": FLATNESS_TARGET})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
