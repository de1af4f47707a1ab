"""The metric registry: every metric the query service computes is one registered `Measure` spec.

A spec says everything the rest of the system derives: the identifier (the similarity repository's,
Cloos et al. 2024, nacloos/similarity-repository, where it has one; `{alpha}`-style placeholders
are filled from options), a one-line summary and its source, score or distance and the bounds, what
it needs from the store (`NEEDS`: streamed second moments, Gram strips, row pairs, a layer's rows,
the model's head, a fitted map), the query family that serves it (`query`: "measure" for the
registry's own, else the name of a family the server registers, `server.planners.family`), how
many runs it compares, for a one-run metric the answer's array that holds its value per layer
(`curve`: what "Layer by Layer"-style comparisons correlate), the options it takes
(`actstore.options.Option`: type, default, limits), and for the registry's own measures
(`MOMENTS`, `ROWS`) the factory that builds the computation (a dotted path, loaded only where it
runs, so the client never imports the numerics) and a definition version that goes into the
result key.

From the registry come the CLI's `similarity` help and flags, `cka-matrix --measure`'s choices,
`actstore measures` (the docs' table of every metric), the client's option checks (`Client.metric`,
`Client.measure`), the server's dispatch of the generic `Measure` RPC (by `query`), the result's
cache key and provenance. CKA, COS, the entropy family, the logit lens, NC1, the residual norm and
stitching are specs of `families.py` served by their query families' planners; their older RPCs
(Similarity, Entropy, Lens, ...) are wire-compatible doors to the same typed queries.

    register(Measure("nbs-score", "normalized Bures similarity", MOMENTS, "pkg.module:factory", ...))
    get("procrustes-distance=angular")         -> the spec (InvalidArgument naming the known ones)
    measures(needs=MOMENTS)                    -> the streamed ones, in registration order

Built-in measures are the modules of this package, each registering its specs when imported; a
new measure is one new module here. Third-party packages register theirs through the entry point
group `actstore.measures` (an entry point names a module, imported like a built-in one), as zarr
loads codecs. A factory takes the measure's resolved options as keywords and returns an object
with `prepare` and `compare` (`metrics.similarity.MomentMeasure` for MOMENTS: compare(prepared_a,
prepared_b, C_ab); `PairwiseMeasure` for ROWS: compare(prepared_a, prepared_b)).

Imports only errors and options: the thin client uses it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import pkgutil
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from actstore.errors import InvalidArgument
from actstore.options import Option

__all__ = ["ENTRY_POINT_GROUP", "FIT", "GRAMS", "HEAD", "LAYER", "MOMENTS", "NEEDS", "PAIRS", "ROWS",
           "Measure", "get", "measures", "register"]

log = logging.getLogger(__name__)

MOMENTS = "moments"  # streamed centred second moments of every block pair (feature space)
ROWS = "rows"  # each layer's rows in memory: an n x n prepared form per layer
GRAMS = "grams"  # centred Gram strips over tiles of samples, streamed (CKA)
PAIRS = "pairs"  # both runs' rows side by side, sample by sample (COS)
LAYER = "layer"  # one run's rows of a layer (or two adjacent layers) in memory
HEAD = "head"  # one run's rows through its model's stored head (final norm + classifier)
FIT = "fit"  # a map fitted from run A's rows into run B's model and scored on held-out rows
NEEDS = {MOMENTS: "streamed second moments: any n, memory O(d^2)",
         ROWS: "in memory: n up to the server's matrix limit, O(n^2)",
         GRAMS: "Gram strips over tiles of samples: any n, memory O(tile^2)",
         PAIRS: "both runs' rows, sample by sample",
         LAYER: "one run's rows of each layer",
         HEAD: "one run's rows through its model's stored head",
         FIT: "a map fitted from run A's rows into run B's model"}
ENTRY_POINT_GROUP = "actstore.measures"


@dataclass(frozen=True)
class Measure:
    """One metric. `fills` maps a placeholder of the identifier to the option whose value fills
    it (`{"alpha": "alpha"}` makes shape_metric-alpha=0.5-distance=angular); `whitens(options)`
    says whether the measure fits a linear map of the whole space (whitening, regression), so it
    is 1 by construction when n - 1 <= width. `query` names the family that serves it ("measure":
    the spec's factory; any other: the server's family of that name); `runs` how many runs it
    takes (1: run A's layers; 2: A's against B's, B defaulting to A); `curve`, for a one-run
    metric, the array of its answer (asked for every layer) whose entry l is layer l's value."""

    identifier: str
    summary: str
    needs: str
    factory: str = ""  # "module:attribute" (query "measure"), called with `arguments` and the options as keywords
    query: str = "measure"
    runs: int = 2
    distance: bool = False
    bounds: tuple[float | None, float | None] = (None, None)  # None: unbounded on that side
    options: tuple[Option, ...] = ()
    fills: Mapping[str, str] = field(default_factory=dict)
    arguments: Mapping[str, Any] = field(default_factory=dict)  # fixed keywords of the factory
    symmetric: bool = True
    source: str = ""
    version: int = 1  # the definition version in the result key: raise it when the formula changes
    whitening: str | None = None  # an option; None: never whitens, "" always, a name: whitens unless it is 1
    below_rows: tuple[str, ...] = ()  # options that must be below the number of samples (k neighbours)
    curve: str = ""  # one-run metrics: the answer's per-layer array ("" : none)

    def __post_init__(self) -> None:
        if self.needs not in NEEDS:
            raise ValueError(f"{self.identifier}: needs must be one of {', '.join(NEEDS)}, got {self.needs!r}")
        if not self.query:
            raise ValueError(f"{self.identifier}: name the query family that serves it")
        if self.query == "measure" and self.needs not in (MOMENTS, ROWS):
            raise ValueError(f"{self.identifier}: the registry's own measures (query 'measure') need {MOMENTS} "
                             f"or {ROWS}")
        if self.runs not in (1, 2):
            raise ValueError(f"{self.identifier}: runs must be 1 or 2, got {self.runs}")
        if self.curve and self.runs != 1:
            raise ValueError(f"{self.identifier}: only a one-run metric has a per-layer curve")
        names = {option.name for option in self.options}
        if not set(self.fills.values()) <= names:
            raise ValueError(f"{self.identifier}: fills {dict(self.fills)} name options it does not take")
        if self.query == "measure" and ":" not in self.factory:
            raise ValueError(f"{self.identifier}: factory must be 'module:attribute', got {self.factory!r}")

    def refuse_unknown(self, given: Mapping[str, Any]) -> None:
        """InvalidArgument for an option the metric does not take (it would silently change nothing)."""
        unknown = sorted(set(given) - {option.name for option in self.options})
        if unknown:
            takes = ", ".join(option.name for option in self.options) or "no options"
            raise InvalidArgument(f"{self.identifier} does not take {', '.join(unknown)} (it takes {takes})")

    def check(self, given: Mapping[str, Any], limits: Any = None) -> dict[str, Any]:
        """The options given (None: not given, dropped), each checked by its Option; an option the
        metric does not take is refused."""
        self.refuse_unknown(given)
        known = {option.name: option for option in self.options}
        return {name: known[name].check(value, limits) for name, value in given.items() if value is not None}

    def resolve(self, given: Mapping[str, Any], limits: Any = None) -> dict[str, Any]:
        """`check`, and every option not given at its default."""
        checked = self.check(given, limits)
        return {option.name: checked.get(option.name, option.default) for option in self.options}

    def taken(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The values of `given` this measure takes (None: not given): for messages and keywords
        that carry every measure's options (the legacy alpha, sigma_fraction, k), whose others were
        never read."""
        takes = {option.name for option in self.options}
        return {name: value for name, value in given.items() if name in takes and value is not None}

    def filled(self, options: Mapping[str, Any]) -> str:
        """The identifier with its placeholders filled (`shape_metric-alpha=0.5-distance=angular`)."""
        name = self.identifier
        for placeholder, option in self.fills.items():
            name = name.replace("{" + placeholder + "}", f"{options[option]:g}")
        return name

    def whitens(self, options: Mapping[str, Any]) -> bool:
        if self.whitening is None:
            return False
        return self.whitening == "" or options[self.whitening] != 1

    def build(self, options: Mapping[str, Any]) -> Any:
        """The computation (loads the factory's module: numerics, server side only)."""
        if self.query != "measure":
            raise ValueError(f"{self.identifier} is computed by the {self.query} planner, not by a factory")
        module, _, attribute = self.factory.partition(":")
        return getattr(importlib.import_module(module), attribute)(**self.arguments, **options)


_REGISTRY: dict[str, Measure] = {}
_LOADED = False
_LOCK = threading.RLock()


def register(measure: Measure) -> Measure:
    """Add a spec; an identifier registered twice is an error (two definitions of one name)."""
    with _LOCK:
        if measure.identifier in _REGISTRY and _REGISTRY[measure.identifier] != measure:
            raise ValueError(f"measure {measure.identifier!r} is registered twice")
        _REGISTRY[measure.identifier] = measure
    return measure


def _load() -> None:
    """Import this package's modules, then the entry points' (once)."""
    global _LOADED
    with _LOCK:
        if _LOADED:
            return
        _LOADED = True
        for module in pkgutil.iter_modules(__path__):
            importlib.import_module(f"{__name__}.{module.name}")
        for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                point.load()
            except Exception as exc:  # a broken plug-in must not take the built-in measures down
                log.warning("measure entry point %s (%s) failed to load: %s", point.name, point.value, exc)


def measures(needs: str | None = None, query: str | None = "measure") -> list[Measure]:
    """The registered specs that need `needs` and are served by `query` (None: any), grouped by
    what they need in `NEEDS`'s order, each group in registration order. By default the
    registry's own measures (`actstore similarity`'s); `query=None` for every metric."""
    _load()
    found = [m for m in _REGISTRY.values()
             if (needs is None or m.needs == needs) and (query is None or m.query == query)]
    order = list(NEEDS)
    return sorted(found, key=lambda m: order.index(m.needs))


def get(identifier: str, needs: str | None = None, query: str | None = None) -> Measure:
    """The spec of `identifier`; InvalidArgument listing what there is (of `needs` and `query`, if
    given)."""
    _load()
    found = _REGISTRY.get(identifier)
    if found is None or (needs is not None and found.needs != needs) or (query is not None and found.query != query):
        known = ", ".join(m.identifier for m in measures(needs, query))
        kind = "measure" if query == "measure" else "metric"
        raise InvalidArgument(f"{kind} {identifier!r} is not one of {known} (actstore measures lists them)")
    return found
