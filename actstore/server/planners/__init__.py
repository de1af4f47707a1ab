"""Per-family query planners: validate a query's options, plan its map tasks, reduce, cache.

Each planner works through the same parts (``QueryParts``): the run checks, the result cache,
the Ray executor, the CKA sizing, and ``answer``, the query engine's one door for a metric call
(a family whose answer includes other metrics' asks through it); none reaches into another planner.

A query family is one registered ``Family``: the name a metric's spec gives (`Measure.query`), its
typed query (a class whose ``resolve(checks, call)`` checks a `requests.MetricCall` once, at the
boundary) and the planner method that answers it. Each planner module registers its families
when imported; the query engine and the generic `Measure` RPC find them here (``family``), so a
new family is one new module of this package, plus its specs and numerics.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from actstore.server.executor import Executor
from actstore.server.results import ResultCache
from actstore.server.runs import RunChecks
from actstore.server.tiling import CkaSizing
from actstore.store.array_store import ArrayStore
from actstore.store.catalog import Catalog


@dataclass(frozen=True)
class QueryParts:
    catalog: Catalog
    arrays: ArrayStore
    checks: RunChecks
    results: ResultCache
    executor: Executor
    sizing: CkaSizing
    answer: Callable[[Any], Any]  # the engine's answer to a `requests.MetricCall`: a `MetricResult`


class Planner:
    """A family's planner: it holds the shared `parts` (`self.parts.checks`, ...), nothing of its own state."""

    def __init__(self, parts: QueryParts) -> None:
        self.parts = parts


@dataclass(frozen=True)
class Family:
    """A query family: `name` (what `Measure.query` says), `query` (the typed query: a class with
    `resolve(checks, call)`), `planner` (the Planner class) and `method` (its method that answers)."""

    name: str
    query: type
    planner: type[Planner]
    method: str


_FAMILIES: dict[str, Family] = {}
_LOADED = False
_LOCK = threading.RLock()


def register_family(family: Family) -> Family:
    with _LOCK:
        if _FAMILIES.get(family.name, family) != family:
            raise ValueError(f"query family {family.name!r} is registered twice")
        _FAMILIES[family.name] = family
    return family


def _load() -> None:
    global _LOADED
    with _LOCK:
        if not _LOADED:
            _LOADED = True
            for module in pkgutil.iter_modules(__path__):
                importlib.import_module(f"{__name__}.{module.name}")


def families() -> list[Family]:
    """Every registered family, in registration order."""
    _load()
    return list(_FAMILIES.values())


def family(name: str) -> Family:
    """The family `name`; LookupError for a name no module registers (a spec naming an unknown
    family is a bug of that spec's module)."""
    _load()
    try:
        return _FAMILIES[name]
    except KeyError:
        raise LookupError(f"no query family {name!r} is registered (the families: {', '.join(_FAMILIES)})") from None
