"""`actstore demo`: the main job, end to end on embedded defaults.

Captures MiniLM-L6 (encoder, 6 blocks) and SmolLM2-135M (causal LM, 30 blocks) on Rotten
Tomatoes reviews, asks the service for within-model CKA and COS matrices, the cross-model CKA
matrix and a sentiment probe of every layer of both models, and writes plots plus a Markdown
report. Everything is computed by the service next to the stored chunks; the client only receives
the small result matrices.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from actstore.client import Client
from actstore.client.plots import matrix_size
from actstore.report import markdown_matrix, write_outliers, write_plot, write_probes

MODELS = (("minilm-l6", "MiniLM-L6"), ("smollm2-135m", "SmolLM2-135M"))
DATASET = "rotten-tomatoes"


def _titled(result, title: str, **options):
    """A drawing of `result.plot(ax, **options)` under the report's own title."""
    return lambda ax: result.plot(ax, **options).set_title(title, fontsize=10)


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
            size = matrix_size(cka.biased.shape)
            write_plot(out / f"cka_{label}.png", _titled(cka, f"{label}: linear CKA (n={cka.n})"), size)
            write_plot(out / f"cos_{label}.png", _titled(cos, f"{label}: mean sample-wise cosine"), size)

            def to_last(ax, cka=cka, cos=cos, label=label):
                cos.plot(ax, show="to_last")
                cka.plot(ax, show="to_last").set_title(f"{label}: similarity to the last layer", fontsize=10)

            write_plot(out / f"to_last_{label}.png", to_last)
            last = len(layers) - 1
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
        write_plot(out / "cka_cross.png", _titled(cross, f"linear CKA: {label_a} (rows) vs {label_b} (columns)"),
                   matrix_size(cross.biased.shape))
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
        sections.append(_probe_section(client, out, runs))
        timings["sentiment probes of both models, with Layer by Layer correlations"] = time.perf_counter() - t
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


def lit_columns(matrix: np.ndarray, fraction: float = 0.9) -> np.ndarray:
    """Columns (layers of B) whose best CKA with any layer of A reaches `fraction` of the matrix's
    maximum: the bright stripes of a cross-model matrix; the others form its flat block."""
    return np.flatnonzero(np.nanmax(matrix, axis=0) >= fraction * np.nanmax(matrix))


def _standardised_section(client: Client, out: Path, a: tuple[str, str], b: tuple[str, str],
                          plain: np.ndarray) -> str:
    """What massive dimensions do to the cross-model matrix: B's outlier report, and the same
    matrix on z-scored features (docs/metrics.md, "Outlier diagnostics")."""
    (label_a, run_a), (label_b, run_b) = a, b
    report = client.outliers(run_b, top_k=3)
    write_outliers(out / "outliers_b.png", report)
    standard = client.cka_stats(run_a, run_b, standardize=True)
    write_plot(out / "cka_cross_standardised.png",
               _titled(standard, f"linear CKA on z-scored features: {label_a} (rows) vs {label_b} (columns)"),
               matrix_size(standard.biased.shape))
    layers = np.asarray(standard.layers_b)
    lit_plain, lit_standard = lit_columns(plain), lit_columns(standard.biased)
    flat = np.setdiff1d(np.arange(plain.shape[1]), lit_plain)
    lights_up = np.intersect1d(flat, lit_standard)
    share = f"{len(lights_up) / len(flat):.0%}" if len(flat) else "n/a"
    per_layer = [len(report.outliers_of(int(layer))) for layer in report.layers]
    return (
        "## Outlier dimensions and the cross-model matrix\n\n"
        "![outliers](outliers_b.png) ![standardised](cka_cross_standardised.png)\n\n"
        f"{label_b}'s outlier severity (||mean|| / ||std||) ranges {np.nanmin(report.severity):.2f}.."
        f"{np.nanmax(report.severity):.2f} over its layers (max at layer "
        f"{report.layers[int(np.nanargmax(report.severity))]}); the largest |mean|/std per layer belongs to "
        f"dimension(s) {sorted({int(d) for d in report.top_dims[:, 0] if d >= 0})}; the outlier rule flags "
        f"{len(report.outlier_dims)} layer-dimension pairs ({min(per_layer)}-{max(per_layer)} per layer)."
        f"\n\nA {label_b} layer lights up when its best CKA with any {label_a} layer reaches 90% of the matrix's "
        f"maximum. Plain features: {len(lit_plain)} of {len(layers)} layers light up ({layers[lit_plain].tolist()}); "
        f"the other {len(flat)} form the flat block (mean CKA {np.nanmean(plain[:, flat]) if len(flat) else np.nan:.3f}"
        f"). On z-scored features {len(lit_standard)} light up ({layers[lit_standard].tolist()}): {len(lights_up)} "
        f"of the flat block ({share}), whose mean CKA becomes "
        f"{np.nanmean(standard.biased[:, flat]) if len(flat) else np.nan:.3f}. Range of the z-scored matrix "
        f"{np.nanmin(standard.biased):.3f}..{np.nanmax(standard.biased):.3f} (plain {np.nanmin(plain):.3f}.."
        f"{np.nanmax(plain):.3f}).\n"
    )


PROBE_AGAINST = ("dataset-entropy", "effective-rank")


def _probe_section(client: Client, out: Path, runs: dict) -> str:
    """Which layer of each model encodes the reviews' sentiment (the dataset's fresh/rotten labels):
    a ridge probe per layer on five folds of the sample ids, the same for both models, with the
    entropy family of "Layer by Layer" set beside it."""
    labels = list(runs)
    results = client.probe_runs([run for run, _ in runs.values()], against=list(PROBE_AGAINST))
    write_probes(out / "probe_sentiment.png", results, labels)
    lines = []
    for label, result in zip(labels, results):
        s = result.scalars
        rho = result.correlations
        lines.append(
            f"- {label}: best layer {result.best_layer} of {result.layers[-1]}, accuracy {s['best_score']:.3f} "
            f"(last layer {s['last_score']:.3f}: {s['best_minus_last']:+.3f} for the best); the smallest layer within "
            f"0.01 of the best is {result.within_layer}; majority class {s['majority_accuracy']:.3f}. Spearman rho "
            "with the probe accuracy over the layers: "
            + ", ".join(f"{name} {values['spearman']:+.2f}" for name, values in rho.items()))
    first = results[0]
    return (
        f"## Sentiment probes: which layer encodes fresh vs rotten ({int(first.scalars['n'])} reviews)\n\n"
        "![probes](probe_sentiment.png)\n\n"
        "A ridge classifier per layer (alpha per fold by an inner cross-validation), scored by held-out accuracy "
        f"on {int(first.scalars['folds'])} folds of the sample ids (the same folds for both models; band: 95% "
        "corrected resampled t interval), with the dataset entropy and effective rank of each layer beside it "
        "(\"Layer by Layer\").\n\n" + "\n".join(lines) + "\n"
    )


LENS_PROMPTS = 20


def _saturation_section(client: Client, out: Path, model) -> str:
    """Saturation events of the real SmolLM2 (the analogue of the paper's LLaMA3 figures): the logit
    lens with its own final norm + unembedding on every layer of every token of a few reviews."""
    client.register_dataset(builtin=DATASET, limit=LENS_PROMPTS, seed=1, name=f"{DATASET}-{LENS_PROMPTS}")
    run = client.capture(model.digest, f"{DATASET}-{LENS_PROMPTS}", pooling="tokens", max_len=64).run_key
    lens = client.lens(run)
    write_plot(out / "smollm2_saturation.png",
               _titled(lens, f"SmolLM2-135M: saturation layer of {lens.n} next-token predictions", show="saturation"))
    write_plot(out / "smollm2_lens_accuracy.png",
               _titled(lens, "SmolLM2-135M: logit-lens next-token accuracy per layer", show="accuracy"))
    half = int(np.searchsorted(lens.saturation_cumulative / lens.n, 0.5))  # cumulative counts -> share
    return (
        f"## SmolLM2-135M saturation events ({LENS_PROMPTS} reviews, {lens.n} next-token predictions)\n\n"
        "![saturation](smollm2_saturation.png) ![lens accuracy](smollm2_lens_accuracy.png)\n\n"
        f"The top-1 prediction of half the tokens is fixed from layer {half} on; "
        f"{lens.saturation_counts[-1] / lens.n:.0%} only settle at the last layer. Lens accuracy at layer "
        f"{len(lens.accuracy) - 1} is the model's own next-token accuracy ({lens.accuracy[-1]:.3f}); "
        f"{lens.effective_depth_relative} is the smallest layer within 0.1 of it.\n"
    )
