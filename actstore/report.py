"""Pictures and Markdown as files, for the CLI's --plot, the demo's report and the experiment's
write-up. The drawing is the answers' own (`result.plot(ax)`, built on `actstore.client.plots`):
this module makes a figure (matplotlib's `Figure`, not pyplot: no backend to choose, no window),
has it drawn and writes it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from actstore.client import plots

DPI = 110


def write_plot(path: Path, draw: Callable, size: tuple[float, float] = plots.CURVE_SIZE, rows: int = 1,
               cols: int = 1, **subplots) -> Path:
    """`draw(axes)` on a new figure of `size` inches (`axes`: one Axes, or an array of rows x
    cols), laid out and written to `path` (its folder made)."""
    figure = plots.figure(size, DPI)
    draw(figure.subplots(rows, cols, **subplots))
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    return path


def write_matrix_plot(path: Path, result, matrix: np.ndarray, **options) -> Path:
    """`result.plot(ax, **options)` of a matrix answer, on a figure sized to `matrix`."""
    return write_plot(path, lambda ax: result.plot(ax, **options), plots.matrix_size(matrix.shape))


def write_outliers(path: Path, report) -> Path:
    """An outlier report's two pictures, severity above and the top dimensions below."""

    def draw(axes):
        report.plot(axes[0], show="severity")
        report.plot(axes[1], show="dimensions")

    return write_plot(path, draw, (7.0, 6.0), rows=2, sharex=True)


def write_probes(path: Path, results: Sequence, labels: Sequence[str], *, relative: bool = True) -> Path:
    """`probes.plot_probes`'s figure: the probes' scores, and a panel per `against` metric."""
    from actstore.client.probes import draw_probes

    panels = 1 + len(results[0].against)
    return write_plot(path, lambda axes: draw_probes(axes, results, labels, relative=relative), (5.2 * panels, 4.0),
                      cols=panels, squeeze=False)


def markdown_matrix(matrix: np.ndarray, row_labels: Sequence, col_labels: Sequence, digits: int = 2,
                    notation: str = "f") -> str:
    """A markdown table of `matrix`, each value with `digits` digits in `notation` ("f" fixed, "e"
    scientific: for values far below 1, such as error bounds)."""
    head = "| | " + " | ".join(str(c) for c in col_labels) + " |"
    rule = "|---" * (len(col_labels) + 1) + "|"
    body = ["| " + str(r) + " | " + " | ".join(f"{v:.{digits}{notation}}" for v in row) + " |"
            for r, row in zip(row_labels, matrix)]
    return "\n".join([head, rule, *body])
