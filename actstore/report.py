"""Pictures and Markdown for answers: layer-by-layer heatmaps and curves (matplotlib, Agg)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def heatmap(matrix: np.ndarray, path: Path, *, title: str, xlabel: str, ylabel: str,
            xticks: Sequence[int] | None = None, yticks: Sequence[int] | None = None,
            vmin: float | None = 0.0, vmax: float | None = 1.0) -> Path:
    """Layer-by-layer matrix, rows = layers of A (ylabel), columns = layers of B (xlabel)."""
    plt = _pyplot()
    rows, cols = matrix.shape
    fig, ax = plt.subplots(figsize=(1.2 + 0.28 * max(cols, 6), 1.0 + 0.28 * max(rows, 6)), dpi=110)
    image = ax.imshow(matrix, origin="lower", cmap="magma", vmin=vmin, vmax=vmax, aspect="auto")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    xt = list(xticks) if xticks is not None else list(range(cols))
    yt = list(yticks) if yticks is not None else list(range(rows))
    step_x = max(1, cols // 16)
    step_y = max(1, rows // 16)
    ax.set_xticks(range(0, cols, step_x), [str(t) for t in xt[::step_x]], fontsize=7)
    ax.set_yticks(range(0, rows, step_y), [str(t) for t in yt[::step_y]], fontsize=7)
    if rows * cols <= 100:
        for i in range(rows):
            for j in range(cols):
                ax.text(j, i, f"{matrix[i, j]:.2f}", ha="center", va="center", fontsize=6,
                        color="white" if matrix[i, j] < 0.6 else "black")
    return _save(plt, fig, path)


def curves(series: dict[str, np.ndarray], path: Path, *, title: str, xlabel: str, ylabel: str,
           ylim: tuple[float, float] | None = None, bands: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
           x: np.ndarray | None = None) -> Path:
    """One line per named series over layers (or over `x`, e.g. training steps), with optional
    shaded (low, high) bands."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=110)
    for name, values in series.items():
        xs = np.arange(len(values)) if x is None else np.asarray(x)
        ax.plot(xs, values, marker="o", markersize=3, label=name)
        if bands and name in bands:
            low, high = bands[name]
            ax.fill_between(xs, low, high, alpha=0.2)
    if ylim:
        ax.set_ylim(*ylim)
    ax.grid(alpha=0.3)
    return _finish(plt, fig, ax, path, title, xlabel, ylabel)


def bars(counts: dict[str, np.ndarray], path: Path, *, title: str, xlabel: str, ylabel: str) -> Path:
    """Grouped bars per layer (e.g. saturation-layer histograms of several models)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=110)
    width = 0.8 / max(1, len(counts))
    for k, (name, values) in enumerate(counts.items()):
        ax.bar(np.arange(len(values)) + k * width, values, width=width, label=name)
    return _finish(plt, fig, ax, path, title, xlabel, ylabel)



def _save(plt, fig, path: Path) -> Path:
    """Lay out, write (making the folder) and close one figure."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path

def _finish(plt, fig, ax, path: Path, title: str, xlabel: str, ylabel: str) -> Path:
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    return _save(plt, fig, path)


def markdown_matrix(matrix: np.ndarray, row_labels: Sequence, col_labels: Sequence, digits: int = 2) -> str:
    head = "| | " + " | ".join(str(c) for c in col_labels) + " |"
    rule = "|---" * (len(col_labels) + 1) + "|"
    body = ["| " + str(r) + " | " + " | ".join(f"{v:.{digits}f}" for v in row) + " |"
            for r, row in zip(row_labels, matrix)]
    return "\n".join([head, rule, *body])


def errorbars(series: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], path: Path, *, title: str,
              xlabel: str, ylabel: str, xticks: Sequence[int] | None = None,
              bands: dict[str, tuple[np.ndarray, np.ndarray]] | None = None) -> Path:
    """One line per named series (values, low, high) with a bar from low to high at each point
    (drawn as it is: a bootstrap interval need not contain the estimate), and optional shaded
    (low, high) bands (e.g. a permutation null's quantiles)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=110)
    for k, (name, (values, low, high)) in enumerate(series.items()):
        xs = np.arange(len(values)) + 0.08 * (k - (len(series) - 1) / 2)  # side by side, not on top
        (line,) = ax.plot(xs, values, marker="o", markersize=3, label=name)
        ax.vlines(xs, low, high, color=line.get_color(), alpha=0.8)
        ax.scatter(np.concatenate([xs, xs]), np.concatenate([low, high]), marker="_", color=line.get_color())
    for name, (low, high) in (bands or {}).items():
        ax.fill_between(np.arange(len(low)), low, high, alpha=0.15, label=name)
    if xticks is not None:
        step = max(1, len(xticks) // 16)
        ax.set_xticks(range(0, len(xticks), step), [str(t) for t in list(xticks)[::step]], fontsize=7)
    ax.grid(alpha=0.3)
    return _finish(plt, fig, ax, path, title, xlabel, ylabel)


def outlier_panels(layers: Sequence[int], severity: np.ndarray, top_dims: np.ndarray, top_ratio: np.ndarray,
                   kurtosis_max: np.ndarray, path: Path, *, title: str) -> Path:
    """Two panels over layers: severity ||mean||/||std|| and max excess kurtosis (log scale), and
    the top dimensions by |mean|/std (each point labelled with its dimension)."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), dpi=110, sharex=True)
    xs = np.arange(len(layers))
    top.plot(xs, severity, marker="o", markersize=3, label="severity ||mean|| / ||std||")
    top.plot(xs, np.maximum(kurtosis_max, 1e-3), marker="s", markersize=3, label="max excess kurtosis")
    top.set_yscale("log")
    top.grid(alpha=0.3)
    top.legend(fontsize=8)
    top.set_title(title, fontsize=10)
    for rank in range(top_ratio.shape[1]):
        bottom.scatter(xs, top_ratio[:, rank], s=12, label=f"rank {rank + 1}")
        for x, dim, ratio in zip(xs, top_dims[:, rank], top_ratio[:, rank]):
            if dim >= 0 and rank < 3:
                bottom.annotate(str(dim), (x, ratio), fontsize=6, xytext=(2, 2), textcoords="offset points")
    bottom.set_yscale("log")
    bottom.set_ylabel("|mean| / std of the top dimensions")
    bottom.set_xlabel("layer")
    step = max(1, len(layers) // 16)
    bottom.set_xticks(xs[::step], [str(layer) for layer in list(layers)[::step]], fontsize=7)
    bottom.grid(alpha=0.3)
    return _save(plt, fig, path)
