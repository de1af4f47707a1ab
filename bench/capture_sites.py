"""Capture sites: three sites in one pass vs three single-site captures of the same model and data.

Store side: an embedded server (a local Ray), the packaged MiniLM (`minilm-l6`), n rotten-tomatoes
reviews, pooling mean, float16, max_len 128. Before timing, an attn_out capture of a small different
dataset warms the model replica and the server's one-off module look-up (its first submit naming
a site other than resid_post builds the model's skeleton), so both sides run warm.
  * multi-site: `client.capture(..., site="resid_post,attn_out,mlp_out")`, one job, one forward
    pass per batch, three runs written; submit to the last run committed.
  * baseline, same server, same data: `client.capture(..., site=s)` for s in the three sites, one
    after another (three jobs, three forward passes); submit of the first to the third committed.
Each round deletes the runs between the two sides (so nothing is a cache hit; the run keys are the
same either way) and checks that both sides stored identical bytes for every site. Rounds
alternate which side goes first; the medians are compared.

    python bench/capture_sites.py [--quick] [--n 1024] [--rounds 2]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import benchlib  # noqa: F401  (sets the Ray environment first)
import numpy as np
from benchlib import embedded, machine, median, register_reviews, timed_capture, verdict, write_result

TARGET = 2.0
SITES = ("resid_post", "attn_out", "mlp_out")


def capture_multi(client, options: dict) -> tuple[float, dict[str, str]]:
    timed = timed_capture(client, "minilm-l6", "reviews", site=",".join(SITES), **options)
    assert list(timed["runs"]) == list(SITES) and not timed["cached"], timed["runs"]
    return timed["seconds"], timed["runs"]


def capture_singles(client, options: dict) -> tuple[float, dict[str, str]]:
    seconds, runs = 0.0, {}
    for site in SITES:
        timed = timed_capture(client, "minilm-l6", "reviews", site=site, **options)
        assert not timed["cached"]
        seconds += timed["seconds"]
        runs[site] = timed["run"]
    return seconds, runs


def snapshot(client, runs: dict[str, str]) -> dict[str, np.ndarray]:
    """Every layer of every site's run (to compare the two sides)."""
    return {site: np.stack([client.read_activations(key, layer)[0]
                            for layer in range(client.describe(key).num_layers + 1)])
            for site, key in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1024, help="reviews captured (default 1024)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, alternating which side goes first")
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32, help="capture batch size (default 32)")
    parser.add_argument("--shard-rows", type=int, default=256, help="samples per shard (default: Settings' 256)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny run: n=64, shard-rows=32, one round")
    args = parser.parse_args()
    if args.quick:
        args.n, args.shard_rows, args.rounds = 64, 32, 1
    info = machine()
    options = {"pooling": "mean", "dtype": "float16", "max_len": args.max_len}
    print(f"capture sites: n={args.n} sites={','.join(SITES)} rounds={args.rounds} shard_rows={args.shard_rows}; "
          f"{info['cores']} cores, load {info['loadavg_start']}")

    multi, singles = [], []
    with tempfile.TemporaryDirectory(prefix="actstore-bench-") as tmp, \
            embedded(Path(tmp) / "store", shard_rows=args.shard_rows, capture_batch_size=args.batch) as client:
        client.register_model(builtin="minilm-l6")
        register_reviews(client, args.n, args.seed, name="reviews")
        client.register_dataset(builtin="rotten-tomatoes", limit=16, seed=args.seed + 1, name="warm-up")
        # a warm replica for both sides, and the server's one-off look at the model's modules (a
        # meta-device skeleton, built on the first submit naming a site other than resid_post)
        timed_capture(client, "minilm-l6", "warm-up", site="attn_out", **options)
        for round_ in range(args.rounds):
            sides = [("multi", capture_multi), ("singles", capture_singles)]
            stored = {}
            for name, side in sides if round_ % 2 == 0 else sides[::-1]:
                seconds, runs = side(client, options)
                (multi if name == "multi" else singles).append(seconds)
                stored[name] = snapshot(client, runs)
                for key in runs.values():
                    client.delete_run(key)
                print(f"  round {round_ + 1} {name:8s}: {seconds:.2f} s ({args.n / seconds:.1f} samples/s)")
            for site in SITES:
                assert np.array_equal(stored["multi"][site], stored["singles"][site]), site

    ratio = median(singles) / median(multi)
    print(f"baseline: three single-site captures, median {median(singles):.2f} s")
    print(f"three sites in one pass, median {median(multi):.2f} s -> {ratio:.2f}x faster "
          f"[target >= {TARGET}x: {verdict(ratio, TARGET)}]; stored bytes identical on both sides")
    path = write_result("capture_sites", {
        "quick": args.quick, "params": vars(args), "machine": info, "sites": SITES,
        "baseline": "three single-site captures (one job each) of the same model and data, same warm server",
        "multi_seconds": multi, "singles_seconds": singles, "speedup": ratio, "target": TARGET,
        "pass": ratio >= TARGET,
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
