"""The measure registry: every similarity measure is one registered `Measure` spec.

A spec says everything the rest of the system derives: the similarity-repository identifier
(Cloos et al. 2024, nacloos/similarity-repository; `{alpha}`-style placeholders are filled from
options), a one-line summary and its source, score or distance and the bounds, what it needs from
the store (`MOMENTS`: streamed centred second moments, any n, O(d^2) memory; `ROWS`: the layer's
rows in memory, O(n^2)), the options it takes (`actstore.options.Option`: type, default, limits),
the factory that builds its computation (a dotted path, loaded only where it runs, so the client
never imports the numerics), and a definition version that goes into the result key.

From the registry come the CLI's `similarity` help and flags, `cka-matrix --measure`'s choices,
`actstore measures` (the docs' table), the client's option checks, the server's dispatch, the
result's cache key and provenance.

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

__all__ = ["ENTRY_POINT_GROUP", "MOMENTS", "ROWS", "Measure", "get", "measures", "register"]

log = logging.getLogger(__name__)

MOMENTS = "moments"  # streamed centred second moments of every block pair (feature space)
ROWS = "rows"  # each layer's rows in memory: an n x n prepared form per layer
ENTRY_POINT_GROUP = "actstore.measures"


@dataclass(frozen=True)
class Measure:
    """One measure. `fills` maps a placeholder of the identifier to the option whose value fills
    it (`{"alpha": "alpha"}` makes shape_metric-alpha=0.5-distance=angular); `whitens(options)`
    says whether the measure fits a linear map of the whole space (whitening, regression), so it
    is 1 by construction when n - 1 <= width."""

    identifier: str
    summary: str
    needs: str
    factory: str  # "module:attribute", called with `arguments` and the resolved options as keywords
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

    def __post_init__(self) -> None:
        if self.needs not in (MOMENTS, ROWS):
            raise ValueError(f"{self.identifier}: needs must be {MOMENTS!r} or {ROWS!r}, got {self.needs!r}")
        names = {option.name for option in self.options}
        if not set(self.fills.values()) <= names:
            raise ValueError(f"{self.identifier}: fills {dict(self.fills)} name options it does not take")
        if ":" not in self.factory:
            raise ValueError(f"{self.identifier}: factory must be 'module:attribute', got {self.factory!r}")

    def resolve(self, given: Mapping[str, Any], limits: Any = None) -> dict[str, Any]:
        """The measure's options, each checked by its Option and defaulted; an option the measure
        does not take is refused (it would silently change nothing)."""
        known = {option.name: option for option in self.options}
        unknown = sorted(set(given) - set(known))
        if unknown:
            takes = ", ".join(known) or "no options"
            raise InvalidArgument(f"{self.identifier} does not take {', '.join(unknown)} (it takes {takes})")
        resolved = {}
        for name, option in known.items():
            value = given.get(name)
            resolved[name] = option.default if value is None else option.check(value, limits)
        return resolved

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


def measures(needs: str | None = None) -> list[Measure]:
    """Every registered spec (or those that need `needs`): the streamed ones first, each kind in
    registration order."""
    _load()
    found = [m for m in _REGISTRY.values() if needs is None or m.needs == needs]
    return sorted(found, key=lambda m: m.needs != MOMENTS)


def get(identifier: str, needs: str | None = None) -> Measure:
    """The spec of `identifier`; InvalidArgument listing what there is (of `needs`, if given)."""
    _load()
    found = _REGISTRY.get(identifier)
    if found is None or (needs is not None and found.needs != needs):
        known = ", ".join(m.identifier for m in measures(needs))
        raise InvalidArgument(f"measure {identifier!r} is not one of {known} (actstore measures lists them)")
    return found
