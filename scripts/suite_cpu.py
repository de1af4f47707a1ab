"""Where a command's CPU goes, per kind of process: run it (by default `make test`) while sampling
every process's CPU time, then print the CPU-seconds of each kind (Ray's capture replicas and
other actors by name, Ray's daemons, the pytest processes, subprocess servers, kernel threads).

`time make test` undercounts the suite: Ray's workers are children of each raylet, and their CPU
does not reach pytest's rusage. A process's CPU is its last sample (so up to one interval is
missed at its end, and a process that lived less than an interval may be missed altogether);
a Ray worker is counted under the first name it had other than IDLE.

    python scripts/suite_cpu.py                      # make test
    python scripts/suite_cpu.py -- pytest -q tests/server/test_probes.py
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import threading
import time
from collections import Counter

# (pattern over a process's command line, the kind it is counted as; None: the match itself)
KINDS = [
    (r"ray::IDLE", "ray::IDLE"), (r"ray::[A-Za-z_]+", None), (r"gcs_server", "ray gcs_server"),
    (r"raylet", "ray raylet"), (r"dashboard/agent", "ray dashboard agent"),
    (r"runtime_env/agent", "ray runtime_env agent"),
    (r"log_monitor", "ray log_monitor"), (r"dashboard", "ray dashboard"), (r"default_worker", "ray worker (starting)"),
    (r"moto", "moto (S3 server)"), (r"ipykernel", "notebook kernel"), (r"\bpip\b", "pip"),
    (r"execnet|xdist", "pytest worker"), (r"pytest", "pytest"), (r"actstore", "actstore CLI / server"),
    (r"^\[", None), (r"python", "other python"),
]


def kind(args: str) -> str:
    for pattern, name in KINDS:
        if match := re.search(pattern, args):
            return name or match.group(0)
    words = args.split()
    return words[0][:40] if words else "?"


def sample(seen: dict[str, list], stop: threading.Event, interval: float) -> None:
    """Every `interval` s: each process's CPU seconds so far (the largest seen) and its names."""
    while not stop.is_set():
        listing = subprocess.run(["ps", "-eo", "pid,cputimes,args", "--no-headers"], capture_output=True, text=True)
        for line in listing.stdout.splitlines():
            pid, cpu, *args = line.split(None, 2)
            if args and args[0].startswith("ps -eo"):  # this sampler's own listing
                continue
            entry = seen.setdefault(pid, [0, Counter()])
            entry[0] = max(entry[0], int(cpu))
            entry[1][kind(args[0] if args else "")] += 1
        stop.wait(interval)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--interval", type=float, default=3.0, help="seconds between samples (default 3)")
    parser.add_argument("--top", type=int, default=25, help="kinds to print (default 25)")
    parser.add_argument("command", nargs="*", help="the command to run (default: make test)")
    args = parser.parse_args()
    command = args.command or ["make", "test"]
    seen: dict[str, list] = {}
    stop = threading.Event()
    before = set(subprocess.run(["ps", "-eo", "pid", "--no-headers"], capture_output=True, text=True).stdout.split())
    sampler = threading.Thread(target=sample, args=(seen, stop, args.interval), daemon=True)
    started = time.monotonic()
    sampler.start()
    code = subprocess.call(command)
    wall = time.monotonic() - started
    stop.set()
    sampler.join()
    totals, counts = Counter(), Counter()
    for pid, (cpu, names) in seen.items():
        if pid in before:  # running before the command: not its CPU
            continue
        named = [name for name, _ in names.most_common() if name not in ("ray::IDLE", "ray worker (starting)")]
        name = named[0] if named else names.most_common(1)[0][0]
        totals[name] += cpu
        counts[name] += 1
    print(f"\n{' '.join(command)}: exit {code}, {wall:.0f} s wall, {sum(totals.values())} CPU-s in "
          f"{sum(counts.values())} processes started during it")
    for name, cpu in totals.most_common(args.top):
        print(f"{cpu:7d} CPU-s {counts[name]:5d} processes  {name}")
    return code


if __name__ == "__main__":
    sys.exit(main())
