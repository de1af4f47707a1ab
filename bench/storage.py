"""Storage: bytes per stored value of float16 and bfloat16 runs (float32 as a reference).

The same n rotten-tomatoes reviews captured with the packaged MiniLM (pooling mean, max_len 128)
once per storage dtype, in one embedded server (lz4 unless --compressor). Stored bytes =
`client.describe(run).stored_bytes` (the activation shards on disk, after Blosc); values =
n * (L+1) * d.

Baseline: raw float32, 4 bytes per value (the activations as the model computes them). Printed:
bytes/value and compression = 4 / (bytes/value) per dtype, the compression against the dtype's own
raw size, and the max abs error of the stored values against the float32 run.

    python bench/storage.py [--quick] [--n 2048] [--dtypes float16,bfloat16,float32]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import benchlib  # noqa: F401  (sets the Ray environment first)
import numpy as np
from benchlib import cores, embedded, machine, register_reviews, write_result

ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4}
RAW_FLOAT32 = 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2048, help="reviews captured per dtype (default 2048)")
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--pooling", default="mean")
    parser.add_argument("--dtypes", default="float16,bfloat16,float32")
    parser.add_argument("--compressor", choices=("lz4", "zstd"), default="lz4")
    parser.add_argument("--shard-rows", type=int, default=256, help="samples per shard (default: Settings' 256)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny run: n=64, shard-rows=32")
    args = parser.parse_args()
    if args.quick:
        args.n, args.shard_rows = 64, 32
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if "float32" not in dtypes:
        dtypes.append("float32")  # the reference for the error column

    info = machine()
    print(f"storage: n={args.n} pooling={args.pooling} compressor={args.compressor} shard_rows={args.shard_rows}; "
          f"{cores()} cores, load {info['loadavg_start']}")
    results = {}
    with tempfile.TemporaryDirectory(prefix="actstore-bench-") as tmp, \
            embedded(Path(tmp) / "store", shard_rows=args.shard_rows, compressor=args.compressor) as client:
        client.register_model(builtin="minilm-l6")
        register_reviews(client, args.n, args.seed, name="reviews")
        runs = {}
        for dtype in dtypes:
            started = time.perf_counter()
            runs[dtype] = client.capture("minilm-l6", "reviews", pooling=args.pooling, dtype=dtype,
                                         max_len=args.max_len).run_key
            described = client.describe(runs[dtype])
            values = described.n * (described.num_layers + 1) * described.width
            results[dtype] = {"run": runs[dtype], "stored_bytes": described.stored_bytes, "values": values,
                              "capture_seconds": time.perf_counter() - started,
                              "shape": [described.n, described.num_layers + 1, described.width]}
        states = results["float32"]["shape"][1]
        exact = [client.read_activations(runs["float32"], layer)[0] for layer in range(states)]
        scale = max(float(np.max(np.abs(x))) for x in exact)
        for dtype in dtypes:
            error = max(float(np.max(np.abs(client.read_activations(runs[dtype], layer)[0].astype(np.float32)
                                            - exact[layer]))) for layer in range(states))
            results[dtype].update(max_abs_error=error, max_abs_value=scale)

    print(f"baseline: raw float32 = {RAW_FLOAT32} bytes/value")
    print(f"{'dtype':<9} {'stored bytes':>13} {'values':>10} {'B/value':>8} {'vs raw f32':>11} "
          f"{'vs own raw':>11} {'max abs err':>12}")
    for dtype in dtypes:
        r = results[dtype]
        r["bytes_per_value"] = r["stored_bytes"] / r["values"]
        r["compression_vs_raw_float32"] = RAW_FLOAT32 / r["bytes_per_value"]
        r["stored_over_raw_float32"] = r["bytes_per_value"] / RAW_FLOAT32
        r["compression_vs_own_raw"] = ITEMSIZE[dtype] / r["bytes_per_value"]
        print(f"{dtype:<9} {r['stored_bytes']:>13,} {r['values']:>10,} {r['bytes_per_value']:>8.3f} "
              f"{r['compression_vs_raw_float32']:>10.2f}x {r['compression_vs_own_raw']:>10.2f}x "
              f"{r['max_abs_error']:>12.3g}")
    for dtype in dtypes:
        r = results[dtype]
        print(f"ratio {dtype}: {r['bytes_per_value']:.3f} B/value = {r['stored_over_raw_float32']:.3f} of raw float32 "
              f"({r['compression_vs_raw_float32']:.2f}x smaller)")
    print(f"  (largest |value| in the float32 run: {results['float32']['max_abs_value']:.3g})")

    path = write_result("storage", {
        "quick": args.quick, "params": vars(args), "machine": info,
        "baseline": "raw float32, 4 bytes per value", "results": results,
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
