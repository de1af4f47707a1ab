"""Metric device path: the streaming CKA accumulator's products on a torch device vs numpy/BLAS.

Measured: `SimilarityAccumulator` in feature space fed B = 7 float16 blocks of d = 384 (D = 2688)
over n rows in shard-sized chunks (256 rows, as the store hands them out), then `finalize`, with
`device` = "cuda" where torch sees a GPU, else "cpu" (torch's CPU device: the same code path,
which is what runs in metric tasks with ACTSTORE_METRIC_DEVICE=torch-cpu).

Baseline (same process, same chunks, alternated): the same accumulator with `device=None`,
numpy + the host BLAS (in-place dsyrk), which is what metric tasks run without a GPU.

Reported: seconds of each, the ratio baseline / device (> 1 means the device path is faster), and
the max |difference| between the two CKA matrices (both float64; target <= 1e-10). On a machine
without a GPU the ratio says what the torch path costs against BLAS on the host; it is not a GPU
number.

    python bench/metric_device.py [--quick] [--n 25000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import benchlib  # noqa: F401  (sets the Ray environment first)
import numpy as np
import torch
from benchlib import machine, median, verdict, write_result

from actstore.metrics.similarity import SimilarityAccumulator

BLOCKS, WIDTH, CHUNK = 7, 384, 256
DIFF_TARGET = 1e-10


def chunks(n: int, seed: int = 0) -> list[list[np.ndarray]]:
    """Correlated float16 blocks (a shared low-rank part plus noise), cut into shard-sized chunks."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((n, 32)).astype(np.float32)
    blocks = [(base @ rng.standard_normal((32, WIDTH)).astype(np.float32)
               + rng.standard_normal((n, WIDTH)).astype(np.float32)).astype(np.float16) for _ in range(BLOCKS)]
    return [[block[start:start + CHUNK] for block in blocks] for start in range(0, n, CHUNK)]


def run(data: list[list[np.ndarray]], device: str | None):
    started = time.perf_counter()
    accumulator = SimilarityAccumulator([WIDTH] * BLOCKS, "feature", device=device)
    for chunk in data:
        accumulator.update(chunk)
    result = accumulator.finalize()
    if device is not None and device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - started, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=25_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="n=2048, one repeat (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.n, args.repeats = 2048, 1
    device = "cuda" if torch.cuda.is_available() else "cpu"
    data = chunks(args.n)
    host_seconds, device_seconds = [], []
    for _ in range(args.repeats):  # alternated, so load changes hit both sides
        seconds, on_host = run(data, None)
        host_seconds.append(seconds)
        seconds, on_device = run(data, device)
        device_seconds.append(seconds)
    diff = float(max(np.nanmax(np.abs(on_device.biased - on_host.biased)),
                     np.nanmax(np.abs(on_device.debiased - on_host.debiased))))
    ratio = median(host_seconds) / median(device_seconds)
    print(f"feature-space CKA accumulator, n={args.n}, {BLOCKS} blocks x {WIDTH} (float16), chunks of {CHUNK}")
    print(f"  numpy/BLAS (baseline): {median(host_seconds):.2f} s   torch on {device}: {median(device_seconds):.2f} s")
    print(f"  speed-up of the device path: {ratio:.2f}x"
          + ("" if device.startswith("cuda")
             else "  (no GPU here: this is the torch-cpu path's cost, not a GPU number)"))
    print(f"  max |difference|: {diff:.1e} (target <= {DIFF_TARGET:.0e}): {verdict(diff, DIFF_TARGET, False)}")
    path = write_result("metric_device", {
        "n": args.n, "device": device, "host_seconds": host_seconds, "device_seconds": device_seconds,
        "ratio": ratio, "max_abs_diff": diff, "machine": machine(),
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
