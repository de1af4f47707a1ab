"""Cross-model growth: the CKA matrix job over M = 4, 8, ... synthetic runs (n = 10,000, L+1 = 7,
d = 384, float16), each M timed against its roofline.

  * job: `client.cka_matrix(first M runs, refresh=True)` (submit, follow, fetch); its notes say the
    mode and the number of tiles the memory limit forced.
  * roofline (the baseline, measured in the same run): the FLOPs of the cheapest plan that keeps
    one Gram (or covariance) product per block plus the pairwise products (`cka_mode_costs` of the
    whole job, as if it fitted in one tile), at this machine's float64 GEMM rate over the map
    tasks' processes (`cka_roofline.gemm_roofline`), plus one read of the runs' stored bytes.
  * peak memory increase during the job, against `max_accumulator_bytes`: of the server (this
    process) and every process of its Ray cluster (workers, raylet and its object store, GCS,
    agents; `benchlib.RssSampler`), summed per process and, the number held to the limit, the
    largest simultaneous sum over the baseline before the job. A Ray worker started during the
    job counts whole (interpreter, Ray, imports), one that exits takes its memory out; the script
    names both, and the growth per role. The local cluster's prestarted workers run the job's
    tasks (`workers/cluster.py`), so on a fresh server the first job pays the workers' imports
    (`Settings.metric_worker_bytes`, budgeted by the plan) but no process start.

    python bench/cross_model_growth.py [--runs 4,8] [--n 10000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import benchlib  # noqa: F401  (sets the Ray environment first)
from benchlib import (
    RssSampler,
    cores,
    embedded,
    machine,
    read_files,
    run_files,
    verdict,
    write_result,
    write_synthetic_runs,
)
from cka_roofline import gemm_roofline

from actstore.metrics.similarity import cka_mode_costs

TARGET = 2.0


def by_role(per_process: list[dict]) -> dict[str, float]:
    """Each role's processes' peak increases summed, largest first (roles with under 1 MiB left out)."""
    roles: dict[str, float] = {}
    for process in per_process:
        roles[process["role"]] = roles.get(process["role"], 0.0) + process["increase_mib"]
    return {role: mib for role, mib in sorted(roles.items(), key=lambda item: -item[1]) if mib >= 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", default="4,8", help="the M values (default 4,8)")
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--states", type=int, default=7)
    parser.add_argument("--width", type=int, default=384)
    args = parser.parse_args()
    counts = [int(m) for m in args.runs.split(",")]
    info = machine()
    print(f"cross-model growth: M in {counts}, n={args.n}, L+1={args.states}, d={args.width}, float16; "
          f"{cores()} cores, load {info['loadavg_start']}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="actstore-bench-") as tmp, embedded(Path(tmp) / "store") as client:
        runs = write_synthetic_runs(client, args.n, runs=max(counts), states=args.states, width=args.width)
        executor = client._server.service.queries.parts.executor
        limit = client._server.service.settings.max_accumulator_bytes
        width = args.states * args.width  # one run's blocks side by side, as a tile holds them
        gemm = gemm_roofline(args.n, 256, width, executor.parts)
        rate = args.n * width**2 / 2 / gemm["syrk_seconds"]  # a syrk's multiply-adds per second
        for m in counts:
            chosen = runs[:m]
            costs = cka_mode_costs([args.width] * (m * args.states), args.n)
            best = min(costs.values())
            nbytes, read_seconds = read_files([p for run in chosen for p in run_files(client, run)])
            roofline = best / rate + read_seconds
            sampler = RssSampler().start()
            started = time.perf_counter()
            result = client.cka_matrix(chosen, refresh=True)
            wall = time.perf_counter() - started
            memory = sampler.stop()
            row = {"m": m, "wall_s": wall, "roofline_s": roofline, "ratio": wall / roofline,
                   "job_macs": costs, "read_bytes": nbytes, "notes": result.notes,
                   "peak_increase_mib": memory["sum_of_increases_mib"], "limit_mib": limit / 2**20,
                   "increase_of_sum_mib": memory["increase_of_sum_mib"],
                   "new_worker_mib": [p["peak_mib"] for p in memory["per_process"] if p["new"]],
                   "exited_mib": [p["baseline_mib"] for p in memory["per_process"] if p["exited"]],
                   "increase_by_role_mib": by_role(memory["per_process"])}
            rows.append(row)
            print(f"  M={m}: wall {wall:.1f} s, roofline {roofline:.1f} s (best plan {best:.2e} multiply-adds at "
                  f"{rate / 1e9:.1f} G/s + read {nbytes / 1e6:.0f} MB in {read_seconds:.2f} s): "
                  f"{wall / roofline:.2f}x [<= {TARGET:g}x: {verdict(wall / roofline, TARGET, False)}]; "
                  f"{'; '.join(result.notes)}; peak memory +{memory['sum_of_increases_mib']:.0f} MiB summed "
                  f"per process, +{memory['increase_of_sum_mib']:.0f} MiB at once [<= limit {limit / 2**20:.0f} MiB: "
                  f"{verdict(memory['increase_of_sum_mib'], limit / 2**20, False)}]; "
                  f"{len(row['new_worker_mib'])} Ray worker(s) started during the job, peaking at "
                  f"{sum(row['new_worker_mib']):.0f} MiB whole, {len(row['exited_mib'])} process(es) exited; "
                  f"by role: {', '.join(f'{r} +{v:.0f}' for r, v in row['increase_by_role_mib'].items())} MiB",
                  flush=True)
    path = write_result("cross_model_growth", {"machine": info, "gemm": gemm, "rows": rows, "target": TARGET})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
