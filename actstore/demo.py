"""`actstore demo`: the main job, end to end on embedded defaults.

Captures MiniLM-L6 (encoder, 6 blocks) and SmolLM2-135M (causal LM, 30 blocks) on Rotten
Tomatoes reviews, asks the service for within-model CKA and COS matrices and the cross-model CKA
matrix, and writes heatmaps plus a Markdown report. Everything is computed by the service next to
the stored chunks; the client only receives the small result matrices.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from actstore.client import Client
from actstore.report import bars, curves, heatmap, markdown_matrix, outlier_panels

MODELS = (("minilm-l6", "MiniLM-L6"), ("smollm2-135m", "SmolLM2-135M"))
DATASET = "rotten-tomatoes"


def _off_diagonal_corr(a: np.ndarray, b: np.ndarray) -> float:
    mask = ~np.eye(a.shape[0], dtype=bool)
    return float(np.corrcoef(a[mask], b[mask])[0, 1])


def run_demo(out: Path, store: str | None = None, n: int = 300, address: str | None = None) -> Path:
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    client = Client(address) if address else Client.embedded(store or "./actstore-data")
    timings: dict[str, float] = {}
    with client:
        dataset_name = f"{DATASET}-{n}"
        dataset = client.register_dataset(builtin=DATASET, limit=n, seed=0, name=dataset_name)
        print(f"dataset {dataset_name}: {dataset.n} reviews ({dataset.digest[:12]})")
        runs = {}
        for builtin, label in MODELS:
            t = time.perf_counter()
            model = client.register_model(builtin=builtin)
            capture = client.capture(builtin, dataset_name, pooling="mean", progress=True)
            timings[f"register + capture {label}"] = time.perf_counter() - t
            runs[label] = (capture.run_key, model)
            print(f"{label}: {model.num_layers} blocks x {model.hidden_size} wide -> run {capture.run_key[:12]}"
                  f" ({'cache hit' if capture.cache_hit else 'captured'})")

        sections = []
        t = time.perf_counter()
        for label, (run, model) in runs.items():
            cka = client.cka(run)
            cos = client.cos(run)
            layers = cka.layers_a
            heatmap(cka.biased, out / f"cka_{label}.png", title=f"{label}: linear CKA (n={cka.n})",
                    xlabel="layer", ylabel="layer", xticks=layers, yticks=layers)
            heatmap(cos.mean, out / f"cos_{label}.png", title=f"{label}: mean sample-wise cosine",
                    xlabel="layer", ylabel="layer", xticks=layers, yticks=layers, vmin=None)
            last = len(layers) - 1
            q = list(cos.quantile_levels)
            lo, hi = q.index(0.25), q.index(0.75)
            curves({"COS to last layer": cos.mean[:, last], "CKA to last layer": cka.biased[:, last]},
                   out / f"to_last_{label}.png", title=f"{label}: similarity to the last layer",
                   xlabel="layer", ylabel="similarity",
                   bands={"COS to last layer": (cos.quantiles[:, last, lo], cos.quantiles[:, last, hi])})
            adjacent = np.diag(cka.biased, 1)
            sections.append(
                f"## {label} ({model.num_layers} blocks, width {model.hidden_size})\n\n"
                f"![CKA](cka_{label}.png) ![COS](cos_{label}.png) ![to last](to_last_{label}.png)\n\n"
                f"- adjacent-layer CKA: min {adjacent.min():.3f}, mean {adjacent.mean():.3f}\n"
                f"- CKA(layer 0, last layer) = {cka.biased[0, last]:.3f}; "
                f"COS(layer 0, last layer) = {cos.mean[0, last]:.3f}\n"
                f"- agreement of COS with CKA over layer pairs (Pearson r, off-diagonal): "
                f"{_off_diagonal_corr(cka.biased, cos.mean):.3f}\n"
                + (f"\nCKA (biased):\n\n{markdown_matrix(cka.biased, layers, layers)}\n"
                   if len(layers) <= 8 else "")
            )
        (label_a, (run_a, _)), (label_b, (run_b, _)) = runs.items()
        cross = client.cka(run_a, run_b)
        heatmap(cross.biased, out / "cka_cross.png", title=f"linear CKA: {label_a} (rows) vs {label_b} (columns)",
                xlabel=f"{label_b} layer", ylabel=f"{label_a} layer", xticks=cross.layers_b, yticks=cross.layers_a)
        best = cross.biased.argmax(axis=1)
        timings["queries"] = time.perf_counter() - t
        sections.append(
            f"## Cross-model: {label_a} vs {label_b}\n\n![cross](cka_cross.png)\n\n"
            "Best-matching SmolLM2 layer for each MiniLM layer (biased CKA): "
            + ", ".join(f"{la}->{cross.layers_b[b]} ({cross.biased[i, b]:.2f})"
                        for i, (la, b) in enumerate(zip(cross.layers_a, best)))
            + f"\n\nDebiased CKA of the same pairs, range {np.nanmin(cross.debiased):.3f}.."
              f"{np.nanmax(cross.debiased):.3f}.\n"
        )
        t = time.perf_counter()
        sections.append(_standardised_section(client, out, (label_a, run_a), (label_b, run_b), cross.biased))
        timings["outlier report + standardised cross-model CKA"] = time.perf_counter() - t
        t = time.perf_counter()
        sections.append(_saturation_section(client, out, runs["SmolLM2-135M"][1]))
        timings["SmolLM2 logit lens on 20 prompts"] = time.perf_counter() - t
        total = time.perf_counter() - started
        report = out / "report.md"
        report.write_text(
            "# actstore demo: layer-wise similarity of MiniLM-L6 and SmolLM2-135M\n\n"
            f"{dataset.n} Rotten Tomatoes reviews (seeded sample), mean-pooled hidden states of every layer "
            "(0 = embeddings), stored as float16; metrics computed by the service from the stored chunks "
            "with float64 streaming accumulators.\n\n"
            + "\n".join(sections)
            + "\n## Timings\n\n" + "\n".join(f"- {k}: {v:.1f} s" for k, v in timings.items())
            + f"\n- total: {total:.1f} s\n"
        )
    print(f"report written to {report} (with {len(list(out.glob('*.png')))} plots) in {total:.0f} s")
    return report


def dark_columns(matrix: np.ndarray, fraction: float = 0.5) -> np.ndarray:
    """Columns (layers of B) whose best CKA with any layer of A stays below `fraction` of the
    matrix's maximum: the flat stripes of a cross-model matrix."""
    return np.flatnonzero(np.nanmax(matrix, axis=0) < fraction * np.nanmax(matrix))


def _standardised_section(client: Client, out: Path, a: tuple[str, str], b: tuple[str, str],
                          plain: np.ndarray) -> str:
    """What massive dimensions do to the cross-model matrix: B's outlier report, and the same
    matrix on z-scored features (docs/metrics.md, "Outlier diagnostics")."""
    (label_a, run_a), (label_b, run_b) = a, b
    report = client.outliers(run_b, top_k=3)
    outlier_panels(report.layers, report.severity, report.top_dims, report.top_ratio, report.kurtosis_max,
                   out / "outliers_b.png", title=f"{label_b}: outlier dimensions per layer")
    standard = client.cka_stats(run_a, run_b, standardize=True)
    heatmap(standard.biased, out / "cka_cross_standardised.png",
            title=f"linear CKA on z-scored features: {label_a} (rows) vs {label_b} (columns)",
            xlabel=f"{label_b} layer", ylabel=f"{label_a} layer", xticks=standard.layers_b, yticks=standard.layers_a)
    dark = dark_columns(plain)
    lit = [c for c in dark if np.nanmax(standard.biased[:, c]) >= 0.5 * np.nanmax(standard.biased)]
    dominant = {int(d) for d in report.top_dims[:, 0] if d >= 0}
    if len(dark):
        change = (f"{len(dark)} of {plain.shape[1]} {label_b} layers are dark in the plain matrix (best CKA with any "
                  f"{label_a} layer below half the matrix maximum): mean CKA there {np.nanmean(plain[:, dark]):.3f}. "
                  f"On z-scored features {len(lit)} of them ({len(lit) / len(dark):.0%}) light up (best CKA at least "
                  f"half the new maximum); their mean CKA becomes {np.nanmean(standard.biased[:, dark]):.3f}.")
    else:
        change = "No layer of the plain matrix is dark (every column reaches half the maximum)."
    return (
        "## Outlier dimensions and the cross-model matrix\n\n"
        "![outliers](outliers_b.png) ![standardised](cka_cross_standardised.png)\n\n"
        f"{label_b}'s outlier severity (||mean|| / ||std|| over dimensions) ranges "
        f"{np.nanmin(report.severity):.2f}..{np.nanmax(report.severity):.2f} over its layers (max at layer "
        f"{report.layers[int(np.nanargmax(report.severity))]}); the dimensions with the largest |mean|/std per layer "
        f"are {sorted(dominant)}, and {len(report.outlier_dims)} layer-dimension pairs pass the outlier "
        f"rule. {change} Range of the z-scored matrix: {np.nanmin(standard.biased):.3f}.."
        f"{np.nanmax(standard.biased):.3f} (plain: {np.nanmin(plain):.3f}..{np.nanmax(plain):.3f}).\n"
    )


LENS_PROMPTS = 20


def _saturation_section(client: Client, out: Path, model) -> str:
    """Saturation events of the real SmolLM2 (the analogue of the paper's LLaMA3 figures): the logit
    lens with its own final norm + unembedding on every layer of every token of a few reviews."""
    client.register_dataset(builtin=DATASET, limit=LENS_PROMPTS, seed=1, name=f"{DATASET}-{LENS_PROMPTS}")
    run = client.capture(model.digest, f"{DATASET}-{LENS_PROMPTS}", pooling="tokens", max_len=64).run_key
    lens = client.lens(run)
    bars({"tokens": lens.saturation_counts}, out / "smollm2_saturation.png",
         title=f"SmolLM2-135M: saturation layer of {lens.n} next-token predictions", xlabel="layer",
         ylabel="tokens")
    curves({"lens accuracy (next token)": lens.accuracy}, out / "smollm2_lens_accuracy.png",
           title="SmolLM2-135M: logit-lens next-token accuracy per layer", xlabel="layer", ylabel="accuracy")
    half = int(np.searchsorted(lens.saturation_cumulative / lens.n, 0.5))  # cumulative counts -> share
    return (
        f"## SmolLM2-135M saturation events ({LENS_PROMPTS} reviews, {lens.n} next-token predictions)\n\n"
        "![saturation](smollm2_saturation.png) ![lens accuracy](smollm2_lens_accuracy.png)\n\n"
        f"The top-1 prediction of half the tokens is fixed from layer {half} on; "
        f"{lens.saturation_counts[-1] / lens.n:.0%} only settle at the last layer. Lens accuracy at layer "
        f"{len(lens.accuracy) - 1} is the model's own next-token accuracy ({lens.accuracy[-1]:.3f}); "
        f"{lens.effective_depth_relative} is the smallest layer within 0.1 of it.\n"
    )
