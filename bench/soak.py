"""Soak: 16 cached-query clients and 4 recomputing ones against one server until N requests, then
a malformed-request mix and a large-query mix against the same server.

Reports errors, the server's RSS growth after warm-up (for each mix: its private RSS, less the shared pages
of Ray's object-store mapping, `_private`), and cached p50/p99. The warm-up runs both
kinds of client for at least a tenth of the cached requests and on, in twentieths, until the
recomputing clients have done `--warm-recomputes` (150; at most 40% of the requests): the
recomputing path's first-use costs (Ray task submission, BLAS and gRPC thread buffers, the malloc
arenas of the handler threads) reach their plateau only after ~120 recomputes (measured: 516 ->
555 MiB over the first 120, then flat within +-3 MiB for the next 120), far more than a tenth of
fast cached requests holds. A leak never plateaus, so it still shows as growth after the warm-up.

Baseline, measured in the same run: a bare gRPC echo servicer (in a process of its own, like the
server) that answers a payload of the cached answer's size; the same 16 client processes drive
it, so the ratio counts only what the server does beyond gRPC itself. Server and echo rounds
alternate (3 each, medians), so load from elsewhere on the machine falls on both alike.

Clients send pre-serialised request bytes and do not parse the answers (both sides alike), and run
in their own processes so that client work does not share the server's interpreter.

The malformed mix: 4 client processes cycle through requests the server must refuse (unknown and
ever-new run names, layers out of range, bad options, unparseable bytes, a 4 MiB dataset that does
not fit its labels, refused SQL ...), `--malformed` in all; the RSS after its first fifth is the
baseline. The large-query mix: `--large` all-layer COS and CKA queries recomputed (refresh) on a
token-level run, one at a time, and the RSS after its first two the baseline; the server's RSS 5 s
after each mix shows what it gave back.

    python bench/soak.py [--requests 100000] [--n 512] [--quick] [--malformed 3000] [--large 12]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import tempfile
import threading
import time
from concurrent import futures

import benchlib
import grpc
import numpy as np
import psutil

SIMILARITY = "/actstore.v1.Query/Similarity"
ECHO = "/bench.Echo/Call"
CACHED_CLIENTS, UNCACHED_CLIENTS = 16, 4
ROUNDS = 3  # alternating server and echo throughput rounds
WARM_UP_CAP = 0.4  # of the requests


def _client(address: str, method: str, payload: bytes, count: int, stop, start, done, out) -> None:
    """One client process: connects, waits at `start` (so process start-up is never timed), then
    `count` calls (or until `stop` is set), counting each in `done`; latencies and errors to `out`."""
    with grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", 1 << 26)]) as channel:
        grpc.channel_ready_future(channel).result(timeout=120)
        call = channel.unary_unary(method)  # bytes in, bytes out
        latencies, errors = [], []
        start.wait()
        for _ in range(count):
            if stop.is_set():
                break
            started = time.perf_counter()
            try:
                call(payload, timeout=120)
            except grpc.RpcError as exc:
                errors.append(f"{exc.code().name}: {exc.details()}"[:200])
            latencies.append(time.perf_counter() - started)
            with done.get_lock():
                done.value += 1
    out.put((latencies, errors))


CTX = mp.get_context("spawn")


def drive(address: str, method: str, payload: bytes, clients: int, per_client: int,
          stop=None, done=None) -> tuple[list[float], list[str], float]:
    """`clients` processes of `per_client` calls each (or until `stop`), timed from the moment all
    are connected; (latencies, errors, wall). `done` (a shared counter) counts calls as they end."""
    out, start = CTX.Queue(), CTX.Barrier(clients + 1)
    stop = stop or CTX.Event()
    done = done if done is not None else CTX.Value("q", 0)
    procs = [CTX.Process(target=_client, args=(address, method, payload, per_client, stop, start, done, out))
             for _ in range(clients)]
    for p in procs:
        p.start()
    start.wait()
    started = time.perf_counter()
    results = [out.get() for _ in procs]
    wall = time.perf_counter() - started
    for p in procs:
        p.join()
    return [x for r in results for x in r[0]], [e for r in results for e in r[1]], wall


def _mixed_client(address: str, calls: list, count: int, offset: int, out) -> None:
    """One client process of the malformed mix: `count` calls cycling through `calls` ((method,
    request bytes) pairs) from `offset`; the status codes it got to `out`."""
    with grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 1 << 26)]) as channel:
        grpc.channel_ready_future(channel).result(timeout=120)
        codes: dict[str, int] = {}
        for i in range(count):
            method, payload = calls[(offset + i) % len(calls)]
            try:
                channel.unary_unary(method)(payload, timeout=120)
                code = "OK"
            except grpc.RpcError as exc:
                code = exc.code().name
            codes[code] = codes.get(code, 0) + 1
    out.put(codes)


def malformed_calls(run: str) -> list[tuple[str, bytes]]:
    """Requests the server refuses, each for its own reason; the run names are new in every request,
    so a cache keyed by what a caller sent would grow with them."""
    from actstore._proto.actstore.v1 import actstore_pb2 as pb
    from actstore._proto.actstore.v1 import readers_pb2 as rpb

    metric = pb.SimilarityRequest
    calls = []
    for i in range(200):
        unknown = f"{i:08x}deadbeef{os.urandom(4).hex()}"
        calls += [
            (SIMILARITY, metric(metric=metric.CKA, run_a=unknown).SerializeToString()),
            (SIMILARITY, metric(metric=metric.CKA, run_a=run, layers_a=[999 + i]).SerializeToString()),
            (SIMILARITY, metric(metric=metric.COS, run_a=run, center=f"sideways-{i}").SerializeToString()),
            (SIMILARITY, metric(metric=metric.MEASURE, run_a=run, measure=f"no-such-measure-{i}").SerializeToString()),
            (SIMILARITY, metric(metric=metric.MUTUAL_KNN, run_a=run, k=0).SerializeToString()),
            (SIMILARITY, metric(metric=metric.CKA, run_a=run, layers_a=list(range(-1, -2000, -1))).SerializeToString()),
            (SIMILARITY, os.urandom(64 + i)),  # not a protobuf message
            ("/actstore.v1.Catalog/DescribeRun", pb.DescribeRunRequest(run=unknown).SerializeToString()),
            ("/actstore.v1.Capture/GetJob", pb.GetJobRequest(job_id=unknown).SerializeToString()),
            ("/actstore.v1.Query/GetResult", pb.GetResultRequest(result_key=unknown).SerializeToString()),
            ("/actstore.v1.Query/Entropy", pb.EntropyRequest(run=unknown).SerializeToString()),
            ("/actstore.v1.Readers/Sql", rpb.SqlRequest(query=f"SELECT * FROM '/etc/passwd{i}'").SerializeToString()),
            ("/actstore.v1.Readers/Sql", rpb.SqlRequest(query=f"SELEC {i}").SerializeToString()),
        ]
    # 4 MiB of texts, and labels that do not match them
    texts = pb.TextList(texts=["x" * 4096] * 1024, labels=[1, 2, 3])
    big = pb.RegisterDatasetRequest(texts=texts, name="too-big").SerializeToString()
    return calls + [("/actstore.v1.Catalog/RegisterDataset", big)] * 40


def malformed_mix(address: str, run: str, total: int, proc) -> dict:
    calls = malformed_calls(run)
    rng = np.random.default_rng(0)
    order = [calls[i] for i in rng.permutation(len(calls))]
    clients = 4

    def burst(count: int, offset: int) -> dict:
        out = CTX.Queue()
        procs = [CTX.Process(target=_mixed_client, args=(address, order, count // clients, offset + c * 997, out))
                 for c in range(clients)]
        for p in procs:
            p.start()
        codes: dict[str, int] = {}
        for _ in procs:
            for code, k in out.get().items():
                codes[code] = codes.get(code, 0) + k
        for p in procs:
            p.join()
        return codes

    before = _private(proc)
    codes = burst(total // 5, 0)
    baseline = _private(proc)
    samples = []
    for part in range(4):
        for code, k in burst(total // 5, (part + 1) * 131).items():
            codes[code] = codes.get(code, 0) + k
        samples.append(_private(proc))
    return _growth(before, baseline, samples, proc) | {"requests": sum(codes.values()), "codes": codes}


def large_mix(address: str, run: str, count: int, proc) -> dict:
    """All-layer COS and CKA of a token-level run, recomputed one after another."""
    from actstore._proto.actstore.v1 import actstore_pb2 as pb

    metric = pb.SimilarityRequest
    queries = [metric(metric=kind, run_a=run, refresh=True).SerializeToString() for kind in (metric.COS, metric.CKA)]
    seconds = []
    with grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", 1 << 26)]) as channel:
        call = channel.unary_unary(SIMILARITY)
        samples, baseline, before = [], None, _private(proc)
        for i in range(count):
            started = time.perf_counter()
            call(queries[i % 2], timeout=600)
            seconds.append(time.perf_counter() - started)
            if i == 1:
                baseline = _private(proc)
            elif i > 1:
                samples.append(_private(proc))
    return _growth(before, baseline, samples, proc) | {"queries": count, "median_s": float(np.median(seconds))}


def _private(proc) -> int:
    """The server's private resident bytes: RSS less its shared pages. The shared pages are mostly
    the mapping of Ray's object store, which the process touches as results pass through it and the
    store itself bounds; counting them made one quick run's large mix read +17% where the private
    memory, the part a leak grows, was flat (324-326 MiB in runs of two commits)."""
    memory = proc.memory_info()
    return memory.rss - memory.shared


def _growth(before: int, baseline: int, samples: list[int], proc) -> dict:
    """Private memory growth over the mix after its warm-up, and what the server holds 5 s after it."""
    time.sleep(5)
    memory = proc.memory_info()
    rested = memory.rss - memory.shared
    return {"rss_shared_rested_mib": memory.shared / 2**20, "rss_total_rested_mib": memory.rss / 2**20,
            "rss_before_mib": before / 2**20, "rss_after_warmup_mib": baseline / 2**20,
            "rss_peak_mib": max(samples) / 2**20,
            "rss_end_mib": samples[-1] / 2**20, "rss_rested_mib": rested / 2**20,
            "growth": (samples[-1] - baseline) / baseline, "growth_rested": (rested - baseline) / baseline}


def _echo_server(port_out, size: int) -> None:
    answer = os.urandom(size)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))  # as actstore.server.app
    handler = grpc.method_handlers_generic_handler("bench.Echo", {
        "Call": grpc.unary_unary_rpc_method_handler(lambda request, context: answer)})
    server.add_generic_rpc_handlers((handler,))
    port_out.put(server.add_insecure_port("127.0.0.1:0"))
    server.start()
    server.wait_for_termination()


@contextlib.contextmanager
def echo_server(answer_size: int):
    """The address of a bare echo servicer in its own process, for the duration of the block."""
    port = CTX.Queue()
    server = CTX.Process(target=_echo_server, args=(port, answer_size), daemon=True)
    server.start()
    try:
        yield f"127.0.0.1:{port.get()}"
    finally:
        server.kill()


def rate(address: str, method: str, payload: bytes, per_client: int) -> float:
    """Requests per second of the 16 cached-query client processes against `address`."""
    latencies, errors, wall = drive(address, method, payload, CACHED_CLIENTS, per_client)
    assert not errors, errors[:3]
    return len(latencies) / wall


def ms(values, q) -> float:
    return float(np.percentile(np.asarray(values) * 1000.0, q)) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000, help="cached requests in the soak (default 100k)")
    parser.add_argument("--n", type=int, default=512, help="reviews captured (default 512)")
    parser.add_argument("--uncached-clients", type=int, default=UNCACHED_CLIENTS,
                        help="recomputing clients beside the cached ones (default 4; 0 isolates the cached path)")
    parser.add_argument("--warm-recomputes", type=int, default=150,
                        help="recomputes the warm-up holds at least (default 150; capped at 40%% of the requests)")
    parser.add_argument("--malformed", type=int, default=3000, help="requests of the malformed mix (default 3,000)")
    parser.add_argument("--large", type=int, default=12, help="queries of the large-query mix (default 12)")
    parser.add_argument("--quick", action="store_true", help="5,000 requests, n=128, 1,000 malformed, 6 large")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.n, args.malformed, args.large = 5000, 128, 1000, 6
    from actstore._proto.actstore.v1 import actstore_pb2 as pb

    with tempfile.TemporaryDirectory() as tmp:
        server = CTX.Process(target=_serve, args=(tmp, args.n), daemon=True)
        server.start()
        ready = os.path.join(tmp, "address")
        while not os.path.exists(ready):
            if not server.is_alive():
                raise SystemExit("the server process died while starting")
            time.sleep(0.5)
        address, run, token_run = open(ready).read().split()
        proc = psutil.Process(server.pid)
        cached = pb.SimilarityRequest(metric=pb.SimilarityRequest.CKA, run_a=run).SerializeToString()
        uncached = pb.SimilarityRequest(metric=pb.SimilarityRequest.CKA, run_a=run, layers_a=[1], layers_b=[2],
                                        refresh=True).SerializeToString()
        with grpc.insecure_channel(address) as channel:
            answer_size = len(channel.unary_unary(SIMILARITY)(cached))

        # throughput, server vs echo, 16 clients each, alternating rounds
        per_client = max(50, min(2000, args.requests // 40 // CACHED_CLIENTS))
        server_rates, echo_rates = [], []
        with echo_server(answer_size) as echo_address:
            drive(address, SIMILARITY, cached, CACHED_CLIENTS, 20)  # warm-up
            drive(echo_address, ECHO, cached, CACHED_CLIENTS, 20)
            for _ in range(ROUNDS):
                server_rates.append(rate(address, SIMILARITY, cached, per_client))
                echo_rates.append(rate(echo_address, ECHO, cached, per_client))
        server_rate, echo = benchlib.median(server_rates), benchlib.median(echo_rates)

        # the soak: warm-up (both kinds of client) until the RSS plateaus, then the rest with RSS sampled
        warm_stop, recomputes = CTX.Event(), CTX.Value("q", 0)
        warm_heavy = threading.Thread(target=drive, args=(address, SIMILARITY, uncached, args.uncached_clients,
                                                          10**9, warm_stop, recomputes), daemon=True)
        warm_heavy.start()
        step = max(CACHED_CLIENTS, args.requests // 20)
        warm = 0
        while warm < 2 * step or (recomputes.value < args.warm_recomputes and args.uncached_clients
                                  and warm + step <= WARM_UP_CAP * args.requests):
            drive(address, SIMILARITY, cached, CACHED_CLIENTS, step // CACHED_CLIENTS)
            warm += step
        warm_stop.set()
        warm_heavy.join()
        rss_after_warmup = proc.memory_info().rss
        samples = [rss_after_warmup]
        stop = CTX.Event()

        def sample() -> None:
            while not stop.wait(1.0):
                samples.append(proc.memory_info().rss)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        background: dict = {}
        heavy = threading.Thread(target=lambda: background.update(zip(
            ("latencies", "errors", "wall"),
            drive(address, SIMILARITY, uncached, args.uncached_clients, 10**9, stop))), daemon=True)
        heavy.start()
        soak_lat, soak_errors, soak_wall = drive(address, SIMILARITY, cached, CACHED_CLIENTS,
                                                 (args.requests - warm) // CACHED_CLIENTS)
        stop.set()
        sampler.join()
        heavy.join()  # the recomputing clients stop with the cached soak
        rss_end = proc.memory_info().rss
        mixes = {"malformed": malformed_mix(address, run, args.malformed, proc),
                 "large": large_mix(address, token_run, args.large, proc)}
        server.kill()

    growth = (max(samples[len(samples) // 2:] + [rss_end]) - rss_after_warmup) / rss_after_warmup
    record = {
        "params": vars(args), "machine": benchlib.machine(),
        "baseline": "a bare gRPC echo servicer answering the same number of bytes, same 16 client processes",
        "answer_bytes": answer_size,
        "throughput_16_clients": {"server_qps": server_rate, "echo_qps": echo, "ratio": server_rate / echo,
                                  "server_rounds": server_rates, "echo_rounds": echo_rates},
        "soak": {"cached_requests": len(soak_lat) + warm, "cached_errors": len(soak_errors),
                 "warm_up_cached_requests": warm, "warm_up_recomputes": recomputes.value,
                 "uncached_requests": len(background.get("latencies", [])),
                 "uncached_errors": len(background.get("errors", [])),
                 "cached_p50_ms": ms(soak_lat, 50), "cached_p99_ms": ms(soak_lat, 99),
                 "uncached_p50_ms": ms(background.get("latencies", []), 50),
                 "cached_qps": len(soak_lat) / soak_wall,
                 "rss_after_warmup_mib": rss_after_warmup / 2**20, "rss_end_mib": rss_end / 2**20,
                 "rss_growth": growth, "errors_sample": (soak_errors + background.get("errors", []))[:3]},
        "mixes": mixes,
    }
    benchlib.write_result("soak", record)
    s = record["soak"]
    print(f"throughput at 16 clients (medians of {ROUNDS} alternating rounds): server {server_rate:.0f} q/s, "
          f"echo {echo:.0f} q/s, "
          f"ratio {server_rate / echo:.2f} (target >= 0.8: {benchlib.verdict(server_rate / echo, 0.8)})")
    print(f"soak: {s['cached_requests']} cached ({s['cached_errors']} errors), {s['uncached_requests']} "
          f"recomputed ({s['uncached_errors']} errors); cached p50 {s['cached_p50_ms']:.2f} ms, "
          f"p99 {s['cached_p99_ms']:.2f} ms, {s['cached_qps']:.0f} q/s")
    print(f"warm-up: {s['warm_up_cached_requests']} cached requests and {s['warm_up_recomputes']} recomputes")
    print(f"server RSS {s['rss_after_warmup_mib']:.0f} MiB after warm-up -> {s['rss_end_mib']:.0f} MiB at the end: "
          f"growth {growth * 100:+.1f}% (target < 5%: {benchlib.verdict(growth, 0.05, higher_is_better=False)})")
    for name, mix in mixes.items():
        what = f"{mix['requests']} requests {mix['codes']}" if name == "malformed" else \
            f"{mix['queries']} queries, median {mix['median_s']:.2f} s"
        print(f"{name} mix: {what}; private RSS {mix['rss_before_mib']:.0f} MiB before, "
              f"{mix['rss_after_warmup_mib']:.0f} MiB after warm-up -> peak "
              f"{mix['rss_peak_mib']:.0f}, end {mix['rss_end_mib']:.0f}, 5 s later {mix['rss_rested_mib']:.0f} MiB: "
              f"growth {mix['growth'] * 100:+.1f}% ({mix['growth_rested'] * 100:+.1f}% rested; target < 5%: "
              f"{benchlib.verdict(mix['growth'], 0.05, higher_is_better=False)}); shared pages besides "
              f"{mix['rss_shared_rested_mib']:.0f} MiB")


def _serve(tmp: str, n: int) -> None:
    """The server process: an embedded server with one captured run; writes 'address run'."""
    with benchlib.embedded(os.path.join(tmp, "store"), shard_rows=128) as client:
        client.register_model(builtin="minilm-l6")
        benchlib.register_reviews(client, n, name="reviews")
        run = client.capture("minilm-l6", "reviews", pooling="mean").run_key
        client.cka(run)
        token_run = client.capture("minilm-l6", "reviews", pooling="tokens").run_key
        with open(os.path.join(tmp, "address.tmp"), "w") as f:
            f.write(f"{client.address} {run} {token_run}")
        os.rename(os.path.join(tmp, "address.tmp"), os.path.join(tmp, "address"))
        threading.Event().wait()


if __name__ == "__main__":
    main()
