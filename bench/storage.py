"""Storage: bytes per stored value of float16, bfloat16 and int8 runs (float32 as the reference and
the exact values), and what each dtype does to CKA.

The same n rotten-tomatoes reviews captured with the packaged models (MiniLM-L6: mean pooling;
SmolLM2-135M: last-token pooling; and every token of both with --poolings ...,tokens; max_len
128), once per storage dtype, in one embedded server (lz4 unless --compressor). Stored bytes =
`client.describe(run).stored_bytes`: the activation shards on disk after Blosc, with an int8 run's
`scales` and `errors` arrays and any layers its --max-cka-error kept exact (float32; named);
values = rows * (L+1) * d.

Baseline: float16 in the same run (the store's default); raw float32 = 4 bytes per value. Printed
per model, pooling and dtype: bytes/value, its ratio to float16's, the capture's wall seconds, the
wall of the full L+1 x L+1 CKA query (`client.cka(run, refresh=True)`), the largest |CKA(stored) -
CKA(float32)| over every layer pair (biased and debiased) and, for int8, the bound the answer
carried (its largest entry: within a run both sides are lossy and add, each taken at the entry's
CKA, so at most twice a layer's bound), the
largest per-layer statistical bound (one side) and the largest per-layer angle (the sure bound).
Target (issue 39): int8 <= 1.05 bytes per value on every model and pooling.

    python bench/storage.py [--quick] [--n 2048] [--models minilm-l6,smollm2-135m]
                            [--poolings pooled,tokens] [--dtypes float16,bfloat16,int8] [--max-cka-error T]
                            [--cka-layers 0,15,30]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import benchlib  # noqa: F401  (sets the Ray environment first)
import numpy as np
from benchlib import cores, embedded, machine, register_reviews, verdict, write_result

ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "int8": 1}
RAW_FLOAT32 = 4
TARGET_INT8 = 1.05
POOLED = {"minilm-l6": "mean", "smollm2-135m": "last"}


def capture(client, model: str, pooling: str, dtype: str, max_len: int, tolerance: float | None,
            cka_layers: list[int] | None = None) -> dict:
    started = time.perf_counter()
    extra = {"max_cka_error": tolerance} if dtype == "int8" and tolerance else {}
    run = client.capture(model, "reviews", pooling=pooling, dtype=dtype, max_len=max_len, **extra).run_key
    seconds = time.perf_counter() - started
    described = client.describe(run)
    started = time.perf_counter()
    cka = client.cka(run, refresh=True, layers_a=cka_layers, layers_b=cka_layers)
    cka_seconds = time.perf_counter() - started
    values = described.rows * (described.num_layers + 1) * described.width
    exact_layers = [r.layer for r in described.rounding if r.stored == "float32"]
    return {"run": run, "capture_seconds": seconds, "cka_seconds": cka_seconds, "stored_bytes": described.stored_bytes,
            "values": values, "bytes_per_value": described.stored_bytes / values, "rows": described.rows,
            "shards": described.num_shards, "exact_layers": exact_layers, "cka": cka,
            "largest_angle": max((max(r.angle_biased, r.angle_debiased) for r in described.rounding), default=0.0),
            "largest_side_bound": max((max(r.bound_biased, r.bound_debiased) for r in described.rounding), default=0.0),
            "largest_rel_error": max((r.rel_frobenius for r in described.rounding), default=0.0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2048, help="reviews captured per dtype (default 2048)")
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--models", default="minilm-l6,smollm2-135m")
    parser.add_argument("--poolings", default="pooled,tokens", help="pooled (the model's: mean / last) and tokens")
    parser.add_argument("--dtypes", default="float16,bfloat16,int8")
    parser.add_argument("--max-cka-error", type=float, default=None, help="int8's tolerance (default: none)")
    parser.add_argument("--compressor", choices=("lz4", "zstd"), default="lz4")
    parser.add_argument("--shard-rows", type=int, default=256, help="samples per shard (default: Settings' 256)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cka-layers", default="", help="the CKA over these layers only, e.g. 0,15,30 (default: "
                        "every layer; SmolLM2's token-level 31 x 31 takes ~20 min on 2 cores)")
    parser.add_argument("--quick", action="store_true", help="tiny run: n=64, shard-rows=32, MiniLM only")
    args = parser.parse_args()
    if args.quick:
        args.n, args.shard_rows, args.models = 64, 32, "minilm-l6"
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    dtypes = ["float32"] + [d for d in dtypes if d != "float32"]  # the exact values: captured first
    if "float16" not in dtypes:
        dtypes.append("float16")  # the baseline
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    cka_layers = [int(k) for k in args.cka_layers.split(",") if k.strip()] or None
    poolings = [p.strip() for p in args.poolings.split(",") if p.strip()]

    info = machine()
    print(f"storage: n={args.n} models={models} poolings={poolings} dtypes={dtypes} compressor={args.compressor} "
          f"shard_rows={args.shard_rows} max_cka_error={args.max_cka_error} cka_layers={cka_layers or 'all'}; "
          f"{cores()} cores, "
          f"load {info['loadavg_start']}", flush=True)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="actstore-bench-") as tmp, \
            embedded(Path(tmp) / "store", shard_rows=args.shard_rows, compressor=args.compressor) as client:
        for model in models:
            client.register_model(builtin=model)
        register_reviews(client, args.n, args.seed, name="reviews")
        for model in models:
            for kind in poolings:
                pooling = POOLED[model] if kind == "pooled" else "tokens"
                case = f"{model} {pooling}"
                rows = results[case] = {}
                for dtype in dtypes:
                    rows[dtype] = capture(client, model, pooling, dtype, args.max_len, args.max_cka_error, cka_layers)
                    print(f"  {case} {dtype}: {rows[dtype]['bytes_per_value']:.4f} B/value, captured in "
                          f"{rows[dtype]['capture_seconds']:.1f} s, CKA {rows[dtype]['cka_seconds']:.2f} s", flush=True)
                exact = rows["float32"]["cka"]
                for row in rows.values():
                    answer = row.pop("cka")
                    row["largest_cka_error"] = float(max(np.nanmax(np.abs(answer.biased - exact.biased)),
                                                         np.nanmax(np.abs(answer.debiased - exact.debiased))))
                    row["bound"] = answer.provenance.error_bound
                    row["bound_holds"] = None if answer.bound_biased is None else bool(
                        np.all(np.abs(answer.biased - exact.biased) <= answer.bound_biased + 1e-12)
                        and np.all(np.nan_to_num(np.abs(answer.debiased - exact.debiased))
                                   <= np.nan_to_num(answer.bound_debiased) + 1e-12))
                    row["vs_float16"] = row["bytes_per_value"] / rows["float16"]["bytes_per_value"]

    print(f"\nbaseline: float16 in the same run; raw float32 = {RAW_FLOAT32} bytes/value")
    header = (f"{'case':<24} {'dtype':<9} {'B/value':>8} {'vs f16':>7} {'capture s':>10} {'CKA s':>7} "
              f"{'max |dCKA|':>11} {'bound':>9} {'side bound':>10} {'max angle':>10}  exact layers")
    print(header)
    worst = 0.0
    for case, rows in results.items():
        for dtype, r in rows.items():
            bound = "-" if r["bound"] is None else f"{r['bound']:.3g}"
            print(f"{case:<24} {dtype:<9} {r['bytes_per_value']:>8.4f} {r['vs_float16']:>7.3f} "
                  f"{r['capture_seconds']:>10.1f} {r['cka_seconds']:>7.2f} {r['largest_cka_error']:>11.2g} "
                  f"{bound:>9} {r['largest_side_bound']:>10.3g} {r['largest_angle']:>10.3g}  {r['exact_layers'] or ''}")
            if dtype == "int8":
                worst = max(worst, r["bytes_per_value"])
                assert r["bound_holds"] is not False, f"{case}: the bound did not hold"
    if "int8" in dtypes:
        print(f"ratio int8: at most {worst:.4f} bytes per value over every case [target <= {TARGET_INT8}: "
              f"{verdict(worst, TARGET_INT8, higher_is_better=False)}]")
    path = write_result("storage", {
        "quick": args.quick, "params": vars(args), "machine": info,
        "baseline": "float16 in the same run; raw float32, 4 bytes per value", "results": results,
        "int8_worst_bytes_per_value": worst, "target_int8": TARGET_INT8,
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
