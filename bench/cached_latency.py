"""Cached query latency through gRPC on loopback: p50 / p99 at 1 and 16 concurrent clients.

Baseline: the same CKA query recomputed (refresh=True), measured in the same run. A cached answer
is one catalog lookup plus one gRPC round trip; the ratio says what the result cache saves.

    python bench/cached_latency.py [--n 1024] [--requests 200] [--quick]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time

import benchlib  # noqa: F401  (sets the Ray / HF environment first)
import numpy as np

from actstore.client import Client


def percentile(values, q):
    return float(np.percentile(np.asarray(values) * 1000.0, q))


def timed_queries(address: str, run: str, count: int) -> list[float]:
    latencies = []
    with Client(address) as client:
        for _ in range(count):
            started = time.perf_counter()
            result = client.cka(run)
            latencies.append(time.perf_counter() - started)
            assert result.provenance.cached
    return latencies


def concurrent(address: str, run: str, clients: int, per_client: int) -> tuple[list[float], float]:
    results: list[list[float]] = [[] for _ in range(clients)]
    threads = [threading.Thread(target=lambda i=i: results[i].extend(timed_queries(address, run, per_client)))
               for i in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    return [x for r in results for x in r], clients * per_client / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1024, help="reviews captured (default 1024)")
    parser.add_argument("--requests", type=int, default=400, help="cached queries per concurrency level")
    parser.add_argument("--recomputes", type=int, default=5, help="uncached baseline queries")
    parser.add_argument("--quick", action="store_true", help="n=64, 64 requests, 2 recomputes")
    args = parser.parse_args()
    if args.quick:
        args.n, args.requests, args.recomputes = 64, 64, 2
    with tempfile.TemporaryDirectory() as tmp, benchlib.embedded(tmp, shard_rows=256) as client:
        client.register_model(builtin="minilm-l6")
        benchlib.register_reviews(client, args.n, name="reviews")
        run = client.capture("minilm-l6", "reviews", pooling="mean").run_key
        client.cka(run)  # stored: every query below but the baseline is a cache hit
        uncached = []
        for _ in range(args.recomputes):
            started = time.perf_counter()
            client.cka(run, refresh=True)
            uncached.append(time.perf_counter() - started)
        single = timed_queries(client.address, run, args.requests)
        many, throughput = concurrent(client.address, run, 16, max(1, args.requests // 16))
    record = {
        "params": vars(args), "machine": benchlib.machine(),
        "baseline": "the same 7x7 CKA query recomputed (refresh=True)",
        "uncached_ms_median": benchlib.median(uncached) * 1000,
        "cached_1_client": {"p50_ms": percentile(single, 50), "p99_ms": percentile(single, 99)},
        "cached_16_clients": {"p50_ms": percentile(many, 50), "p99_ms": percentile(many, 99),
                              "queries_per_s": throughput},
    }
    record["speedup_p50"] = record["uncached_ms_median"] / record["cached_1_client"]["p50_ms"]
    benchlib.write_result("cached_latency", record)
    print(f"uncached (recompute) median {record['uncached_ms_median']:.1f} ms")
    print(f"cached, 1 client:   p50 {record['cached_1_client']['p50_ms']:.2f} ms, "
          f"p99 {record['cached_1_client']['p99_ms']:.2f} ms")
    print(f"cached, 16 clients: p50 {record['cached_16_clients']['p50_ms']:.2f} ms, "
          f"p99 {record['cached_16_clients']['p99_ms']:.2f} ms, {throughput:.0f} queries/s")
    print(f"ratio: cached p50 is {record['speedup_p50']:.0f}x faster than recomputing")


if __name__ == "__main__":
    main()
