"""Shard size: what the store's larger token-level shards cost and save a reader.

The same token-level run (MiniLM's shape, 7 x 384, float16, uncompressed: the store's choice for
float16) is written twice through `ZarrArrayStore.write_shard`, once in shards of `shard_rows`
(256) tokens and once in shards of the store's rule (`array_store.token_shard_rows`, 16 MB: 2,816
tokens), to a local store and to the S3 server on loopback (moto, as the tests start it). Then,
side by side, each read a reader makes, timed on both layouts in turns:

  * one layer, every row (a metric's map task over a layer);
  * every layer, every row (a CKA matrix's streaming pass);
  * 200 windows of 32 consecutive rows of one layer at random places (a loader's random access:
    each window decodes its shard's whole inner chunk, 256 or 2,816 rows of the layer).

Printed: each read's seconds on both layouts and large / small (below 1: the larger shards are
faster). The baseline is the store's own layout before (256-token shards), in the same run.

    python bench/shard_size.py [--rows 100000] [--rounds 3] [--targets local,s3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from pathlib import Path

import benchlib  # noqa: F401  (sets the Ray environment first)
import numpy as np
from benchlib import cores, machine, median, write_result

STATES, WIDTH = 7, 384


def written_run(root: str, rows: int, shard_rows: int) -> tuple[str, object]:
    from actstore.store.array_store import RunLayout
    from actstore.store.format.arrays import ZarrArrayStore

    store = ZarrArrayStore(root)
    layout = RunLayout(n=1, rows=rows, num_states=STATES, width=WIDTH, dtype="float16", pooling="tokens",
                       shard_rows=shard_rows)
    key = uuid.uuid4().hex * 2
    store.create_run(key, layout, ["all"], None, np.array([0, rows]), compress=False)
    rng = np.random.default_rng(0)
    for shard in range(layout.num_shards):
        start, stop = layout.shard_range(shard)
        values = rng.standard_normal((stop - start, STATES, WIDTH), dtype=np.float32).astype(np.float16)
        store.write_shard(key, shard, values, values.astype(np.float64).sum(axis=0))
    return key, layout


def reads(root: str, key: str, rows: int, windows: np.ndarray) -> dict[str, float]:
    """Seconds of each read, through a fresh handle (no layout or codec kept from the writes)."""
    from actstore.store.format.arrays import ZarrArrayStore

    store = ZarrArrayStore(root)
    store.layout(key)  # metadata once, as any reader opens a run
    timed = {}
    started = time.perf_counter()
    store.read_layers(key, [3], 0, rows)
    timed["one layer, all rows"] = time.perf_counter() - started
    started = time.perf_counter()
    store.read_layers(key, list(range(STATES)), 0, rows)
    timed["all layers, all rows"] = time.perf_counter() - started
    started = time.perf_counter()
    for start in windows:
        store.read_layers(key, [3], int(start), int(start) + 32)
    timed[f"{len(windows)} random 32-row windows, one layer"] = time.perf_counter() - started
    return timed


def main() -> None:
    from actstore.config import Settings
    from actstore.store.array_store import token_shard_rows

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000, help="token rows of the run (default 100,000)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--targets", default="local,s3")
    args = parser.parse_args()
    settings = Settings()
    sizes = {"small": settings.shard_rows,
             "large": token_shard_rows(settings.shard_rows, settings.shard_mb, STATES * WIDTH * 2, args.rows)}
    info = machine()
    print(f"shard size: {args.rows} token rows of {STATES} x {WIDTH} float16; shards of {sizes['small']} and "
          f"{sizes['large']} rows ({sizes['large'] * STATES * WIDTH * 2 / 1e6:.1f} MB); {cores()} cores, "
          f"load {info['loadavg_start']}", flush=True)
    windows = np.random.default_rng(1).integers(0, args.rows - 32, 200)
    results = []
    with tempfile.TemporaryDirectory(prefix="shard-size-") as name:
        roots = {"local": str(Path(name) / "store")}
        server = None
        if "s3" in args.targets.split(","):
            from object_store import new_bucket, start_s3_server

            server, _ = start_s3_server()
            roots["s3"] = new_bucket("size")
        try:
            for target in args.targets.split(","):
                runs = {size: written_run(roots[target], args.rows, rows)[0] for size, rows in sizes.items()}
                timed: dict[str, dict[str, list[float]]] = {"small": {}, "large": {}}
                for round_ in range(args.rounds):
                    for size in ("small", "large") if round_ % 2 == 0 else ("large", "small"):
                        for read, seconds in reads(roots[target], runs[size], args.rows, windows).items():
                            timed[size].setdefault(read, []).append(seconds)
                for read in timed["small"]:
                    small, large = median(timed["small"][read]), median(timed["large"][read])
                    results.append({"target": target, "read": read, "small_s": small, "large_s": large,
                                    "ratio": large / small})
                    print(f"  {target:5s} {read:38s} {sizes['small']}-row {small:7.3f} s | {sizes['large']}-row "
                          f"{large:7.3f} s | large / small {large / small:.2f}", flush=True)
        finally:
            if server is not None:
                server.terminate()
                server.wait(timeout=10)
    path = write_result("shard_size", {"machine": info, "args": vars(args), "shard_rows": sizes,
                                       "results": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
