"""How a CKA-stats query resamples. Which bootstrap it runs: the exact per-sample Poisson bootstrap
(`metrics.similarity.uncertain_cka`, Gram space, ~ n^2 (D + 3B)) or the grouped one
(`metrics.similarity.grouped_cka`, feature space, ~ n D^2 / 2 + 2 G^2 d^2 per product + B G^3),
and with how many groups and map tasks, so that the grouped state fits `max_accumulator_bytes`.

`auto` (issue 11's target: a pair query with B = 200 replicates within 3x the plain one) keeps the
exact bootstrap while its modelled multiply-adds are within `TARGET_RATIO` times the plain
query's (`streaming.cka_mode_costs`, the cheaper space) or within `EXACT_RATE` times the grouped
one's, and takes the grouped bootstrap otherwise (large n), or the exact one when the grouped
state cannot fit even `MIN_GROUPS` groups. The plain query's fixed costs (reading, Ray tasks) are
not modelled, so the model is conservative: it leaves the exact bootstrap somewhat before the
measured ratio passes 3x.

`resampled_cka` then runs it: one pass of the exact accumulator (its bootstrap and the null), or
the grouped bootstrap's pass over `tasks` row ranges with its block products shared out between
the cores those leave idle (`GroupedBootstrapCKA.split`: each share reads every row and forms only
its products, so for one pair on two cores each takes about half the products and the finalize)
and, with a null, the exact accumulator's pass for the null alone (the null permutes rows, so it
needs them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from actstore.errors import InvalidArgument, ResourceExhausted
from actstore.metrics.similarity.features import FeatureTransform, TransformedAccumulator
from actstore.metrics.similarity.grouped_cka import GroupedBootstrapCKA, grouped_bootstrap_cost
from actstore.metrics.similarity.streaming import cka_mode_costs
from actstore.metrics.similarity.uncertain_cka import ResampledCKA, ResampledCKAStats, exact_bootstrap_cost
from actstore.server.planners import QueryParts
from actstore.server.runs import byte_size

TARGET_RATIO = 3.0
# The exact bootstrap's multiply-adds (large Gram strips) run about this much faster than the grouped
# one's (per-group d x d products over ~n/G rows, G x d^2 passes of the finalize): measured walls are
# equal at n = 3072, d = 384, B = 200, G = 48 (0.29 vs 0.27 s, bench/bootstrap_ci.py, 2 cores), where
# the models say 8.6e9 vs 2.4e9; at n = 2048 the exact one took 0.17 s, the grouped one 0.21 s.
EXACT_RATE = 3.5
ROWS_PER_TASK = 32768  # a grouped map task's products over this many rows cost about what merging its state does
MIN_GROUPS = 16  # below this the standard error's relative error (~ 1/sqrt(2(G-1))) passes 18%


@dataclass(frozen=True)
class BootstrapPlan:
    """`method` exact or grouped; for grouped, `groups` G (`requested` was asked; fewer when memory
    needs) and the map `tasks` whose partial states fit the memory limit with the merge."""

    method: str
    groups: int = 0
    requested: int = 0
    tasks: int = 0

    def key(self) -> dict:
        """What the result key and the provenance record of the bootstrap."""
        return {"bootstrap_method": self.method, **({"bootstrap_groups": self.groups} if self.groups else {})}

    def note(self) -> str:
        if self.method == "exact":
            return "exact Poisson bootstrap: every sample drawn Poisson(1) times (docs/metrics.md)"
        fewer = f" (fewer than the {self.requested} asked: memory)" if self.groups < self.requested else ""
        return (f"grouped Poisson bootstrap: {self.groups} random groups of samples{fewer}, each drawn Poisson(1) "
                f"times; the standard error's relative error from the grouping is about "
                f"{(2 * (self.groups - 1)) ** -0.5:.0%}; copies of a row never pair with each other, in both "
                "variants (docs/metrics.md)")


def _largest_fitting(widths: Sequence[int], pairs: Sequence[tuple[int, int]], replicates: int, limit: int,
                     groups: int, tasks: int) -> int:
    """The most groups (<= `groups`) whose state, with `tasks` map tasks, fits `limit`; 0 if none."""
    for g in range(groups, 0, -1):
        if GroupedBootstrapCKA.estimate_peak_nbytes(widths, pairs, g, replicates, tasks) <= limit:
            return g
    return 0


def plan_bootstrap(method: str, groups: int, widths: Sequence[int], pairs: Sequence[tuple[int, int]], n: int,
                   replicates: int, limit: int, parts: int) -> BootstrapPlan:
    """The bootstrap for `replicates` replicates of CKA between the block `pairs` over n rows.
    Grouped: the requested `groups` or the most that fit `limit` with one map task (at least
    `min(groups, MIN_GROUPS)`, else RESOURCE_EXHAUSTED naming the size), then as many of the
    executor's `parts` map tasks as fit beside them, one per `ROWS_PER_TASK` rows (every task
    returns a state of G x D^2 floats that the reducer merges)."""
    if method not in ("auto", "exact", "grouped"):
        raise InvalidArgument(f"bootstrap_method must be auto, exact or grouped, got {method!r}")
    if method == "exact":
        return BootstrapPlan("exact")
    fitting = _largest_fitting(widths, pairs, replicates, limit, groups, 1)
    floor = min(groups, MIN_GROUPS)
    if fitting < floor:
        if method == "auto":
            return BootstrapPlan("exact")
        need = GroupedBootstrapCKA.estimate_peak_nbytes(widths, pairs, floor, replicates, 1)
        raise ResourceExhausted(
            f"the grouped bootstrap with {floor} groups over {len(pairs)} layer pair(s) would hold {byte_size(need)} "
            f"in memory (every group keeps the layers' D x D moments), over the {byte_size(limit)} limit "
            "(ACTSTORE_MAX_ACCUMULATOR_BYTES): ask for fewer layer pairs or narrower layers, or use "
            "--bootstrap-method exact")
    if method == "auto":
        plain = min(cka_mode_costs(widths, n).values())
        exact = exact_bootstrap_cost(widths, pairs, n, replicates)
        if exact <= max(TARGET_RATIO * plain, EXACT_RATE * grouped_bootstrap_cost(widths, pairs, n, replicates,
                                                                                  fitting)):
            return BootstrapPlan("exact")
    most = min(max(parts, 1), -(-n // ROWS_PER_TASK))
    tasks = max(t for t in range(1, most + 1)
                if GroupedBootstrapCKA.estimate_peak_nbytes(widths, pairs, fitting, replicates, t) <= limit or t == 1)
    return BootstrapPlan("grouped", fitting, groups, tasks)


def resampled_cka(parts: QueryParts, rows: int, sources: list[tuple[str, list[int]]], widths: list[int],
                  pairs: list[tuple[int, int]], transforms: list[FeatureTransform] | None, itemsize: int,
                  replicates: int, permutations: int, seed: int, plan: BootstrapPlan | None) -> ResampledCKAStats:
    """The sample's CKA, the bootstrap replicates' (by `plan`; None: no bootstrap) and the null's."""
    def wrapped(accumulator):
        return accumulator if transforms is None else TransformedAccumulator(accumulator, transforms)

    grouped = plan is not None and plan.method == "grouped"
    exact_replicates = 0 if grouped else replicates
    stats = None
    if exact_replicates or permutations:
        parts.checks.check_memory(
            ResampledCKA.estimate_peak_nbytes(widths, pairs, rows, exact_replicates, permutations, itemsize),
            f"CKA with {exact_replicates} exact bootstrap replicates and {permutations} permutations over "
            f"{len(pairs)} layer pair(s) (the rows and their Gram strips, n={rows})",
            "ask for fewer layer pairs, fewer replicates or permutations, a run with fewer samples, or "
            "--bootstrap-method grouped")
        accumulator = wrapped(ResampledCKA(widths, pairs, exact_replicates, permutations, seed))
        stats = parts.executor.map_reduce(rows, sources, accumulator).finalize()
    if grouped:  # its state is G x D^2 floats per task: merged and finalized in a Ray task
        # the runs' stored means (transformed like the rows) keep the shifted sums near the centred ones
        means = [parts.arrays.means(run)[layer] for run, layers in sources for layer in layers]
        shifts = means if transforms is None else [t.apply(m[None])[0] for t, m in zip(transforms, means)]
        # the cores the row ranges leave idle take shares of the products (each share reads every row)
        shares = GroupedBootstrapCKA(widths, pairs, replicates, plan.groups, seed, shifts).split(
            max(1, parts.executor.parts // plan.tasks))
        terms = parts.executor.map_finalize(rows, sources, [wrapped(share) for share in shares],
                                            parts.executor.row_groups(rows, plan.tasks))
        boot = terms[0].stats(*terms[1:])
        stats = boot if stats is None else dataclasses.replace(boot, null_biased=stats.null_biased,
                                                               null_debiased=stats.null_debiased)
    return stats
