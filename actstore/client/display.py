"""How answers and records show themselves: a short `repr` for a terminal, and in Jupyter an HTML
summary (`_repr_html_`) of what was asked, the runs by model and dataset names, cached or computed
and how long, the bound or interval where there is one, with a small heatmap for a matrix.

Answers mix in `Shown` and say what they are through `summary()`; records (`RunInfo`,
`ModelInfo`, ...) mix in `Tabled`, and `frames.Listing` shows its records as one table.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import io
import json
from dataclasses import dataclass, field
from typing import Any

from actstore.client.plots import figure as new_figure
from actstore.errors import FailedPrecondition
from actstore.records import Provenance, RunName

THUMBNAIL_INCHES = (4.2, 3.4)
THUMBNAIL_DPI = 72
OPTION_TEXT = 60  # characters of an option's value shown before it is cut


def metric_bounds(metric: str) -> tuple[float | None, float | None]:
    """The registered bounds of a metric's values, by its identifier as an answer names it (the
    parameters filled in: shape_metric-alpha=0.5-...); (None, None) for one the registry lacks."""
    import re

    from actstore import measures
    from actstore.errors import ActStoreError

    try:
        return measures.get(metric).bounds
    except ActStoreError:
        pass
    for spec in measures.measures():
        if re.fullmatch(re.sub(r"\\\{\w+\\\}", ".+", re.escape(spec.identifier)), metric):
            return spec.bounds
    return None, None


def bounds_text(bounds: tuple[float | None, float | None]) -> str:
    low, high = ("-inf" if bounds[0] is None else f"{bounds[0]:g}"), ("inf" if bounds[1] is None else f"{bounds[1]:g}")
    return f"[{low}, {high}]"


def layer_span(layers) -> str:
    """`0..6` for consecutive layers, else the list."""
    layers = [int(layer) for layer in layers]
    if len(layers) > 2 and layers == list(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}..{layers[-1]}"
    return ",".join(map(str, layers))


def value_range(values) -> str:
    import numpy as np

    values = np.asarray(values, dtype=np.float64)
    finite = values[np.isfinite(values)]
    return "no finite values" if not finite.size else f"{finite.min():.3g}..{finite.max():.3g}"


@dataclass
class Summary:
    """What an answer says of itself: its kind and what it holds (`title`, e.g. "linear CKA, 7 x 7
    layers"), facts as (name, value) pairs (n, ranges, the interval or bound), and its provenance."""

    title: str
    provenance: Provenance | None = None
    facts: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    pairwise: bool = True  # two runs are A (rows) and B (columns); else runs 0, 1, ... (a matrix of blocks)

    def text(self, kind: str) -> str:
        parts = [self.title]
        if self.provenance is not None and self.provenance.run_keys:
            parts.append("runs " + ", ".join(run.label for run in _runs(self.provenance)))
        parts += [f"{name} {value}" for name, value in self.facts]
        if self.provenance is not None:
            parts.append(_freshness(self.provenance))
        if self.notes:
            parts.append(f"{len(self.notes)} note(s)")
        return f"{kind}({'; '.join(parts)})"

    def html(self, kind: str, image: str | None = None) -> str:
        rows = []
        if self.provenance is not None:
            asked = _asked(self.provenance)
            rows.append(("asked", f"<code>{html.escape(self.provenance.metric)}</code>"
                                  + (f" {html.escape(asked)}" if asked else "")))
            for role, run in zip(_roles(self.provenance, self.pairwise), _runs(self.provenance)):
                what = ", ".join(part for part in (run.pooling, run.site) if part)
                rows.append((role, f"<b>{html.escape(run.model or '?')}</b> on <b>{html.escape(run.dataset or '?')}</b>"
                                   + (f" ({html.escape(what)})" if what else "")
                                   + f" <code>{html.escape(run.run_key[:12])}</code>"))
            rows.append(("answer", html.escape(_freshness(self.provenance))))
        rows += [(name, html.escape(value)) for name, value in self.facts]
        rows += [("note", html.escape(note)) for note in self.notes]
        body = "".join(f"<tr><th style='text-align:left;padding-right:1em'>{html.escape(name)}</th>"
                       f"<td style='text-align:left'>{value}</td></tr>" for name, value in rows)
        picture = f"<img src='data:image/png;base64,{image}' alt='{html.escape(self.title)}'/>" if image else ""
        return (f"<div class='actstore-answer'><p><b>{html.escape(kind)}</b>: {html.escape(self.title)}</p>"
                f"<div style='display:flex;gap:1em;align-items:flex-start'><table>{body}</table>{picture}</div></div>")


def _runs(provenance: Provenance) -> list[RunName]:
    return [provenance.run_name(i) for i in range(len(provenance.run_keys))]


def _roles(provenance: Provenance, pairwise: bool) -> list[str]:
    count = len(provenance.run_keys)
    if count == 1:
        return ["run"]
    if count == 2 and pairwise:
        return ["run A (rows)", "run B (columns)"]
    return [f"run {i}" for i in range(count)]


def _freshness(provenance: Provenance) -> str:
    if provenance.cached:
        return f"cached (its computation took {provenance.seconds:.2f} s)"
    return f"computed in {provenance.seconds:.2f} s"


def _asked(provenance: Provenance) -> str:
    """The options the answer was asked with, layer lists as spans, long values cut."""
    parts = []
    for name, value in provenance.options.items():
        if name.startswith("layers") and isinstance(value, list):
            text = layer_span(value)
        else:
            text = value if isinstance(value, str) else json.dumps(value)
        parts.append(f"{name}={text if len(text) <= OPTION_TEXT else text[:OPTION_TEXT] + '...'}")
    return ", ".join(parts)


def thumbnail(draw) -> str | None:
    """`draw(ax)` on a small figure, as base64 PNG; None without matplotlib."""
    try:
        figure = new_figure(THUMBNAIL_INCHES, THUMBNAIL_DPI)
    except FailedPrecondition:
        return None
    draw(figure.subplots())
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return base64.b64encode(buffer.getvalue()).decode()


class Shown:
    """A short `repr` and an HTML summary from the answer's `summary()`; a matrix answer (`matrix`
    true) draws its `plot` as a thumbnail beside it."""

    matrix = False

    def summary(self) -> Summary:
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.summary().text(type(self).__name__)

    def _repr_html_(self) -> str:
        image = thumbnail(self.plot) if self.matrix else None
        return self.summary().html(type(self).__name__, image)


def cell(name: str, value: Any) -> str:
    """A record's field as table text: keys and digests cut to 12 characters, lists joined."""
    if isinstance(value, str) and (name.endswith(("digest", "key")) or name == "target") and len(value) > 12:
        return value[:12]
    if isinstance(value, (list, tuple)):
        if value and dataclasses.is_dataclass(value[0]):
            return f"{len(value)} entries"
        return ", ".join(map(str, value))
    if isinstance(value, dict):
        text = json.dumps(value)
        return text if len(text) <= OPTION_TEXT else text[:OPTION_TEXT] + "..."
    return str(value)


def table(records: list) -> str:
    """Records of one kind as an HTML table, a row each."""
    if not records:
        return "<p>(none)</p>"
    names = [f.name for f in dataclasses.fields(records[0])]
    head = "".join(f"<th>{html.escape(name)}</th>" for name in names)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell(name, getattr(r, name)))}</td>" for name in names)
                   + "</tr>" for r in records)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


class Tabled:
    """A record (a dataclass) shown in Jupyter as a two-column table of its fields."""

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><th style='text-align:left'>{html.escape(f.name)}</th>"
                       f"<td style='text-align:left'>{html.escape(cell(f.name, getattr(self, f.name)))}</td></tr>"
                       for f in dataclasses.fields(self))
        return f"<p><b>{type(self).__name__}</b></p><table>{rows}</table>"
