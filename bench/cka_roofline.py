"""CKA roofline: the full (L+1) x (L+1) CKA matrix of a stored run at n = 25k, 50k, 100k against
this machine's roofline (reading the stored bytes once + the accumulation GEMM), and peak memory.

Data: synthetic runs (`benchlib.write_synthetic_runs`), because capturing 100k real samples takes
about an hour on 2 cores. They are written straight into the embedded server's store through its
in-process service: a RunLayout and a RunRecord (placeholder model and dataset records), every
shard through `service.arrays.write_shard` (float16 values, float64 layer sums) with its chunk
metadata through `service.catalog.chunks.insert`, then `catalog.runs.commit`, as a capture job does.
The data is residual-stream-like: layer l+1 = layer l + noise, a few large-mean outlier
dimensions. Only the writing bypasses the API: the timed query goes through the public client
(gRPC), `client.cka(run, refresh=True)`: Ray map tasks over the stored chunks (float64 streaming
accumulator), merge, finalize, result stored in the catalog.

Per n, in the same run, right after the query:
  * wall: seconds of `client.cka(run, refresh=True)` (the same query on the smallest run, untimed,
    warms up first: Ray workers started, first-use allocations made; --repeats > 1 reports the
    median).
  * peak memory: RSS of this process (it hosts the embedded server) and of every Ray worker
    process, sampled every --sample-ms ms with psutil during the query; reported per process and
    summed, as the increase over the RSS just before the query (glibc's free heap is trimmed
    first) and as absolute peaks. Shared object-store pages count in each process that maps them.
  * roofline (a), read: every file of the run's activation array (`runs/<key>/acts/`) read once
    with plain unbuffered 8 MiB reads (the page cache is warm, as it is for the query: the run was
    just written), MB/s reported.
  * roofline (b), GEMM: the accumulation product alone on random float64 (shard_rows, (L+1) d)
    blocks, one per shard of the run, dealt to as many processes as the query runs map tasks
    (`Executor.parts`, the cluster's CPUs: 2 here), each process single-threaded BLAS like
    a Ray task with num_cpus=1, started together (multiprocessing, spawn, a barrier); the wall is
    the slowest process. Two kernels: numpy `u.T @ u` (a syrk plus a D x D result allocation and
    triangle copy each call) and BLAS dsyrk accumulating in place into one D x D matrix (the bare
    FLOPs). The roofline uses the faster, i.e. the tighter bound; the ratio against the `u.T @ u`
    roofline is printed too.
  * ratio = wall / (read + GEMM). Targets: <= 3x; peak memory (sum over the processes of their
    increase) < 2 GiB and flat in n: the largest n's at most 1.5x the smallest n's (memory that
    grew with n would give 4x from 25k to 100k).
  * --int8 (issue 39): the same values as an int8 run too (`write_synthetic_runs(dtype="int8")`,
    coded as a capture codes them), and the same query on it, alternated with the float16 run's
    (--repeats each): int8 wall / float16 wall, target <= 1.0 (no slower; its error bound rides
    along, from the stored figures).

    python bench/cka_roofline.py [--quick] [--sizes 25000,50000,100000] [--repeats 1]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
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
    read_files,
    release_free_heap,
    run_files,
    verdict,
    write_result,
    write_synthetic_runs,
)

RATIO_TARGET = 3.0
MEMORY_TARGET_MIB = 2048.0
FLATNESS_TARGET = 1.5  # the largest n's peak increase at most this many times the smallest n's


def _gemm_worker(rows_list: list[int], width: int, barrier, queue, index: int) -> None:
    """One process of the GEMM roofline: single-threaded BLAS, fresh random blocks (not reused in
    cache), `u.T @ u` per block, then dsyrk accumulating in place."""
    from scipy.linalg import blas
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        rng = np.random.default_rng(index)
        pool = [rng.standard_normal((max(rows_list), width)) for _ in range(4)]
        for u in pool[:1]:
            u.T @ u  # warm BLAS up
        barrier.wait()
        started = time.perf_counter()
        for k, rows in enumerate(rows_list):
            u = pool[k % len(pool)][:rows]
            u.T @ u
        numpy_seconds = time.perf_counter() - started
        barrier.wait()
        accumulator = np.zeros((width, width), order="F")
        started = time.perf_counter()
        for k, rows in enumerate(rows_list):
            u = pool[k % len(pool)][:rows]
            accumulator = blas.dsyrk(1.0, u.T, beta=1.0, c=accumulator, trans=0, lower=0, overwrite_c=1)
        syrk_seconds = time.perf_counter() - started
    queue.put((index, numpy_seconds, syrk_seconds))


def gemm_roofline(n: int, shard_rows: int, width: int, processes: int) -> dict:
    """The accumulation GEMM for n rows in shard-sized blocks, over `processes` processes."""
    shards = [min(shard_rows, n - s) for s in range(0, n, shard_rows)]
    size, extra = divmod(len(shards), processes)
    parts, at = [], 0
    for p in range(processes):  # contiguous near-equal groups, as split_ranges deals them
        take = size + (1 if p < extra else 0)
        parts.append(shards[at:at + take])
        at += take
    context = mp.get_context("spawn")
    barrier, queue = context.Barrier(processes), context.Queue()
    workers = [context.Process(target=_gemm_worker, args=(part, width, barrier, queue, i))
               for i, part in enumerate(parts) if part]
    for worker in workers:
        worker.start()
    results = [queue.get() for _ in workers]
    for worker in workers:
        worker.join()
    numpy_seconds = max(r[1] for r in results)
    syrk_seconds = max(r[2] for r in results)
    flops = 2.0 * n * width * width  # nominal GEMM flops; a syrk does half of them
    return {"processes": len(workers), "blocks": len(shards), "numpy_seconds": numpy_seconds,
            "syrk_seconds": syrk_seconds, "per_process_numpy_seconds": [r[1] for r in sorted(results)],
            "per_process_syrk_seconds": [r[2] for r in sorted(results)],
            "numpy_gflops_nominal": flops / numpy_seconds / 1e9, "syrk_gflops_nominal": flops / syrk_seconds / 1e9}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="25000,50000,100000", help="samples per run, comma separated")
    parser.add_argument("--states", type=int, default=7, help="L+1 stored states (default 7)")
    parser.add_argument("--width", type=int, default=384, help="d (default 384)")
    parser.add_argument("--shard-rows", type=int, default=256, help="samples per shard (default: Settings' 256)")
    parser.add_argument("--repeats", type=int, default=1, help="timed queries per n (default 1; median)")
    parser.add_argument("--sample-ms", type=float, default=50.0, help="RSS sampling period (default 50 ms)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny run: sizes 2048,4096")
    parser.add_argument("--int8", action="store_true", help="also time the same query on an int8 copy of each run")
    args = parser.parse_args()
    if args.quick:
        args.sizes = "2048,4096"
    sizes = sorted(int(s) for s in args.sizes.split(","))
    width = args.states * args.width

    info = machine()
    print(f"CKA roofline: sizes {sizes}, L+1={args.states}, d={args.width}, float16, shard_rows={args.shard_rows}; "
          f"{cores()} cores, load {info['loadavg_start']}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="actstore-bench-") as tmp, \
            embedded(Path(tmp) / "store", shard_rows=args.shard_rows) as client:
        runs = {n: write_synthetic_runs(client, n, states=args.states, width=args.width, seed=args.seed + i)[0]
                for i, n in enumerate(sizes)}
        coded = {n: write_synthetic_runs(client, n, states=args.states, width=args.width, seed=args.seed + i,
                                         dtype="int8")[0] for i, n in enumerate(sizes)} if args.int8 else {}
        parts = client._server.service.queries.parts.executor.parts
        started = time.perf_counter()
        client.cka(runs[sizes[0]], refresh=True)
        print(f"  warm-up: the full query on the smallest run, untimed "
              f"({time.perf_counter() - started:.1f} s; it starts "
              f"the Ray workers and their first-use allocations); the query runs {parts} map tasks", flush=True)
        for n in sizes:
            run = runs[n]
            walls, server_seconds, memories, int8_walls = [], [], [], []
            for _ in range(args.repeats):
                if n in coded:  # alternated with the float16 query, so both see the same machine
                    started = time.perf_counter()
                    coded_result = client.cka(coded[n], refresh=True)
                    int8_walls.append(time.perf_counter() - started)
                release_free_heap()
                sampler = RssSampler(args.sample_ms / 1000).start()
                started = time.perf_counter()
                result = client.cka(run, refresh=True)
                walls.append(time.perf_counter() - started)
                memories.append(sampler.stop())
                server_seconds.append(result.provenance.seconds)
                assert not result.provenance.cached and result.n == n
            memory = max(memories, key=lambda m: m["increase_of_sum_mib"])
            nbytes, read_seconds = read_files(run_files(client, run))
            gemm = gemm_roofline(n, args.shard_rows, width, parts)
            gemm_seconds = min(gemm["numpy_seconds"], gemm["syrk_seconds"])
            roofline = read_seconds + gemm_seconds
            wall = median(walls)
            row = {
                "n": n, "run": run, "wall_seconds": walls, "wall_median_seconds": wall,
                "server_seconds": server_seconds, "notes": result.notes,
                "stored_bytes": nbytes, "read_seconds": read_seconds, "read_mb_per_s": nbytes / read_seconds / 1e6,
                "gemm": gemm, "gemm_seconds": gemm_seconds,
                "gemm_kernel": "dsyrk in place" if gemm["syrk_seconds"] <= gemm["numpy_seconds"] else "u.T @ u",
                "roofline_seconds": roofline, "ratio": wall / roofline,
                "ratio_vs_numpy_gemm_roofline": wall / (read_seconds + gemm["numpy_seconds"]),
                "memory": memory, "memory_repeats": memories,
                "biased_offdiagonal_range": [float(np.min(result.biased)),
                                             float(np.max(result.biased - np.eye(args.states)))],
            }
            if int8_walls:
                error = float(np.max(np.abs(coded_result.biased - result.biased)))
                row["int8"] = {"run": coded[n], "wall_seconds": int8_walls, "wall_median_seconds": median(int8_walls),
                               "ratio_to_float16": median(int8_walls) / wall,
                               "error_bound": coded_result.provenance.error_bound,
                               "largest_error_vs_float16": error,
                               "stored_bytes": read_files(run_files(client, coded[n]))[0]}
                ratio = row["int8"]["ratio_to_float16"]
                bound, megabytes = coded_result.provenance.error_bound, row["int8"]["stored_bytes"] / 1e6
                print(f"  int8: cka wall {median(int8_walls):.2f} s = {ratio:.2f}x float16's [target <= 1.0: "
                      f"{verdict(ratio, 1.0, higher_is_better=False)}]; bound {bound:.3g}, largest "
                      f"|CKA int8 - CKA float16| {error:.2g}; {megabytes:.0f} MB of codes", flush=True)
            rows.append(row)
            procs = ", ".join(f"{p['role'].split()[0]} {p['pid']} +{p['increase_mib']:.0f} (peak {p['peak_mib']:.0f})"
                              + (" new" if p["new"] else "") for p in memory["per_process"])
            print(f"n={n}: cka wall {wall:.2f} s (server {median(server_seconds):.2f} s; {'; '.join(result.notes)})\n"
                  f"  roofline: read {nbytes / 1e6:.0f} MB in {read_seconds:.3f} s "
                  f"({row['read_mb_per_s']:.0f} MB/s) + GEMM "
                  f"{gemm_seconds:.2f} s [{row['gemm_kernel']}; {gemm['processes']} processes x 1 thread, "
                  f"{gemm['blocks']} blocks of ({args.shard_rows}, {width}); u.T @ u {gemm['numpy_seconds']:.2f} s "
                  f"= {gemm['numpy_gflops_nominal']:.1f} GFLOP/s, dsyrk {gemm['syrk_seconds']:.2f} s "
                  f"= {gemm['syrk_gflops_nominal']:.1f} GFLOP/s nominal 2nD^2] = {roofline:.2f} s\n"
                  f"  wall / roofline = {row['ratio']:.2f}x [target <= {RATIO_TARGET:g}x: "
                  f"{verdict(row['ratio'], RATIO_TARGET, higher_is_better=False)}] "
                  f"(vs the u.T @ u roofline: {row['ratio_vs_numpy_gemm_roofline']:.2f}x)\n"
                  f"  peak memory increase: summed {memory['increase_of_sum_mib']:.0f} MiB (sum of per-process "
                  f"increases {memory['sum_of_increases_mib']:.0f} MiB; "
                  f"peak of summed RSS {memory['peak_sum_mib']:.0f} MiB) "
                  f"[target < {MEMORY_TARGET_MIB:.0f} MiB: "
                  f"{verdict(memory['sum_of_increases_mib'], MEMORY_TARGET_MIB, higher_is_better=False)}]; "
                  f"MiB per process: {procs}", flush=True)
    peaks = [r["memory"]["sum_of_increases_mib"] for r in rows]
    flatness = peaks[-1] / max(peaks[0], 1.0)
    worst_ratio = max(r["ratio"] for r in rows)
    print("summary: wall / roofline " + ", ".join(f"n={r['n']} {r['ratio']:.2f}x" for r in rows)
          + f" [target <= {RATIO_TARGET:g}x: {verdict(worst_ratio, RATIO_TARGET, higher_is_better=False)}]")
    print("         peak memory increase (sum of per-process) "
          + ", ".join(f"n={r['n']} {p:.0f} MiB" for r, p in zip(rows, peaks))
          + f"; n={sizes[-1]} / n={sizes[0]} = {flatness:.2f} [< {MEMORY_TARGET_MIB:.0f} MiB: "
          f"{verdict(max(peaks), MEMORY_TARGET_MIB, higher_is_better=False)}; flat (<= {FLATNESS_TARGET:g}x): "
          f"{verdict(flatness, FLATNESS_TARGET, higher_is_better=False)}]")
    path = write_result("cka_roofline", {
        "quick": args.quick, "params": vars(args), "machine": info, "sizes": sizes,
        "baseline": "roofline measured in the same run: plain reads of the run's stored bytes + the accumulation "
                    "GEMM alone on random float64 shard blocks over the query's process count",
        "results": rows, "worst_ratio": worst_ratio, "peak_increase_mib": peaks, "memory_flatness": flatness,
        "targets": {"ratio": RATIO_TARGET, "peak_mib": MEMORY_TARGET_MIB, "flatness": FLATNESS_TARGET},
        "pass": {"ratio": worst_ratio <= RATIO_TARGET, "peak_memory": max(peaks) < MEMORY_TARGET_MIB,
                 "flat": flatness <= FLATNESS_TARGET},
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
