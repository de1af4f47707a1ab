"""Is a similarity meaningful? `cka` / `cos` with --bootstrap, --ci, --null and the feature options
(--standardize, --exclude-dims, --exclude-outliers), and the `outliers` command."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from actstore.cli.common import add_option, connect, layers_option, output_options
from actstore.options import UNCERTAINTY

FEATURE_FLAGS = ("standardize", "exclude_dims", "exclude_outliers", "outlier_sigmas")


def add_stats_flags(p, metric: str) -> None:
    """The uncertainty and feature flags of `cka` (all) and `cos` (no null)."""
    add_option(p, UNCERTAINTY, "bootstrap", extra_help="(e.g. 200)")
    add_option(p, UNCERTAINTY, "ci")
    add_option(p, UNCERTAINTY, "seed")
    if metric == "cka":
        add_option(p, UNCERTAINTY, "null", extra_help="(e.g. 100)")
        add_option(p, UNCERTAINTY, "bootstrap_method")
        add_option(p, UNCERTAINTY, "bootstrap_groups")
    for name in FEATURE_FLAGS:
        add_option(p, UNCERTAINTY, name)


def wanted(args) -> bool:
    """Whether the command asks for more than the plain metric."""
    return bool(args.bootstrap or getattr(args, "null", 0) or args.standardize or args.exclude_dims
                or args.exclude_outliers)


def _features(args) -> dict:
    return {"bootstrap": args.bootstrap, "ci": args.ci, "seed": args.seed, "standardize": args.standardize,
            "exclude_dims": args.exclude_dims, "exclude_outliers": args.exclude_outliers,
            "outlier_sigmas": args.outlier_sigmas}


def _interval_table(name: str, values: np.ndarray, interval: np.ndarray | None, layers_a, layers_b) -> str:
    lines = [f"{name}: layer A, layer B, value" + (", interval" if interval is not None else "")]
    for i, la in enumerate(layers_a):
        for j, lb in enumerate(layers_b):
            extra = f"  [{interval[i, j, 0]:.4f}, {interval[i, j, 1]:.4f}]" if interval is not None else ""
            lines.append(f"  {la:>3} {lb:>3}  {values[i, j]:.4f}{extra}")
    return "\n".join(lines)


def _plot(args, result, values, interval, **options) -> None:
    """The answer's own drawing (intervals as error bars, else the heatmap) written to --plot."""
    from actstore.report import write_matrix_plot, write_plot

    path = Path(args.plot)
    if interval is None:
        write_matrix_plot(path, result, values, **options)
    else:
        write_plot(path, lambda ax: result.plot(ax, **options))
    print(f"plot written to {args.plot}")


def cmd_cka_stats(args) -> int:
    with connect(args) as client:
        r = client.cka_stats(args.run_a, args.run_b, layers_a=args.layers_a,
                             layers_b=args.layers_b, null=args.null, refresh=args.refresh,
                             bootstrap_method=args.bootstrap_method, bootstrap_groups=args.bootstrap_groups,
                             **_features(args))
    variant = "debiased" if args.debiased else "biased"
    values, interval, null = getattr(r, variant), getattr(r, f"{variant}_ci"), getattr(r, f"{variant}_null")
    if args.json:
        print(json.dumps({"metric": f"linear CKA ({variant})", "matrix": values.tolist(),
                          "interval": None if interval is None else interval.tolist(),
                          "null_mean": None if null is None else null.mean.tolist(),
                          "calibrated": None if null is None else null.calibrated.tolist(),
                          "p_value": None if null is None else null.p_value.tolist(),
                          "excluded_a": r.excluded_a.tolist(), "excluded_b": r.excluded_b.tolist(),
                          "layers_a": r.layers_a, "layers_b": r.layers_b, "options": r.provenance.options,
                          "cached": r.provenance.cached, "notes": r.notes}))
        return 0
    print(_interval_table(f"linear CKA ({variant}), n={r.n}", values, interval, r.layers_a, r.layers_b))
    if null is not None:
        print("\npermutation null: layer A, layer B, null mean, calibrated, p-value")
        for i, la in enumerate(r.layers_a):
            for j, lb in enumerate(r.layers_b):
                print(f"  {la:>3} {lb:>3}  {null.mean[i, j]:.4f}  {null.calibrated[i, j]:.4f}  "
                      f"{null.p_value[i, j]:.4f}")
    for note in r.notes:
        print(f"note: {note}")
    if args.plot:
        _plot(args, r, values, interval, debiased=args.debiased)
    return 0


def cmd_cos_stats(args) -> int:
    with connect(args) as client:
        r = client.cos_stats(args.run_a, args.run_b, layers_a=args.layers_a,
                             layers_b=args.layers_b, center=args.center, refresh=args.refresh,
                             **_features(args))
    if args.json:
        print(json.dumps({"metric": "sample-wise cosine (mean)", "matrix": r.mean.tolist(),
                          "interval": None if r.mean_ci is None else r.mean_ci.tolist(),
                          "excluded_a": r.excluded_a.tolist(), "layers_a": r.layers_a, "layers_b": r.layers_b,
                          "options": r.provenance.options, "cached": r.provenance.cached, "notes": r.notes}))
        return 0
    print(_interval_table(f"mean sample-wise cosine, n={r.n}", r.mean, r.mean_ci, r.layers_a, r.layers_b))
    for note in r.notes:
        print(f"note: {note}")
    if args.plot:
        _plot(args, r, r.mean, r.mean_ci)
    return 0


def cmd_outliers(args) -> int:
    with connect(args) as client:
        r = client.outliers(args.run, layers=args.layers, top_k=args.top_k,
                            outlier_sigmas=args.outlier_sigmas, refresh=args.refresh)
    if args.json:
        print(json.dumps({"layers": r.layers, "severity": r.severity.tolist(), "top_dims": r.top_dims.tolist(),
                          "top_ratio": r.top_ratio.tolist(), "top_mean": r.top_mean.tolist(),
                          "kurtosis_max": r.kurtosis_max.tolist(), "kurtosis_mean": r.kurtosis_mean.tolist(),
                          "outlier_dims": r.outlier_dims.tolist(), "n": r.n, "cached": r.provenance.cached}))
        return 0
    print(f"outlier diagnosis over n={r.n} samples (severity = ||mean|| / ||std||; top dims by |mean| / std)")
    print("layer  severity  kurt.max  kurt.mean  outliers  top dimensions: dim (|mean|/std, mean)")
    for i, layer in enumerate(r.layers):
        tops = ", ".join(f"{d} ({ratio:.1f}, {mean:.3g})" for d, ratio, mean in
                         zip(r.top_dims[i], r.top_ratio[i], r.top_mean[i]) if d >= 0)
        print(f"{layer:>5}  {r.severity[i]:8.3f}  {r.kurtosis_max[i]:8.1f}  {r.kurtosis_mean[i]:9.2f}  "
              f"{len(r.outliers_of(layer)):>8}  {tops}")
    for note in r.notes:
        print(f"note: {note}")
    if args.plot:
        from actstore.report import write_outliers

        write_outliers(Path(args.plot), r)
        print(f"plot written to {args.plot}")
    return 0


def add_commands(command) -> None:
    p = command("outliers", cmd_outliers, "outlier dimensions and massive activations per layer",
                "Per layer: severity ||mean|| / ||std|| (mean vector norm over the norm of the per-dimension\n"
                "stds), the top-k dimensions by |mean| / std with their values, excess kurtosis (max and mean\n"
                "over dimensions) and the outlier dimensions that --exclude-outliers would leave out of cka/cos.\n"
                "Definitions: docs/metrics.md, 'Outlier diagnostics'.")
    p.add_argument("run", help="run key or prefix")
    layers_option(p)
    add_option(p, UNCERTAINTY, "top_k", "--top-k")
    add_option(p, UNCERTAINTY, "outlier_sigmas")
    output_options(p, "write the severity and top-dimension plot here")
