"""Object store: actstore's write and read paths against plain PUT/GET on the same S3 server.

A real S3-protocol server process on loopback (moto's server mode; on a cluster this is MinIO or
S3) holds one bucket. Both sides use the same client library (obstore) and the same concurrency,
so the ratio measures actstore's own overhead (coding each shard: Blosc, crc32c, the shard index
and the layer sums it carries; opening the run), not the server's speed.

  * write: `ZarrArrayStore.write_shard` of synthetic float16 shards (rows=256, L+1=7, d=384, as a
    capture writes them, with their layer sums, chunk rows and statistics computed beforehand, as
    the capture does: `workers.shard_writes.write_prepared`),
    `--concurrency` shards in flight (a capture keeps 2 per replica); baseline: `obstore.put` of
    random objects of exactly the sizes the shard objects have, same concurrency. Rate = stored
    shard bytes / s.
  * read: `read_layers(run, all layers, shard)` per shard from a fresh handle, as a CKA map task
    reads (decoded to numbers); baseline: `obstore.get` of the same shard objects.
  * --int8 (issue 39): the same values also as an int8 run (coded as a capture codes them; its
    pooled shards hold 2 x rows: the bytes of a float16 shard), read the same way (`read_layers`,
    all layers, decoded to float32 numbers), its batches covering the same rows taken in turn with
    the float16 reads: samples/s against float16's, target >= 1.6 (reads bound by bytes).
  * each side runs batches of 2 x concurrency shards in turn with the other (shared machines drift
    within seconds); medians over rounds. Target >= 0.8 of the raw rate each way. The setup's
    objects are frozen out of Python's garbage collector first (`gc.freeze`): a full collection of
    them (Ray's, torch's and zarr's modules, ~80 ms) fell into the third round's write batches in
    every run (the raw side makes almost no Python objects, so never sets one off) and cut that
    round's write rate by a quarter; a long capture meets one about once in thousands of shards.
    Also printed: CPU ms per shard of this process (every thread) and of the S3 server, per side:
    unlike the rates, these hardly move with the machine's load.

    python bench/object_store.py [--quick] [--shards 32] [--concurrency 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gc
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor

import benchlib  # noqa: F401  (sets the Ray environment first)
import numpy as np
from benchlib import cores, machine, median, verdict, write_result

TARGET = 0.8
INT8_TARGET = 1.6  # an int8 run's samples/s read against float16's (issue 39)


def start_s3_server() -> tuple[subprocess.Popen, str]:
    """moto's S3 server on a free loopback port, and this process's AWS variables pointing at it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(endpoint + "/moto-api/", timeout=1)
            os.environ.update({"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "bench",
                               "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1"})
            return process, endpoint
        except OSError:
            if time.monotonic() > deadline:
                process.kill()
                raise SystemExit("moto's S3 server did not start") from None
            time.sleep(0.2)


def new_bucket(prefix: str) -> str:
    """A fresh bucket on the S3 server the AWS variables name; the store's URL in it."""
    import boto3

    bucket = f"{prefix}-{uuid.uuid4().hex[:10]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    return f"s3://{bucket}/store"


class Meter:
    """Wall seconds and CPU seconds (this process: every thread; and the S3 server's process) per side."""

    def __init__(self, server_pid: int) -> None:
        import psutil

        self.me, self.server = psutil.Process(), psutil.Process(server_pid)
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.server_cpu: dict[str, float] = {}

    def _cpu(self, process) -> float:
        times = process.cpu_times()
        return times.user + times.system

    def run(self, side: str, pool: ThreadPoolExecutor, work, items) -> None:
        mine, theirs, started = self._cpu(self.me), self._cpu(self.server), time.perf_counter()
        list(pool.map(work, items))
        for record, value in ((self.wall, time.perf_counter() - started), (self.cpu, self._cpu(self.me) - mine),
                              (self.server_cpu, self._cpu(self.server) - theirs)):
            record[side] = record.get(side, 0.0) + value


def capture_details(run: str, shard: int, values: np.ndarray) -> tuple[dict, dict]:
    """The chunk rows and layer statistics a capture writes with a shard."""
    from actstore.metrics.layer_stats import LayerStats
    from actstore.workers.shard_writes import chunk_metadata

    return chunk_metadata(run, shard, values), LayerStats.empty(values.shape[1]).update(values).to_dict()


def one_round(r: int, shards: list[np.ndarray], layout, concurrency: int, rng, meter: Meter, int8: bool = False
              ) -> tuple[int, int]:
    """One fresh bucket: actstore's writes and raw PUTs of the same sizes, then actstore's reads and
    raw GETs of the same objects, each side in batches of 2 x concurrency shards taken in turn, so
    both see the same machine load (shared machines drift within seconds)."""
    import obstore

    from actstore.store.backends.s3 import s3_store
    from actstore.store.format.arrays import ZarrArrayStore

    url = new_bucket("bench")
    arrays = ZarrArrayStore(url, "lz4")
    run = f"{r:064d}"
    arrays.create_run(run, layout, [f"s{i}" for i in range(layout.n)], None, None)
    store, raw = s3_store(url), s3_store(url.removesuffix("/store") + "/raw")
    # the capture's work, not the store's: what `write_prepared` hands `write_shard` with each shard
    kept = [(shard.astype(np.float64).sum(0), *capture_details(run, s, shard)) for s, shard in enumerate(shards)]
    key = f"runs/{run}/acts/c/{{}}/0/0"
    batches = [range(i, min(i + 2 * concurrency, len(shards))) for i in range(0, len(shards), 2 * concurrency)]
    reader = ZarrArrayStore(url, "lz4")  # a fresh handle, as a map task opens one
    everything = list(range(layout.num_states))
    sizes: dict[int, int] = {}
    payloads: dict[int, bytes] = {}
    coded = write_int8_run(arrays, f"{r:063d}8", shards, layout) if int8 else None
    with ThreadPoolExecutor(concurrency) as pool:
        for batch in batches:
            meter.run("write", pool, lambda s: arrays.write_shard(run, s, shards[s], kept[s][0], None, *kept[s][1:]),
                      batch)
            sizes.update({s: obstore.head(store, key.format(s))["size"] for s in batch})
            payloads.update({s: rng.bytes(sizes[s]) for s in batch})
            meter.run("put", pool, lambda s: obstore.put(raw, f"obj-{s}", payloads[s]), batch)
        for batch in batches:
            meter.run("read", pool, lambda s: reader.read_layers(run, everything, *layout.shard_range(s)), batch)
            meter.run("get", pool, lambda s: bytes(obstore.get(store, key.format(s)).bytes()), batch)
            if coded is not None:  # the same rows, as int8 shards of twice the rows
                rows = (layout.shard_range(batch[0])[0], layout.shard_range(batch[-1])[1])
                meter.run("read8", pool, lambda s: reader.read_layers(coded[0], everything, *coded[1].shard_range(s)),
                          range(rows[0] // coded[1].shard_rows, -(-rows[1] // coded[1].shard_rows)))
    return sum(sizes.values()), len(sizes)


def write_int8_run(arrays, run: str, shards: list[np.ndarray], layout):
    """The values of `shards` as an int8 run (untimed): its key and layout (shards of 2 x rows)."""
    from dataclasses import replace

    import torch

    from actstore.store.format.quantised import rounding_seed
    from actstore.workers.capture import prepare_shards
    from actstore.workers.shard_writes import write_prepared

    coded = replace(layout, dtype="int8", shard_rows=2 * layout.shard_rows)
    arrays.create_run(run, coded, [f"s{i}" for i in range(coded.n)], None, None, compress=False)
    values = np.concatenate(shards).astype(np.float32)
    for shard in range(coded.num_shards):
        lo, hi = coded.shard_range(shard)
        write_prepared(arrays, run, shard, prepare_shards(torch.from_numpy(values[lo:hi]), [(0, hi - lo)], "int8",
                                                          seeds=[rounding_seed(run, shard)])[0])
    return run, coded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=32)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--states", type=int, default=7)
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="8 shards, 1 round")
    parser.add_argument("--int8", action="store_true", help="also read the same values stored as int8 (issue 39)")
    args = parser.parse_args()
    if args.quick:
        args.shards, args.repeats = 8, 1

    process, endpoint = start_s3_server()
    from actstore.store.format.arrays import RunLayout

    info = machine()
    print(f"object store: {args.shards} shards of {args.rows} x {args.states} x {args.width} float16, "
          f"{args.concurrency} in flight, S3 server moto on loopback; {cores()} cores, load {info['loadavg_start']}",
          flush=True)
    rng = np.random.default_rng(0)
    shards = [(rng.standard_normal((args.rows, args.states, args.width)) * 3).astype(np.float16)
              for _ in range(args.shards)]
    layout = RunLayout(n=args.rows * args.shards, rows=args.rows * args.shards, num_states=args.states,
                       width=args.width, dtype="float16", pooling="mean", shard_rows=args.rows)
    gc.collect()
    gc.freeze()  # see the docstring: a full collection of the setup's objects is neither side's cost
    sides = ["write", "put", "read", "get"] + (["read8"] if args.int8 else [])
    rounds: dict[str, list[float]] = {side: [] for side in sides}
    cpu_ms: dict[str, list[float]] = {side: [] for side in rounds}
    server_cpu_ms: dict[str, list[float]] = {side: [] for side in rounds}
    try:
        for r in range(args.repeats):
            meter = Meter(process.pid)
            stored, objects = one_round(r, shards, layout, args.concurrency, rng, meter, args.int8)
            for side in rounds:  # MB/s of the float16 run's stored bytes (read8: the same rows' float16 bytes)
                rounds[side].append(stored / meter.wall[side] / 1e6)
                cpu_ms[side].append(meter.cpu[side] / objects * 1e3)
                server_cpu_ms[side].append(meter.server_cpu[side] / objects * 1e3)
            print(f"  round {r + 1}: {stored / 1e6:.1f} MB stored ({objects} objects); MB/s write "
                  f"{rounds['write'][-1]:.1f} vs put {rounds['put'][-1]:.1f}, read {rounds['read'][-1]:.1f} vs "
                  f"get {rounds['get'][-1]:.1f}; CPU ms per shard, client (server): "
                  + ", ".join(f"{side} {cpu_ms[side][-1]:.2f} ({server_cpu_ms[side][-1]:.2f})" for side in rounds),
                  flush=True)
    finally:
        process.terminate()
        process.wait(timeout=10)
    write_ratio = median(rounds["write"]) / median(rounds["put"])
    read_ratio = median(rounds["read"]) / median(rounds["get"])
    print(f"write path / raw PUT: {write_ratio:.2f} (target >= {TARGET}: {verdict(write_ratio, TARGET)})")
    print(f"read path / raw GET:  {read_ratio:.2f} (target >= {TARGET}: {verdict(read_ratio, TARGET)})")
    int8_ratio = median(rounds["read8"]) / median(rounds["read"]) if args.int8 else None
    if int8_ratio is not None:
        samples = args.rows * args.shards
        print(f"int8 reads: {samples * median(rounds['read8']) / (stored / 1e6):.0f} samples/s vs float16's "
              f"{samples * median(rounds['read']) / (stored / 1e6):.0f}: {int8_ratio:.2f}x "
              f"(target >= {INT8_TARGET}: {verdict(int8_ratio, INT8_TARGET)})")
    print("client CPU per shard (ms): " + ", ".join(f"{side} {median(cpu_ms[side]):.2f}" for side in rounds)
          + f"; load at end {machine()['loadavg_start']}")
    path = write_result("object_store", {"machine": info, "rounds_mb_per_s": rounds, "write_ratio": write_ratio,
                                         "read_ratio": read_ratio, "target": TARGET, "args": vars(args),
                                         "int8_read_ratio": int8_ratio,
                                         "client_cpu_ms_per_shard": cpu_ms, "server_cpu_ms_per_shard": server_cpu_ms})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
