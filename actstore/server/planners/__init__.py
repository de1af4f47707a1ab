"""Per-family query planners: validate a query's options, plan its map tasks, reduce, cache.

Each planner works through the same parts (``QueryParts``): the run checks, the result cache,
the Ray executor and the CKA sizing; none reaches into another planner.
"""

from __future__ import annotations

from dataclasses import dataclass

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


class Planner:
    """A family's planner: the shared parts as attributes, nothing of its own state."""

    def __init__(self, parts: QueryParts) -> None:
        self.parts = parts
        self.catalog = parts.catalog
        self.arrays = parts.arrays
        self.checks = parts.checks
        self.results = parts.results
        self.executor = parts.executor
        self.sizing = parts.sizing
