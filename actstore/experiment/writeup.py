"""The experiment's Markdown report and plots: per-method numbers over seeds, the claims with
their mean, spread and verdict (`claims.RULE`), the multi-exit sweep and the timings."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from actstore.client import plots
from actstore.experiment.claims import RULE, VERDICTS, MethodResult, Spread, seed_checks, summarise
from actstore.report import write_plot


def _over_seeds(results: dict[int, dict[str, MethodResult]], method: str, value) -> np.ndarray:
    return np.stack([np.asarray(value(by_method[method]), dtype=np.float64) for by_method in results.values()])


def _plots(recipe: str, results: dict[int, dict[str, MethodResult]], methods: list[str], out: Path) -> None:
    """Mean over seeds per layer with a min..max band; saturation counts summed over seeds."""
    for name, value, ylabel, ylim in [("accuracy", lambda r: r.lens.accuracy, "accuracy", (0, 1)),
                                      ("cos_to_last", lambda r: r.cos_to_last, "cosine", None)]:
        stacked = {m: _over_seeds(results, m, value) for m in methods}
        if all(np.isnan(s).all() for s in stacked.values()):
            continue
        title = (f"{recipe}: {'logit-lens accuracy' if name == 'accuracy' else 'mean COS to the last layer'}"
                 f" per layer, mean over {len(results)} seed(s)")

        def over_seeds(ax, stacked=stacked, title=title, ylabel=ylabel, ylim=ylim):
            for method, s in stacked.items():
                plots.curve(ax, np.arange(s.shape[1]), s.mean(0), label=method,
                            band=(s.min(0), s.max(0)) if len(results) > 1 else None)
            if ylim:
                ax.set_ylim(*ylim)
            plots.label(ax, title, "layer", ylabel)

        write_plot(out / f"{name}.png", over_seeds)

    def saturation(ax):
        for slot, method in enumerate(methods):
            counts = _over_seeds(results, method, lambda r: r.lens.saturation_counts).sum(0)
            plots.bars(ax, counts, slot=slot, slots=len(methods), label=method)
        plots.label(ax, f"{recipe}: saturation layer distribution (all seeds)", "layer", "samples")

    write_plot(out / "saturation.png", saturation)


def write_report(recipe: str, smoke: bool, beta: float, epsilon: float, results: dict[int, dict[str, MethodResult]],
                 timings: dict[str, float], out: Path, total: float) -> Path:
    seeds = list(results)
    methods = list(results[seeds[0]])
    _plots(recipe, results, methods, out)

    def spread(method: str, value) -> str:
        return str(Spread.of([value(results[s][method]) for s in seeds]))

    rows = ["| method | final acc | mean acc layers 1..L-1 | mean COS to last, 1..L-1 | mean saturation layer | "
            f"{epsilon}-eff. depth (relative) |", "|---|---|---|---|---|---|"]
    for m in methods:
        rows.append(f"| {m} | {spread(m, lambda r: r.lens.accuracy[-1])} | {spread(m, lambda r: r.shallow_accuracy)}"
                    f" | {spread(m, lambda r: r.shallow_cos)} | {spread(m, lambda r: r.mean_saturation)} | "
                    f"{spread(m, lambda r: r.lens.effective_depth_relative)} |")
    summaries = summarise({s: seed_checks(results[s], epsilon) for s in seeds})
    claim_rows = ["| claim | baseline | aligned | holds on | per seed | verdict |", "|---|---|---|---|---|---|"]
    for c in summaries:
        per_seed = ", ".join(f"{s}: {'-' if h is None else ('yes' if h else 'no')}" for s, h in c.per_seed.items())
        claim_rows.append(f"| {c.claim} | {c.baseline} | {c.value} | {c.holds_on} | {per_seed} | "
                          f"{VERDICTS[c.verdict]} |")
    exit_rows = ["| method (heads) | tau | exit accuracy | speed-up |", "|---|---|---|---|"]
    for m in methods:
        first = results[seeds[0]][m]
        for own in (False, True) if first.exits_lens is not None else (False,):
            for tau in (first.exits_lens if own else first.lens).taus:
                acc = Spread.of([results[s][m].exit_row(tau, own)[0] for s in seeds])
                speed = Spread.of([results[s][m].exit_row(tau, own)[1] for s in seeds])
                exit_rows.append(f"| {m} ({'own exits' if own else 'shared head'}) | {tau:.2f} | {acc} | {speed} |")
    text = (
        f"# Aligned vs standard training: {recipe}{' (smoke size)' if smoke else ''}, seeds "
        f"{', '.join(map(str, seeds))}\n\n"
        f"Layers 0..{len(results[seeds[0]][methods[0]].lens.accuracy) - 1} (0 = embeddings). Every number comes "
        "from actstore queries on the captured held-out set (logit lens with each model's own final norm + "
        f"classifier on every layer). ce-reg beta = {beta:g}. Numbers are mean ± sample std (min..max) over "
        "the seeds.\n\n![accuracy](accuracy.png) ![cos](cos_to_last.png) ![saturation](saturation.png)\n\n"
        + "\n".join(rows) + "\n\n## The paper's claims\n\n" + RULE + "\n\n" + "\n".join(claim_rows)
        + "\n\n## Multi-exit sweep\n\n" + "\n".join(exit_rows)
        + "\n\n## Timings\n\n" + "\n".join(f"- {m}: {s:.0f} s (train + capture + queries, all seeds)"
                                           for m, s in timings.items())
        + f"\n- total: {total:.0f} s\n"
    )
    report = out / "report.md"
    report.write_text(text)
    return report
