"""The query engine: the parts every metric query shares, and one planner per metric family.

``QueryEngine`` only composes: run checks (`runs`), the result cache (`results`), the Ray
executor (`executor`) and CKA sizing (`tiling`), handed to the planners of the registered query
families (`planners.families()`), one planner object per planner class. `answer(call)` resolves a
metric call into its family's typed query and answers it (the servicers' and the planners' one
door for a metric); `planner(family)` is the method that answers a typed query. The matrix job
and the diagnostics planner use the same parts.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from actstore.config import Settings
from actstore.server.error_bounds import ErrorBounds
from actstore.server.executor import Executor
from actstore.server.planners import Planner, QueryParts, families, family
from actstore.server.requests import MetricCall
from actstore.server.results import MetricResult, ResultCache
from actstore.server.run_names import RunNames
from actstore.server.runs import RunChecks
from actstore.server.tiling import CkaSizing
from actstore.store.catalog import Catalog
from actstore.store.handle import StoreHandle


class QueryEngine:
    def __init__(self, catalog: Catalog, store: StoreHandle, settings: Settings, names: RunNames,
                 release_idle_gpus: Callable[[], None] = lambda: None) -> None:
        """`names`: the runs' names in replies, forgotten with the rest (`forget`)."""
        arrays = store.open()
        executor = Executor(store, settings, release_idle_gpus)
        self.bounds = ErrorBounds(catalog, arrays, settings.run_cache_entries)  # over lossy runs
        self.parts = QueryParts(
            catalog=catalog,
            arrays=arrays,
            checks=RunChecks(catalog, arrays, settings),
            results=ResultCache(catalog, settings.result_cache_bytes, self.bounds),
            executor=executor,
            sizing=CkaSizing(settings, executor),
            answer=self.answer,
        )
        self._generations = itertools.count(1)
        self._generation = 0
        # one planner per planner class (a class may serve several families), each over the same parts
        self._planners: dict[type, Planner] = {}
        for registered in families():
            if registered.planner not in self._planners:
                self._planners[registered.planner] = registered.planner(self.parts)
        self.names = names

    def planner(self, query: str) -> Callable[[Any], MetricResult]:
        """The planner method that answers a typed query of family `query` (`Measure.query`)."""
        registered = family(query)
        return getattr(self._planners[registered.planner], registered.method)

    def answer(self, call: MetricCall, require_bound: bool = False) -> MetricResult:
        """A metric call resolved into its family's typed query, once, and answered; with
        `require_bound`, refused before anything is computed over a lossy run whose answer this
        metric cannot bound (`ErrorBounds.require`)."""
        query = family(call.spec.query).query.resolve(self.parts.checks, call)
        if require_bound:
            runs = [self.parts.checks.committed_run(run).run_key for run in (call.run_a, call.run_b) if run]
            self.bounds.require(call.spec.identifier, runs, {"align": getattr(query, "align", "none")})
        return self.planner(call.spec.query)(query)

    def result(self, result_key: str) -> MetricResult:
        return self.parts.results.result(result_key)

    def forget(self) -> None:
        """Drop what is remembered about runs and results (a run was deleted), and start a new
        generation of the query state (`is_current`)."""
        self.parts.checks.forget()
        self.parts.results.forget()
        self.bounds.forget()
        self.names.forget()
        self._generation = next(self._generations)

    def is_current(self, generation: int, result: MetricResult) -> bool:
        """Whether an answer given in `generation` is still the answer: nothing was forgotten since
        (no run deleted or repaired, no result collected) and the result cache still holds it."""
        return generation == self._generation and self.parts.results.holds(result)

    def current_generation(self) -> int:
        return self._generation
