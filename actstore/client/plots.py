"""How answers draw themselves (matplotlib, an optional extra: pip install 'actstore[plots]').

Every answer's `plot(ax=None, **style)` comes here and returns the Axes it drew on: given an Axes
it draws into it (so figures compose: `fig, (a, b) = plt.subplots(1, 2); cka.plot(a); lens.plot(b)`),
without one it makes a figure with pyplot (inline in Jupyter). `style` goes to the main artist
(`imshow` of a heatmap: cmap, vmin, vmax; `plot` of a curve: color, linestyle, ...). The CLI's
--plot, the demo's report and the experiment's write-up draw through the same functions
(`actstore.report` only writes the figures to files). matplotlib is imported inside the functions,
so `import actstore.client` never needs it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from actstore.client.names import pair_names, short_name
from actstore.errors import FailedPrecondition, InvalidArgument

MISSING = "plot() needs matplotlib: pip install 'actstore[plots]'"
CURVE_SIZE = (6.0, 3.6)
PANEL_SIZE = (7.0, 3.2)
TICKS_SHOWN = 16  # at most this many tick labels on an axis
ANNOTATED_CELLS = 100  # a heatmap with at most this many cells prints each value (where it has room)


def pyplot():
    """matplotlib's pyplot, with its own backend choice (inline in Jupyter, Agg without a display)."""
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise FailedPrecondition(f"{MISSING} (or pip install matplotlib)") from None
    return plt


def figure(size: tuple[float, float], dpi: int):
    """A matplotlib Figure made without pyplot (no backend, no window: for files and thumbnails)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise FailedPrecondition(f"{MISSING} (or pip install matplotlib)") from None
    return Figure(figsize=size, dpi=dpi)


def choose(show: str, pictures: Sequence[str]) -> str:
    """`show` if it names one of an answer's `pictures`, else InvalidArgument listing them."""
    if show not in pictures:
        raise InvalidArgument(f"show={show!r} is not a picture of this answer: one of {', '.join(pictures)}")
    return show


def new_axes(ax, size: tuple[float, float] = CURVE_SIZE):
    """`ax` itself, or the Axes of a new pyplot figure of `size` inches."""
    if ax is not None:
        return ax
    _, ax = pyplot().subplots(figsize=size)
    return ax


def matrix_size(shape: tuple[int, int]) -> tuple[float, float]:
    """A heatmap figure's inches for a rows x cols matrix: about a quarter inch a cell, half an
    inch where the values are printed."""
    rows, cols = shape
    cell = 0.5 if rows * cols <= ANNOTATED_CELLS else 0.28
    return 1.6 + cell * max(cols, 6), 1.0 + cell * max(rows, 6)


def _inches(ax) -> tuple[float, float]:
    """The Axes' width and height in inches."""
    box = ax.get_position()
    return box.width * ax.figure.get_figwidth(), box.height * ax.figure.get_figheight()


def _ticks(ax, axis: str, labels: Sequence) -> None:
    """Every k-th label, k such that the labels fit the Axes (a long x label turns upright)."""
    labels = [str(label) for label in labels]
    width, height = _inches(ax)
    upright = axis == "x" and max(map(len, labels), default=0) > 3
    room = height if axis == "y" or upright else width * 4 / max(4, max(map(len, labels), default=1))
    fits = max(2, min(TICKS_SHOWN, int(room / 0.16)))  # a 7-point label needs about 0.16 inch
    step = -(-len(labels) // fits)
    if axis == "x":
        ax.set_xticks(range(0, len(labels), step), labels[::step], fontsize=7, rotation=90 if upright else 0)
    else:
        ax.set_yticks(range(0, len(labels), step), labels[::step], fontsize=7)


def heatmap(ax, matrix: np.ndarray, rows: Sequence, cols: Sequence, *, title: str, xlabel: str, ylabel: str,
            vmin: float | None = 0.0, vmax: float | None = 1.0, separators: Sequence[float] = (), **style):
    """`matrix` with rows (labelled `rows`, bottom up) and columns (`cols`), a colour bar, each
    value printed on a small matrix, and lines at `separators` (between runs' blocks)."""
    ax = new_axes(ax, matrix_size(matrix.shape))
    style = {"cmap": "magma", "vmin": vmin, "vmax": vmax, **style}
    image = ax.imshow(matrix, origin="lower", aspect="auto", **style)
    ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    _ticks(ax, "x", cols)
    _ticks(ax, "y", rows)
    width, height = _inches(ax)
    if matrix.size <= ANNOTATED_CELLS and min(width / matrix.shape[1], height / matrix.shape[0]) >= 0.4:
        for (i, j), value in np.ndenumerate(matrix):
            light = np.isfinite(value) and image.norm(value) >= 0.6
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=6, color="black" if light else "white")
    for edge in separators:
        ax.axhline(edge, color="white", linewidth=0.8)
        ax.axvline(edge, color="white", linewidth=0.8)
    return label(ax, title, xlabel, ylabel, legend=False)


def curve(ax, x: Sequence[float], values: Sequence[float], *, band: tuple[np.ndarray, np.ndarray] | None = None,
          **style):
    """One line with markers, and a shaded (low, high) band in its colour; the Line2D."""
    line, = ax.plot(np.asarray(x), np.asarray(values), **{"marker": "o", "markersize": 3, **style})
    if band is not None:
        ax.fill_between(np.asarray(x), band[0], band[1], color=line.get_color(), alpha=0.18, linewidth=0)
    return line


def bars(ax, values: Sequence[float], *, slot: int = 0, slots: int = 1, **style):
    """Bars at 0, 1, ... (slot `slot` of `slots` side by side: several series on one Axes)."""
    width = 0.8 / slots
    return ax.bar(np.arange(len(values)) + (slot - (slots - 1) / 2) * width, values, width=width, **style)


def errorbars(ax, x: np.ndarray, values: np.ndarray, low: np.ndarray, high: np.ndarray, **style):
    """Points with a bar from low to high each (drawn as given: a bootstrap interval need not
    contain the estimate); the Line2D."""
    line = curve(ax, x, values, **style)
    ax.vlines(x, low, high, color=line.get_color(), alpha=0.8)
    ax.scatter(np.concatenate([x, x]), np.concatenate([low, high]), marker="_", color=line.get_color())
    return line


def label(ax, title: str, xlabel: str, ylabel: str, *, legend: bool = True):
    """Title, axis labels, a grid and a legend (where something is labelled); returns `ax`."""
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if legend:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    return ax


def layer_axis(layers: Sequence[int], relative: bool) -> tuple[np.ndarray, str]:
    """x positions of layers (divided by the last with `relative`: models of other depths side by
    side) and the axis label."""
    x = np.asarray(layers, dtype=np.float64)
    if relative:
        return x / (x.max() or 1), "layer / last layer"
    return x, "layer"


def quartiles(levels: np.ndarray, quantiles: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The 25% and 75% quantiles (last axis of `quantiles`), where they were computed."""
    levels = [round(float(q), 6) for q in levels]
    if 0.25 not in levels or 0.75 not in levels:
        return None
    return quantiles[..., levels.index(0.25)], quantiles[..., levels.index(0.75)]


# ---- per answer type: what each `plot` method draws -----------------------------------------
def layer_matrix(ax, matrix: np.ndarray, provenance, layers_a, layers_b, title: str, *,
                 vmin: float | None = 0.0, vmax: float | None = 1.0, **style):
    """A layers_a x layers_b matrix between run A (rows) and run B (columns), named by the runs."""

    name_a, name_b = pair_names(provenance)
    return heatmap(ax, matrix, layers_a, layers_b, title=title, xlabel=f"layer of {name_b}",
                   ylabel=f"layer of {name_a}", vmin=vmin, vmax=vmax, **style)


def to_last(ax, matrix: np.ndarray, provenance, layers_a, name: str, *, band=None, label_text: str | None = None,
            **style):
    """Each layer of A against B's last layer given (the last column), optionally with a band."""

    ax = new_axes(ax)
    curve(ax, layers_a, matrix[:, -1], band=band, label=label_text or f"{name} to the last layer", **style)
    return label(ax, f"{pair_names(provenance)[0]}: similarity to the last layer", "layer", "similarity")


def block_matrix(ax, matrix: np.ndarray, block_run: np.ndarray, block_layer: np.ndarray, provenance, name: str, *,
                 vmin: float | None, vmax: float | None, **style):
    """Every layer of every run against every other: blocks by run, ticks run:layer."""

    runs = [short_name(provenance.run_name(i)) for i in range(len(provenance.run_keys))]
    ticks = [f"{runs[r] if r < len(runs) else r}:{layer}" for r, layer in zip(block_run, block_layer)]
    edges = [i - 0.5 for i in range(1, len(block_run)) if block_run[i] != block_run[i - 1]]
    return heatmap(ax, matrix, ticks, ticks, title=f"{name} over every layer of {len(runs)} runs",
                   xlabel="run:layer", ylabel="run:layer", vmin=vmin, vmax=vmax, separators=edges, **style)


def per_layer(ax, layers, values, provenance, name: str, *, band=None, label_text: str | None = None,
              relative: bool = False, **style):
    """One value per layer of a run (with a band where there is one)."""

    ax = new_axes(ax)
    x, xlabel = layer_axis(layers, relative)
    curve(ax, x, values, band=band, label=label_text or short_name(provenance.run_name(0)), **style)
    return label(ax, f"{name} per layer", xlabel, name)


def lens(ax, result, show: str, label_text: str | None, relative: bool, **style):

    ax = new_axes(ax)
    name = label_text or short_name(result.provenance.run_name(0))
    layers = np.arange(len(result.accuracy))
    if show == "accuracy":
        x, xlabel = layer_axis(layers, relative)
        line = curve(ax, x, result.accuracy, label=name, **style)
        if 0 <= result.effective_depth_relative < len(x):
            ax.axvline(x[result.effective_depth_relative], color=line.get_color(), linestyle=":", linewidth=1)
        ax.set_ylim(0, 1)
        epsilon = result.provenance.options.get("epsilon")
        where = f" (dotted: {epsilon}-effective depth, relative)" if epsilon is not None else ""
        return label(ax, f"logit-lens accuracy per layer{where}", xlabel, "accuracy")
    if show == "saturation":
        bars(ax, result.saturation_counts, label=name, **style)
        return label(ax, f"saturation layer of {result.n} predictions", "layer", "predictions")
    if show == "exits":
        line = curve(ax, result.speedup, result.exit_accuracy, label=name, **style)
        for tau, x, y in zip(result.taus, result.speedup, result.exit_accuracy):
            ax.annotate(f"{tau:g}", (x, y), fontsize=6, xytext=(2, 2), textcoords="offset points",
                        color=line.get_color())
        return label(ax, "multi-exit sweep (points: confidence threshold tau)", "speed-up", "exit accuracy")
    return choose(show, ("accuracy", "saturation", "exits"))


def outliers(ax, report, show: str, **style):

    ax = new_axes(ax, PANEL_SIZE)
    x = np.arange(len(report.layers))
    _ticks(ax, "x", report.layers)
    title = f"outlier dimensions of {short_name(report.provenance.run_name(0))}"
    if show == "severity":
        curve(ax, x, report.severity, label="severity ||mean|| / ||std||", **style)
        curve(ax, x, np.maximum(report.kurtosis_max, 1e-3), marker="s", label="max excess kurtosis")
        ax.set_yscale("log")
        return label(ax, title, "layer", "")
    if show == "dimensions":
        for rank in range(report.top_ratio.shape[1]):
            ax.scatter(x, report.top_ratio[:, rank], s=12, label=f"rank {rank + 1}", **style)
            for at, dim, ratio in zip(x, report.top_dims[:, rank], report.top_ratio[:, rank]):
                if dim >= 0 and rank < 3:
                    ax.annotate(str(dim), (at, ratio), fontsize=6, xytext=(2, 2), textcoords="offset points")
        ax.set_yscale("log")
        return label(ax, f"{title}: the top dimensions (labelled)", "layer", "|mean| / std")
    return choose(show, ("severity", "dimensions"))


def intervals(ax, values: np.ndarray, interval: np.ndarray | None, provenance, layers_a, layers_b, name: str, *,
              null_band: tuple[np.ndarray, np.ndarray] | None = None, **style):
    """Per layer of A, its values over B's layers with their bootstrap intervals (and the null's
    5%-95% band of the first layer of A); without intervals, the matrix."""
    if interval is None:
        return layer_matrix(ax, values, provenance, layers_a, layers_b, name, vmin=None, **style)

    ax = new_axes(ax)
    x = np.arange(len(layers_b), dtype=np.float64)
    for k, layer in enumerate(layers_a):
        shift = 0.08 * (k - (len(layers_a) - 1) / 2)  # side by side, not on top of each other
        errorbars(ax, x + shift, values[k], interval[k, :, 0], interval[k, :, 1], label=f"A layer {layer}", **style)
    if null_band is not None:
        ax.fill_between(x, null_band[0], null_band[1], alpha=0.15, label="null 5%-95%, first A layer")
    _ticks(ax, "x", layers_b)
    level = provenance.options.get("ci")
    interval_name = f"{level:.0%} bootstrap intervals" if isinstance(level, float) else "bootstrap intervals"
    name_a, name_b = pair_names(provenance)
    return label(ax, f"{name} with {interval_name}: {name_a} vs {name_b}", f"layer of {name_b}", name)


def progression(ax, result, **style):
    ax = new_axes(ax)
    for i, layer in enumerate(result.layers):
        curve(ax, result.steps, result.values[:, i], label=f"layer {layer}", **style)
    return label(ax, f"{result.base}: {result.metric} per layer over training", "training step", result.metric)
