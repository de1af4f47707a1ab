"""The query engine: the parts every metric query shares, and one planner per metric family.

``QueryEngine`` only composes: run checks (`runs`), the result cache (`results`), the Ray
executor (`executor`) and CKA sizing (`tiling`), handed to the planners (`planners/`), which it
holds as attributes (`similarity`, `measures`, `entropy`, `depth`, `stitching`, `diagnostics`).
`planner(family)` is the method that answers a registered metric's typed query (the servicer
resolves the call into `requests.QUERY_TYPES[family]`). The matrix job uses the same parts.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from actstore.config import Settings
from actstore.server.executor import Executor
from actstore.server.planners import QueryParts
from actstore.server.planners.depth import DepthPlanner
from actstore.server.planners.diagnostics import DiagnosticsPlanner
from actstore.server.planners.entropy import EntropyPlanner
from actstore.server.planners.measures import MeasurePlanner
from actstore.server.planners.similarity import SimilarityPlanner
from actstore.server.planners.stitching import StitchPlanner
from actstore.server.results import MetricResult, ResultCache
from actstore.server.runs import RunChecks
from actstore.server.tiling import CkaSizing
from actstore.store.catalog import Catalog
from actstore.store.handle import StoreHandle


class QueryEngine:
    def __init__(self, catalog: Catalog, store: StoreHandle, settings: Settings,
                 release_idle_gpus: Callable[[], None] = lambda: None) -> None:
        arrays = store.open()
        executor = Executor(store, settings, release_idle_gpus)
        self.parts = QueryParts(
            catalog=catalog,
            arrays=arrays,
            checks=RunChecks(catalog, arrays, settings),
            results=ResultCache(catalog, settings.result_cache_bytes),
            executor=executor,
            sizing=CkaSizing(settings, executor),
        )
        self._generations = itertools.count(1)
        self._generation = 0
        parts = self.parts  # one planner per family, each over the same parts
        self.similarity, self.measures, self.entropy = (SimilarityPlanner(parts), MeasurePlanner(parts),
                                                        EntropyPlanner(parts))
        self.depth, self.stitching, self.diagnostics = (DepthPlanner(parts), StitchPlanner(parts),
                                                        DiagnosticsPlanner(parts))

    def planner(self, query: str) -> Callable[[Any], MetricResult]:
        """The planner method that answers a typed query of family `query` (`Measure.query`)."""
        return {"measure": self.measures.measure, "similarity": self.similarity.similarity,
                "entropy": self.entropy.entropy, "residual_norm": self.depth.residual_norm, "lens": self.depth.lens,
                "neural_collapse": self.depth.neural_collapse, "stitch": self.stitching.stitch}[query]

    def result(self, result_key: str) -> MetricResult:
        return self.parts.results.result(result_key)

    def forget(self) -> None:
        """Drop what is remembered about runs and results (a run was deleted), and start a new
        generation of the query state (`is_current`)."""
        self.parts.checks.forget()
        self.parts.results.forget()
        self._generation = next(self._generations)

    def is_current(self, generation: int, result: MetricResult) -> bool:
        """Whether an answer given in `generation` is still the answer: nothing was forgotten since
        (no run deleted or repaired, no result collected) and the result cache still holds it."""
        return generation == self._generation and self.parts.results.holds(result)

    def current_generation(self) -> int:
        return self._generation
