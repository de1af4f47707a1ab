"""The typed queries a servicer resolves a wire message into, once, at the boundary.

A `MeasureQuery` holds everything a measure needs, already checked: the registered spec
(`actstore.measures`), its options defaulted and bounded by the spec's `Option`s (and this
server's limits), both runs committed with the same samples, the layer lists expanded and in range,
the matrix within limits. A `SimilarityQuery` does the same for CKA, COS, minibatch CKA and mutual
kNN (the options the metric uses, resolved through the SIMILARITY table; the others are not read,
as before). Planners below take the object and never re-read the request.

    query = MeasureQuery.resolve(checks, "nbs-score", "run-a", "", [], [], {}, refresh=False)
    query.identifier      -> "nbs-score" (placeholders filled)
    query.result_options  -> what names the cached result (with the layers and the options)
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from actstore import measures
from actstore.errors import InvalidArgument
from actstore.metrics.similarity import MIN_HSIC_SAMPLES
from actstore.options import SIMILARITY, from_message, from_wire
from actstore.server.runs import RunChecks
from actstore.store.catalog import RunRecord


def options_from_json(text: str) -> dict[str, Any]:
    """A request's `options_json`: a JSON object of option values ("" is none)."""
    if not text:
        return {}
    try:
        options = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"options_json is not JSON ({exc.msg} at character {exc.pos}): send an object "
                              'such as {"alpha": 0.5}') from None
    if not isinstance(options, dict):
        raise InvalidArgument(f'options_json must be a JSON object such as {{"alpha": 0.5}}, got {text[:80]!r}')
    return options


def shared_options(measure: measures.Measure, given: Mapping[str, Any]) -> dict[str, Any]:
    """The options of a legacy message that carries every measure's fields (SimilarityRequest,
    CKAMatrixRequest): those this measure takes; the others were never read, and still are not."""
    takes = {option.name for option in measure.options}
    return {name: value for name, value in given.items() if name in takes and value is not None}


@dataclass(frozen=True)
class MeasureQuery:
    measure: measures.Measure
    options: dict[str, Any]
    a: RunRecord
    b: RunRecord
    layers_a: list[int]
    layers_b: list[int]
    refresh: bool = False

    @staticmethod
    def resolve(checks: RunChecks, identifier: str, run_a: str, run_b: str, layers_a: Sequence[int],
                layers_b: Sequence[int], options: Mapping[str, Any], refresh: bool = False) -> MeasureQuery:
        if not identifier:
            raise InvalidArgument("name the measure: one of "
                                  f"{', '.join(m.identifier for m in measures.measures())}")
        measure = measures.get(identifier)
        resolved = measure.resolve(options, checks.settings)
        a, b, la, lb = checks.pair(run_a, run_b, list(layers_a), list(layers_b))
        if a.rows < MIN_HSIC_SAMPLES:
            raise InvalidArgument(f"{identifier} needs n >= {MIN_HSIC_SAMPLES} samples, the runs hold {a.rows}")
        for option in measure.options:
            if option.name in measure.below_rows and resolved[option.name] >= a.rows:
                raise InvalidArgument(f"{option.name}={resolved[option.name]} must be between {option.minimum} and "
                                      f"n-1={a.rows - 1}")
        return MeasureQuery(measure, resolved, a, b, la, lb, refresh)

    @property
    def identifier(self) -> str:
        return self.measure.filled(self.options)

    @property
    def run_keys(self) -> list[str]:
        return [self.a.run_key, self.b.run_key]

    @property
    def result_options(self) -> dict[str, Any]:
        """What names the result: the layers, the measure, its filled identifier and its options."""
        return {"layers_a": self.layers_a, "layers_b": self.layers_b, **measure_options(self.measure, self.options)}


def measure_options(measure: measures.Measure, options: Mapping[str, Any]) -> dict[str, Any]:
    """A measure's part of a result's options (also the matrix job's)."""
    return {"measure": measure.identifier, "identifier": measure.filled(options), **options}


@dataclass(frozen=True)
class SimilarityQuery:
    """A CKA / COS / minibatch CKA / mutual kNN query. `a`, `b`: committed runs (B defaults to A);
    the layers expanded and checked (`RunChecks.pair`; for `align`, the runs of two tokenizers:
    `RunChecks.aligned_pair`, whose rows are matched later). Options the metric does not use hold
    their defaults, unread. `batch_size` is None when not given (minibatch CKA refuses that)."""

    metric: str
    a: RunRecord
    b: RunRecord
    layers_a: list[int]
    layers_b: list[int]
    refresh: bool = False
    center: str = SIMILARITY.center.default
    batch_size: int | None = None
    remainder: str = SIMILARITY.remainder.default
    k: int = SIMILARITY.k.default
    align: str = SIMILARITY.align.default
    word_pool: str = SIMILARITY.word_pool.default

    @staticmethod
    def options_of(metric: str, request: Any) -> dict[str, Any]:
        """The options `metric` uses, from a SimilarityRequest, through the SIMILARITY table."""
        options: dict[str, Any] = {"align": from_wire(SIMILARITY, "align", request.align)}
        if options["align"] != "none":  # different tokenizers: rows are shared words (or spans)
            if metric not in ("cka", "cos"):
                raise InvalidArgument(f"--align {options['align']} is implemented for cka and cos, not {metric}")
            options["word_pool"] = from_wire(SIMILARITY, "word_pool", request.word_pool)
        if metric == "cos":
            options["center"] = from_wire(SIMILARITY, "center", request.center)
        elif metric == "minibatch_cka":
            options["batch_size"] = from_message(SIMILARITY, "batch_size", request)
            options["remainder"] = from_wire(SIMILARITY, "remainder", request.remainder)
        elif metric == "mutual_knn":
            options["k"] = from_message(SIMILARITY, "k", request)
        elif metric != "cka":
            raise InvalidArgument(f"similarity metric {metric!r} is not one of cka, cos, minibatch_cka, mutual_knn")
        return options

    @staticmethod
    def resolve(checks: RunChecks, metric: str, request: Any) -> SimilarityQuery:
        options = SimilarityQuery.options_of(metric, request)
        pair = checks.pair if options["align"] == "none" else checks.aligned_pair
        a, b, la, lb = pair(request.run_a, request.run_b, list(request.layers_a), list(request.layers_b))
        return SimilarityQuery(metric, a, b, la, lb, request.refresh, **options)

    @property
    def run_keys(self) -> list[str]:
        return [self.a.run_key, self.b.run_key]
