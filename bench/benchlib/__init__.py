"""Shared helpers of the bench/ scripts (a package, so `make bench`'s bench/*.py glob skips it).

Import it first: it sets the environment Ray and transformers need before either starts.
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent.parent
# BENCH_OUT_DIR: elsewhere (the suite's bench smoke tests, so a test run never replaces a real result)
OUT_DIR = Path(os.environ.get("BENCH_OUT_DIR") or BENCH_DIR / "out")
ROTTEN_TOMATOES_N = 12_808  # texts in the packaged rotten-tomatoes builtin


def cores() -> int:
    return os.cpu_count() or 1


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine() -> dict:
    import torch

    return {"cores": cores(), "python": platform.python_version(), "torch": torch.__version__,
            "platform": platform.platform(), "loadavg_start": loadavg()}


def median(values) -> float:
    return float(statistics.median(values))


def _real_reviews() -> list[str]:
    from actstore.store.datasets import load_builtin

    return load_builtin("rotten-tomatoes").texts


def review_texts(n: int, seed: int = 0) -> tuple[list[str], bool]:
    """n review texts, in the order the server will store them, and whether they are synthetic.

    n <= 12,808: the packaged reviews exactly as `register_dataset(builtin="rotten-tomatoes",
    limit=n, seed=seed)` stores them. Larger n: a seeded word-level resampling of the real reviews
    (each text takes the word count of a random real review and draws its words from the pooled
    words of all reviews), registered as a list of texts."""
    from actstore.store.datasets import load_builtin

    if n <= ROTTEN_TOMATOES_N:
        return load_builtin("rotten-tomatoes", limit=n, seed=seed).texts, False
    real = _real_reviews()
    words = np.array([w for text in real for w in text.split()], dtype=object)
    lengths = np.array([max(1, len(text.split())) for text in real])
    rng = np.random.default_rng(seed)
    texts = []
    for length in lengths[rng.integers(0, len(lengths), size=n)]:
        texts.append(" ".join(words[rng.integers(0, len(words), size=int(length))]))
    return texts, True


def register_reviews(client, n: int, seed: int = 0, name: str | None = None) -> list[str]:
    """Register n reviews (see `review_texts`) under `name`; returns the texts."""
    texts, synthetic = review_texts(n, seed)
    if synthetic:
        info = client.register_dataset(texts=texts, name=name)
    else:
        info = client.register_dataset(builtin="rotten-tomatoes", limit=n, seed=seed, name=name)
    if info.n != n:
        raise RuntimeError(f"registered {info.n} texts, expected {n}")
    return texts


def embedded(path, **settings):
    from actstore.client import Client

    return Client.embedded(path, **{"resume_on_start": False, **settings})


def timed_capture(client, model: str, dataset: str, **kwargs) -> dict:
    """Submit a capture and follow it; wall seconds from submit to the committed run, and the
    (seconds, shards done) of every progress event seen on the way."""
    started = time.perf_counter()
    job = client.submit_capture(model, dataset, **kwargs)
    events = []
    last = job
    if not job.finished:
        for last in client.watch(job.job_id):
            events.append((time.perf_counter() - started, last.done))
    seconds = time.perf_counter() - started
    if last.status != "done":
        raise RuntimeError(f"capture job {job.job_id} ended {last.status}: {last.error}")
    return {"run": job.target, "seconds": seconds, "events": events, "cached": job.finished,
            "runs": dict(zip(job.sites, job.run_keys))}  # site -> run key


def in_job_rate(events: list[tuple[float, int]], shard_rows: int, n: int) -> float | None:
    """Samples/s between the first and the last shard completion seen (excludes job start-up,
    the first shard's latency and the commit); None with fewer than two distinct completions."""
    firsts: dict[int, float] = {}
    for t, done in events:
        if done > 0 and done not in firsts:
            firsts[done] = t
    if len(firsts) < 2:
        return None
    lo, hi = min(firsts), max(firsts)
    rows = min(hi * shard_rows, n) - lo * shard_rows
    return rows / (firsts[hi] - firsts[lo]) if firsts[hi] > firsts[lo] else None


def write_result(script: str, record: dict) -> Path:
    """One JSON line with the results at bench/out/<script>.json (replaced on every run)."""
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    record = {"script": script, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv[1:],
              **record}
    record.setdefault("machine", {})["loadavg_end"] = loadavg()
    path = OUT_DIR / f"{script}.json"
    path.write_text(json.dumps(record, default=_json_default) + "\n")
    return path


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def verdict(value: float, target: float, higher_is_better: bool = True) -> str:
    ok = value >= target if higher_is_better else value <= target
    return "PASS" if ok else "FAIL"


# ---- synthetic runs written straight into an embedded server's store ----------------------------

def _synthetic_digest(kind: str, **fields) -> str:
    from actstore.store.keys import sha256_hex

    return sha256_hex({"bench-synthetic": kind, **fields})


def synthetic_latents(n: int, shard_rows: int, seed: int = 0, latent: int = 32) -> np.ndarray:
    """The per-sample latent vectors z (n, latent) behind `write_synthetic_runs`' runs of `seed`."""
    return np.concatenate([np.random.default_rng([seed, 0, shard]).standard_normal(
        (min(shard_rows, n - start), latent), dtype=np.float32) for shard, start in enumerate(range(0, n, shard_rows))])


def write_synthetic_runs(client, n: int, *, runs: int = 1, states: int = 7, width: int = 384, seed: int = 0,
                         latent: int = 32, outliers: int = 4, log: bool = True,
                         dataset_digest: str | None = None, dtype: str = "float16") -> list[str]:
    """Write `runs` committed float16 pooled runs of n samples x `states` layers x `width` into the
    embedded server's store through its in-process service (no model, no capture job), and return
    their run keys. Capturing 100k real samples would take about an hour on 2 cores.

    Every run holds the same samples (identical sample ids "s0000000", ... and one dataset
    record), so runs of one call can be compared with each other. The data is shaped like a
    residual stream: each sample has a latent vector z (`latent` dims, drawn per sample, shared by
    every run); run m's embedding layer is z @ W_m plus noise plus a mean vector with `outliers`
    large-mean dimensions (means 8..40, as the massive activations of real transformers), and
    layer l+1 = layer l + noise (std 0.6) plus a growing term along the outlier dimensions. W_m and
    the outlier dimensions differ between runs.

    Path: a RunLayout (actstore.store.format.arrays) and a RunRecord (catalog) with placeholder model
    and dataset records (the query path reads only the run record and the arrays); each shard
    goes through `service.arrays.write_shard` with its float64 layer sums, its chunk metadata
    (`actstore.workers.shard_writes.chunk_metadata`: crc32c, min/max, NaN/Inf counts) into
    `service.catalog.chunks.insert`, then the layer means are written and `catalog.runs.commit`
    checks every shard is recorded and marks the run committed, as a capture job does. With
    `dataset_digest` (a dataset registered with the ids "s0000000", ...) the runs are of that
    dataset instead of a placeholder record. `dtype` "int8": the same values coded to one byte as a
    capture codes them (`workers.capture.prepare_shards`, `write_prepared`), with their error
    figures measured and stored at commit (the run keys then differ from the float16 runs'), in shards of
    the rows a capture would give it (`RunLayout.new`: twice a float16 shard's, the same bytes)."""
    import pyarrow as pa
    import torch

    from actstore.metrics.rounding import ErrorFigures
    from actstore.store.catalog import DatasetRecord, ModelRecord, RunRecord
    from actstore.store.format.arrays import RunLayout
    from actstore.store.format.quantised import rounding_seed
    from actstore.store.keys import run_key, run_spec
    from actstore.workers.capture import prepare_shards
    from actstore.workers.shard_writes import chunk_metadata, write_prepared

    service = client._server.service
    shard_rows = service.settings.shard_rows
    if dataset_digest is None:
        dataset_digest = _synthetic_digest("dataset", n=n, seed=seed, latent=latent)
        service.catalog.datasets.add(DatasetRecord(digest=dataset_digest, kind="text", n=n, num_labels=0,
                                                  has_groups=False, path="", source={"bench-synthetic": n}))
    sample_ids = [f"s{i:07d}" for i in range(n)]
    keys = []
    for m in range(runs):
        started = time.perf_counter()
        model_digest = _synthetic_digest("model", index=m, seed=seed, states=states, width=width)
        service.catalog.models.add(ModelRecord(digest=model_digest, kind="encoder", arch="bench-synthetic",
                                              num_layers=states - 1, hidden_size=width, max_positions=None,
                                              path="", has_head=False, lineage={"bench-synthetic": m}))
        spec = run_spec(model_digest=model_digest, dataset_digest=dataset_digest, num_layers=states - 1,
                        pooling="mean", max_len=128, dtype=dtype)
        key = run_key(spec)
        # the layout a capture of this dtype would make (an int8 run's shards hold twice the rows)
        layout = RunLayout.new(n, n, states, width, dtype, "mean", shard_rows, service.settings.shard_mb)
        figures = ErrorFigures(states, width) if dtype == "int8" else None
        service.arrays.create_run(key, layout, sample_ids, None, None)
        record, _ = service.catalog.runs.open(RunRecord(run_key=key, model_digest=model_digest,
                                                       dataset_digest=dataset_digest,
                                          pooling="mean", dtype=dtype, max_len=128, n=n, rows=n,
                                          num_layers=states - 1, width=width, num_shards=layout.num_shards,
                                          status="running", spec=spec))
        model_rng = np.random.default_rng([seed, 1, m])
        mixing = (model_rng.standard_normal((latent, width)) / np.sqrt(latent)).astype(np.float32)
        mean = np.zeros(width, np.float32)
        hot = model_rng.choice(width, size=outliers, replace=False)
        mean[hot] = model_rng.uniform(8, 40, size=outliers) * model_rng.choice([-1, 1], size=outliers)
        drift = np.zeros(width, np.float32)
        drift[hot] = np.sign(mean[hot]) * 2.0
        pending: dict[str, list] = {}
        for shard in range(layout.num_shards):
            start, stop = layout.shard_range(shard)
            z = np.random.default_rng([seed, 0, shard]).standard_normal((stop - start, latent), dtype=np.float32)
            noise_rng = np.random.default_rng([seed, 2, m, shard])
            values = np.empty((stop - start, states, width), np.float32)
            values[:, 0] = z @ mixing + 0.5 * noise_rng.standard_normal((stop - start, width), dtype=np.float32) + mean
            for layer in range(1, states):
                values[:, layer] = (values[:, layer - 1] + drift
                                    + 0.6 * noise_rng.standard_normal((stop - start, width), dtype=np.float32))
            if figures is not None:  # the capture's own coding and measurement
                prepared = prepare_shards(torch.from_numpy(values), [(0, stop - start)], dtype, figures,
                                          [rounding_seed(key, shard)])[0]
                rows = write_prepared(service.arrays, key, shard, prepared)
            else:
                stored = values.astype(np.float16)
                numbers = stored.astype(np.float32)
                service.arrays.write_shard(key, shard, stored, numbers.sum(axis=0, dtype=np.float64))
                rows = chunk_metadata(key, shard, stored)
            for column, cells in rows.items():
                pending.setdefault(column, []).extend(cells)
            if shard % 64 == 63 or shard == layout.num_shards - 1:
                service.catalog.chunks.insert(pa.table(pending))
                pending = {}
        if figures is not None:
            service.arrays.write_error_figures(key, figures.finalize())
        service.arrays.write_means(key)
        service.catalog.runs.commit(record)
        service.arrays.mark_committed(key)
        keys.append(key)
        if log:
            print(f"  wrote synthetic run {key[:12]} ({n} x {states} x {width} {dtype}, {layout.num_shards} shards) "
                  f"in {time.perf_counter() - started:.1f} s", flush=True)
    return keys


def run_files(client, run: str) -> list[Path]:
    """The run's activation shard files in the store (what a query decompresses)."""
    from actstore.store.backends import backend_for

    service = client._server.service
    layout = service.arrays.layout(run)
    root = str(service.arrays.root)
    directory = backend_for(root).directory(root)  # a plain path or file://: the folder its keys are files in
    if directory is None:
        raise SystemExit(f"the store {root} keeps no files on this machine: run the bench on a local store")
    return sorted(p for p in (directory / "runs" / run / layout.array_name).rglob("*") if p.is_file())


def read_files(paths: list[Path], block: int = 8 << 20) -> tuple[int, float]:
    """Read every file once with plain buffered reads; (bytes, seconds)."""
    total = 0
    started = time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as handle:
            while chunk := handle.read(block):
                total += len(chunk)
    return total, time.perf_counter() - started


# ---- memory of the server and the Ray workers ---------------------------------------------------

def release_free_heap() -> None:
    """Hand freed heap pages back to the OS (glibc malloc_trim), so this process's RSS baseline is
    live memory rather than a free heap a query would reuse unseen."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class RssSampler:
    """Samples the RSS of this process (the embedded server) and of every process it started (the
    Ray cluster: raylet with its object store, GCS, agents, log monitor, and the workers) every
    `interval` seconds in a thread, between start() and stop(). A process that starts during the
    window (a Ray worker, say) is picked up within 20 intervals and counts whole, from 0.

    Per process: its role, RSS at start (baseline; 0 for a process that appeared during the
    window), peak, and peak - baseline. Totals: the largest simultaneous sum over the processes
    (peak of the sum, and its increase over the summed baseline; a process that exits during the
    window takes its RSS out of the sum). Shared pages (Ray's object store in /dev/shm) count in
    every process that touched them, so sums can double count them."""

    def __init__(self, interval: float = 0.05) -> None:
        import psutil

        self._psutil = psutil
        self.interval = interval
        self.me = psutil.Process()
        self._stop = None
        self._thread = None

    @staticmethod
    def role(command: list[str]) -> str:
        """What a process of the Ray cluster is, from its command line."""
        title = command[0] if command else ""
        if title.startswith(("ray::DashboardAgent", "ray::RuntimeEnvAgent")):
            return "ray agent"
        if title.startswith("ray::") or any(part.endswith("default_worker.py") for part in command):
            return "ray worker"  # titled ray::IDLE / ray::<task>, or still starting up
        if title.endswith("raylet"):
            return "raylet (and object store)"
        if title.endswith("gcs_server"):
            return "ray gcs"
        scripts = [Path(part).stem for part in command if part.endswith(".py")]
        return f"ray {scripts[0]}" if scripts else Path(title).name or "other"

    def processes(self) -> dict[int, tuple[str, object]]:
        found = {self.me.pid: ("server (bench process)", self.me)}
        for child in self.me.children(recursive=True):
            try:
                found[child.pid] = (self.role(child.cmdline()), child)
            except (self._psutil.NoSuchProcess, self._psutil.AccessDenied, self._psutil.ZombieProcess):
                continue
        return found

    def _rss(self) -> dict[int, int]:
        out = {}
        for pid, (_, proc) in self._procs.items():
            try:
                out[pid] = proc.memory_info().rss
            except (self._psutil.NoSuchProcess, self._psutil.AccessDenied):
                pass
        return out

    def start(self) -> RssSampler:
        import threading

        self._procs = self.processes()
        self.baseline = self._rss()
        self._last = self.baseline
        self.peak = dict(self.baseline)
        self.peak_sum = sum(self.baseline.values())
        self.samples = 0
        self._stop = threading.Event()

        def loop():
            rescan = 0
            while not self._stop.wait(self.interval):
                rescan += 1
                if rescan % 20 == 0:  # pick up worker processes Ray starts during the window
                    for pid, entry in self.processes().items():
                        self._procs.setdefault(pid, entry)
                rss = self._rss()
                self._last = rss
                for pid, value in rss.items():
                    self.peak[pid] = max(self.peak.get(pid, 0), value)
                self.peak_sum = max(self.peak_sum, sum(rss.values()))
                self.samples += 1

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        mib = 1 / 2**20
        per_process = []
        for pid, peak in sorted(self.peak.items()):
            base = self.baseline.get(pid, 0)
            per_process.append({"pid": pid, "role": self._procs[pid][0], "baseline_mib": base * mib,
                                "peak_mib": peak * mib, "increase_mib": (peak - base) * mib,
                                "new": pid not in self.baseline, "exited": pid not in self._last})
        baseline_sum = sum(self.baseline.values())
        return {"interval_s": self.interval, "samples": self.samples, "per_process": per_process,
                "peak_sum_mib": self.peak_sum * mib, "baseline_sum_mib": baseline_sum * mib,
                "increase_of_sum_mib": (self.peak_sum - baseline_sum) * mib,
                "sum_of_increases_mib": sum(p["increase_mib"] for p in per_process)}
