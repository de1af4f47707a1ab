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
from actstore.options import ENTROPY, LENS, SIMILARITY, STITCH, from_message, from_wire
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


# ---- one run's families: entropy, depth (lens, NC1, residual norm); and stitching --------------------
ENTROPY_USES = {  # the options that name each entropy metric's result, in the ENTROPY table's order
    "dataset_entropy": ("alpha", "normalization", "clamp"), "prompt_entropy": ("alpha", "normalization", "clamp"),
    "effective_rank": ("convention",), "curvature": ("abs_cos",), "infonce": ("temperature",),
    "dime": ("alpha", "permutations", "seed"), "lidar": ("alpha", "exp"),
}
PRESET_ASKS = ("alpha", "normalization", "clamp", "abs_cos")  # a preset fixes these: read to refuse others


@dataclass(frozen=True)
class EntropyQuery:
    """An entropy-family query: the committed run, its layers in range (all when none given) and
    finite, and in `options` what `options_of` read through the ENTROPY table and this server's
    limits (DiME permutations): the pipeline (preset, align, and word_pool with align words) and
    the options the metric uses (`ENTROPY_USES`; with a preset, those it fixes: `PRESET_ASKS`).
    Every field is checked against the table, as before; only those are kept."""

    metric: str
    run: RunRecord
    layers: list[int]
    options: dict[str, Any]
    refresh: bool = False

    @staticmethod
    def options_of(metric: str, request: Any, limits: Any = None) -> dict[str, Any]:
        """The pipeline's options and those `metric` uses, from an EntropyRequest (`limits`: the server's
        settings)."""
        # every field is checked against the table, once, as before (a bad value of an option this
        # metric does not use is refused too); the server's limits apply to the options it uses
        preset = from_message(ENTROPY, "preset", request)
        uses = PRESET_ASKS if preset != "none" else ENTROPY_USES.get(metric, ())
        checked = {name: from_message(ENTROPY, name, request, limits if name in uses else None)
                   for name in ENTROPY if name not in ("metric", "preset")}
        options = {name: value for name, value in checked.items() if name in uses}
        options.update(preset=preset, align=checked["align"])
        if options["align"] == "words":  # a token-level run's tokens pooled to words first
            options["word_pool"] = checked["word_pool"]
        if preset != "none" and options["align"] != "none":
            raise InvalidArgument(f"preset {preset} reproduces a pipeline over token rows: "
                                  f"drop --align {options['align']}")
        return options

    @staticmethod
    def resolve(checks: RunChecks, metric: str, request: Any) -> EntropyQuery:
        options = EntropyQuery.options_of(metric, request, checks.settings)
        run = checks.committed_run(request.run)
        layers = checks.check_layers(run, list(request.layers), "layer")
        checks.check_finite(run, layers)
        return EntropyQuery(metric, run, layers, options, request.refresh)

    @property
    def result_options(self) -> dict[str, Any]:
        """What names a result (without a preset): the layers and the options the metric uses."""
        return {"layers": self.layers, **{name: self.options[name] for name in ENTROPY_USES.get(self.metric, ())}}


@dataclass(frozen=True)
class ResidualNormQuery:
    """The residual norm ratio of layers l -> l+1: the committed run, each layer (all when none
    given) once and with a next layer, both finite."""

    run: RunRecord
    layers: list[int]
    refresh: bool = False

    @staticmethod
    def resolve(checks: RunChecks, request: Any) -> ResidualNormQuery:
        run = checks.committed_run(request.run)
        layers = checks.distinct(list(request.layers) if request.layers else list(range(run.num_layers)), "layer")
        bad = [layer for layer in layers if not 0 <= layer < run.num_layers]
        if bad:
            raise InvalidArgument(f"layer {bad[0]} has no next layer: run {run.run_key[:12]} allows 0.."
                                  f"{run.num_layers - 1}")
        checks.check_finite(run, sorted(set(layers) | {x + 1 for x in layers}))
        return ResidualNormQuery(run, layers, request.refresh)


@dataclass(frozen=True)
class LensQuery:
    """A logit-lens query: the committed run and the LENS options (the thresholds sorted). What the
    lens needs of the run's model (a head; exit heads) and pooling, the planner checks."""

    run: RunRecord
    epsilon: float
    taus: list[float]
    heads: str
    refresh: bool = False

    @staticmethod
    def options_of(request: Any) -> dict[str, Any]:
        return {"epsilon": from_wire(LENS, "epsilon", request.epsilon),  # in (0, 1)
                "taus": sorted(from_wire(LENS, "taus", list(request.taus))),  # each in [0, 1]
                "heads": from_wire(LENS, "heads", request.heads)}

    @staticmethod
    def resolve(checks: RunChecks, request: Any) -> LensQuery:
        options = LensQuery.options_of(request)
        return LensQuery(checks.committed_run(request.run), refresh=request.refresh, **options)


@dataclass(frozen=True)
class NeuralCollapseQuery:
    """NC1 per layer: a pooled committed run, its layers in range (all when none given) and finite,
    and `rcond` through the LENS table. Its labels the planner reads."""

    run: RunRecord
    layers: list[int]
    rcond: float = LENS.rcond.default
    refresh: bool = False

    @staticmethod
    def options_of(request: Any) -> dict[str, Any]:
        return {"rcond": from_wire(LENS, "rcond", request.rcond)}

    @staticmethod
    def resolve(checks: RunChecks, request: Any) -> NeuralCollapseQuery:
        options = NeuralCollapseQuery.options_of(request)
        run = checks.committed_run(request.run)
        if run.pooling == "tokens":
            raise InvalidArgument("NC1 needs one labelled vector per sample: use a pooled run")
        layers = checks.check_layers(run, list(request.layers), "layer")
        checks.check_finite(run, layers)
        return NeuralCollapseQuery(run, layers, refresh=request.refresh, **options)


@dataclass(frozen=True)
class StitchQuery:
    """A stitch of run A's layer into run B's model at B's layer: the STITCH options (tune_steps
    capped by this server's limit), both runs committed, each layer in range. The planner checks
    the rest in its order: token-level runs, B's head, the same samples, finite layers, memory."""

    a: RunRecord
    layer_a: int
    b: RunRecord
    layer_b: int
    test_fraction: float = STITCH.test_fraction.default
    seed: int = STITCH.seed.default
    tune_steps: int = STITCH.tune_steps.default
    tune_lr: float = STITCH.tune_lr.default
    refresh: bool = False

    @staticmethod
    def options_of(request: Any, limits: Any = None) -> dict[str, Any]:
        return {"test_fraction": from_message(STITCH, "test_fraction", request),  # in (0, 1)
                "seed": from_wire(STITCH, "seed", request.seed),
                "tune_steps": from_wire(STITCH, "tune_steps", request.tune_steps, limits),
                "tune_lr": from_wire(STITCH, "tune_lr", request.tune_lr)}

    @staticmethod
    def resolve(checks: RunChecks, request: Any) -> StitchQuery:
        options = StitchQuery.options_of(request, checks.settings)
        a, b = checks.committed_run(request.run_a), checks.committed_run(request.run_b)
        checks.check_layers(a, [request.layer_a], "layer_a")
        checks.check_layers(b, [request.layer_b], "layer_b")
        return StitchQuery(a, request.layer_a, b, request.layer_b, refresh=request.refresh, **options)

    @property
    def result_options(self) -> dict[str, Any]:
        """What names the result; the tuning only when asked, so untuned results keep their keys."""
        options = {"layer_a": self.layer_a, "layer_b": self.layer_b, "test_fraction": self.test_fraction,
                   "seed": self.seed}
        if self.tune_steps:
            options.update(tune_steps=self.tune_steps, tune_lr=self.tune_lr)
        return options
