"""Batches: `client.batches` throughput with shuffling on, against a sequential read of the same run.

One embedded server; a synthetic committed float16 run of n samples x 7 layers x 384 written into
its store (`benchlib.write_synthetic_runs`). One epoch of every layer, streamed over gRPC, is timed
three ways, alternated for --repeats rounds (medians compared):

* shuffled: `client.batches(run, batch_size=B, shuffle=True, seed=round)`: the shard order shuffled,
  rows drawn at random from a server buffer of --buffer-shards shards;
* sequential (baseline): `client.batches(run, batch_size=B, shuffle=False)`, the same stream with
  shards and rows in store order;
* read_activations (informational): `client.read_activations(run, layer)` for every layer, the
  one-layer-at-a-time read the client had before.

Printed: samples/s and MB/s (activation bytes delivered, float16) of each, and shuffled /
sequential (target >= 0.7).

--s3: the store on moto's S3 server on loopback (the server's catalog in a temporary folder), as a
team's bucket. --int8 (issue 39): the same values as an int8 run too (`write_synthetic_runs(dtype=
"int8")`), its shuffled epoch alternated with the float16 run's: the codes travel as they are, one
byte a value with each shard's steps and offsets once, and the client decodes them to float32;
int8 samples/s / float16's, target >= 1.6 (reads bound by bytes).

    python bench/batches.py [--quick] [--n 16384] [--batch 256] [--buffer-shards 8]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import benchlib  # noqa: F401  (sets the Ray environment first)
from benchlib import cores, embedded, machine, median, verdict, write_result, write_synthetic_runs
from object_store import new_bucket, start_s3_server

TARGET = 0.7
INT8_TARGET = 1.6  # an int8 run's samples/s against the same run's as float16 (issue 39)


def epoch(client, run: str, **options) -> tuple[float, int, int]:
    """(seconds, samples, value bytes) of one whole epoch of batches."""
    started = time.perf_counter()
    samples = nbytes = 0
    for batch in client.batches(run, **options):
        samples += len(batch)
        nbytes += batch.values.nbytes
    return time.perf_counter() - started, samples, nbytes


def layer_reads(client, run: str, states: int) -> tuple[float, int, int]:
    started = time.perf_counter()
    parts = [client.read_activations(run, layer)[0] for layer in range(states)]
    return time.perf_counter() - started, len(parts[0]), sum(p.nbytes for p in parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=16384, help="samples in the run (default 16384)")
    parser.add_argument("--states", type=int, default=7, help="stored layers L+1 (default 7)")
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--batch", type=int, default=256, help="batch size (default 256)")
    parser.add_argument("--buffer-shards", type=int, default=8, help="shuffle buffer in shards (default 8)")
    parser.add_argument("--shard-rows", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3, help="alternated rounds (default 3)")
    parser.add_argument("--quick", action="store_true", help="tiny run: n=2048, 2 rounds")
    parser.add_argument("--s3", action="store_true", help="the store on an S3 server (moto on loopback)")
    parser.add_argument("--int8", action="store_true", help="also the same values stored as int8 (issue 39)")
    args = parser.parse_args()
    if args.quick:
        args.n, args.repeats = 2048, 2

    info = machine()
    print(f"batches: n={args.n} x {args.states} layers x {args.width} float16, batch {args.batch}, buffer "
          f"{args.buffer_shards} shards of {args.shard_rows}; {cores()} cores, load {info['loadavg_start']}")
    times: dict[str, list[tuple[float, int, int]]] = {"shuffled": [], "sequential": [], "read_activations": []}
    if args.int8:
        times["int8 shuffled"] = []
    server = start_s3_server()[0] if args.s3 else None
    try:
        with tempfile.TemporaryDirectory(prefix="actstore-bench-") as tmp, \
                embedded(new_bucket("batches") if args.s3 else Path(tmp) / "store", server_dir=tmp,
                         shard_rows=args.shard_rows) as client:
            (run,) = write_synthetic_runs(client, args.n, states=args.states, width=args.width)
            coded = write_synthetic_runs(client, args.n, states=args.states, width=args.width,
                                         dtype="int8")[0] if args.int8 else None
            epoch(client, run, batch_size=args.batch, shuffle=False)  # warm: page cache, first-use allocations
            for round_ in range(args.repeats):
                times["shuffled"].append(epoch(client, run, batch_size=args.batch, shuffle=True, seed=round_,
                                               buffer_shards=args.buffer_shards))
                if coded is not None:  # the same rows and buffer in rows (its shards hold 2x the rows)
                    times["int8 shuffled"].append(epoch(client, coded, batch_size=args.batch, shuffle=True,
                                                        seed=round_, buffer_shards=max(1, args.buffer_shards // 2)))
                times["sequential"].append(epoch(client, run, batch_size=args.batch, shuffle=False))
                times["read_activations"].append(layer_reads(client, run, args.states))
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)

    results = {}
    for name, rounds in times.items():
        seconds = median([s for s, _, _ in rounds])
        _, samples, nbytes = rounds[0]
        results[name] = {"seconds": [s for s, _, _ in rounds], "median_seconds": seconds, "samples": samples,
                         "bytes": nbytes, "samples_per_s": samples / seconds, "mb_per_s": nbytes / seconds / 1e6}
        print(f"{name:<17} {seconds:8.3f} s  {samples / seconds:12,.0f} samples/s  {nbytes / seconds / 1e6:9.1f} MB/s")
    ratio = results["shuffled"]["samples_per_s"] / results["sequential"]["samples_per_s"]
    print(f"ratio shuffled / sequential: {ratio:.2f} (target >= {TARGET}: {verdict(ratio, TARGET)})")
    int8_ratio = None
    if args.int8:
        int8_ratio = results["int8 shuffled"]["samples_per_s"] / results["shuffled"]["samples_per_s"]
        print(f"ratio int8 / float16 (shuffled epochs, samples/s): {int8_ratio:.2f} (target >= {INT8_TARGET}: "
              f"{verdict(int8_ratio, INT8_TARGET)})")
    path = write_result("batches", {
        "quick": args.quick, "params": vars(args), "machine": info,
        "baseline": "client.batches(shuffle=False) over the same run, alternated rounds", "results": results,
        "ratio": ratio, "target": TARGET, "int8_ratio": int8_ratio, "int8_target": INT8_TARGET,
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
