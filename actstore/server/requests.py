"""The typed queries a servicer resolves a wire message into, once, at the boundary.

Every query RPC first becomes one `MetricCall`: the registered spec (`actstore.measures`), the
runs, the layers and the options given. The generic `Measure` RPC makes it from its fields and its
JSON options (an option the metric does not take is refused); each older RPC (Similarity, Entropy,
Lens, ...) from its message's fields (`options.given_in_message`). The call then resolves into its
family's typed query (`planners.family(spec.query).query`), which the family's planner takes.

A `MeasureQuery` holds everything a measure needs, already checked: the registered spec
(`actstore.measures`), its options defaulted and bounded by the spec's `Option`s (and this
server's limits), both runs committed with the same samples, the layer lists expanded and in range,
the matrix within limits. A `SimilarityQuery` does the same for CKA, COS, minibatch CKA and mutual
kNN (the options the metric uses, resolved through the SIMILARITY table; the others are not read,
as before). Planners below take the object and never re-read the request.

    call = MetricCall.of_request(MeasureRequest(measure="nbs-score", run_a="run-a"))
    query = MeasureQuery.resolve(checks, call)
    query.identifier      -> "nbs-score" (placeholders filled)
    query.result_options  -> what names the cached result (with the layers and the options)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from actstore import measures
from actstore.errors import InvalidArgument
from actstore.measures.families import ENTROPY_USES, PRESET_ASKS
from actstore.metrics.similarity import MIN_HSIC_SAMPLES
from actstore.options import ENTROPY, LENS, SIMILARITY, STITCH, resolve
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
class MetricCall:
    """A query as the generic `Measure` RPC carries it: the registered spec, run A and run B ("":
    A), the layers of each (empty: all), the options given (None: not given) and refresh."""

    spec: measures.Measure
    run_a: str
    run_b: str = ""
    layers_a: tuple[int, ...] = ()
    layers_b: tuple[int, ...] = ()
    given: Mapping[str, Any] = field(default_factory=dict)
    refresh: bool = False

    @staticmethod
    def of_request(request: Any) -> MetricCall:
        """A MeasureRequest: any registered metric, its options as JSON, refused when the metric
        does not take them; a one-run metric refuses a second run or its layers."""
        if not request.measure:
            raise InvalidArgument("name the metric: one of "
                                  f"{', '.join(m.identifier for m in measures.measures(query=None))}")
        spec = measures.get(request.measure)
        given = options_from_json(request.options_json)
        spec.refuse_unknown(given)
        if spec.runs == 1 and (request.run_b or request.layers_b):
            raise InvalidArgument(f"{spec.identifier} takes one run (run_a and layers_a): leave run_b and "
                                  "layers_b empty")
        return MetricCall(spec, request.run_a, request.run_b, tuple(request.layers_a), tuple(request.layers_b),
                          given, request.refresh)


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
    def resolve(checks: RunChecks, call: MetricCall) -> MeasureQuery:
        measure = call.spec
        resolved = measure.resolve(call.given, checks.settings)
        a, b, la, lb = checks.pair(call.run_a, call.run_b, list(call.layers_a), list(call.layers_b))
        if a.rows < MIN_HSIC_SAMPLES:
            raise InvalidArgument(f"{measure.identifier} needs n >= {MIN_HSIC_SAMPLES} samples, the runs hold "
                                  f"{a.rows}")
        for option in measure.options:
            if option.name in measure.below_rows and resolved[option.name] >= a.rows:
                raise InvalidArgument(f"{option.name}={resolved[option.name]} must be between {option.minimum} and "
                                      f"n-1={a.rows - 1}")
        return MeasureQuery(measure, resolved, a, b, la, lb, call.refresh)

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
    def options_of(metric: str, given: Mapping[str, Any]) -> dict[str, Any]:
        """The options `metric`'s spec takes, resolved through the SIMILARITY table (align always,
        word_pool with align); the others are not read."""
        spec = measures.get(metric, query="similarity")
        takes = [option.name for option in spec.options]
        options: dict[str, Any] = {"align": resolve(SIMILARITY, "align", given.get("align"))}
        if options["align"] != "none":  # different tokenizers: rows are shared words (or spans)
            if "align" not in takes:
                aligned = ", ".join(m.identifier for m in measures.measures(query="similarity")
                                    if SIMILARITY.align in m.options)
                raise InvalidArgument(f"--align {options['align']} is implemented for {aligned}, not {metric}")
            options["word_pool"] = resolve(SIMILARITY, "word_pool", given.get("word_pool"))
        for name in takes:
            if name not in ("align", "word_pool"):
                options[name] = resolve(SIMILARITY, name, given.get(name))
        return options

    @staticmethod
    def resolve(checks: RunChecks, call: MetricCall) -> SimilarityQuery:
        metric = call.spec.identifier
        options = SimilarityQuery.options_of(metric, call.given)
        pair = checks.pair if options["align"] == "none" else checks.aligned_pair
        a, b, la, lb = pair(call.run_a, call.run_b, list(call.layers_a), list(call.layers_b))
        return SimilarityQuery(metric, a, b, la, lb, call.refresh, **options)

    @property
    def run_keys(self) -> list[str]:
        return [self.a.run_key, self.b.run_key]


# ---- one run's families: entropy, depth (lens, NC1, residual norm); and stitching --------------------


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
    def options_of(metric: str, given: Mapping[str, Any], limits: Any = None) -> dict[str, Any]:
        """The pipeline's options and those `metric` uses, from the options given (`limits`: the
        server's settings)."""
        # every option given is checked against the table, once, as before (a bad value of an
        # option this metric does not use is refused too); the server's limits apply to the options it uses
        preset = resolve(ENTROPY, "preset", given.get("preset"))
        uses = PRESET_ASKS if preset != "none" else ENTROPY_USES.get(metric, ())
        checked = {name: resolve(ENTROPY, name, given.get(name), limits if name in uses else None)
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
    def resolve(checks: RunChecks, call: MetricCall) -> EntropyQuery:
        metric = call.spec.identifier
        options = EntropyQuery.options_of(metric, call.given, checks.settings)
        run = checks.committed_run(call.run_a)
        layers = checks.check_layers(run, list(call.layers_a), "layer")
        checks.check_finite(run, layers)
        return EntropyQuery(metric, run, layers, options, call.refresh)

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
    def resolve(checks: RunChecks, call: MetricCall) -> ResidualNormQuery:
        run = checks.committed_run(call.run_a)
        layers = checks.distinct(list(call.layers_a) if call.layers_a else list(range(run.num_layers)), "layer")
        bad = [layer for layer in layers if not 0 <= layer < run.num_layers]
        if bad:
            raise InvalidArgument(f"layer {bad[0]} has no next layer: run {run.run_key[:12]} allows 0.."
                                  f"{run.num_layers - 1}")
        checks.check_finite(run, sorted(set(layers) | {x + 1 for x in layers}))
        return ResidualNormQuery(run, layers, call.refresh)


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
    def options_of(given: Mapping[str, Any]) -> dict[str, Any]:
        return {"epsilon": resolve(LENS, "epsilon", given.get("epsilon")),  # in (0, 1)
                "taus": sorted(resolve(LENS, "taus", given.get("taus"))),  # each in [0, 1]
                "heads": resolve(LENS, "heads", given.get("heads"))}

    @staticmethod
    def resolve(checks: RunChecks, call: MetricCall) -> LensQuery:
        if call.layers_a:
            raise InvalidArgument("the lens reads every layer of the run: leave the layers empty")
        options = LensQuery.options_of(call.given)
        return LensQuery(checks.committed_run(call.run_a), refresh=call.refresh, **options)


@dataclass(frozen=True)
class NeuralCollapseQuery:
    """NC1 per layer: a pooled committed run, its layers in range (all when none given) and finite,
    and `rcond` through the LENS table. Its labels the planner reads."""

    run: RunRecord
    layers: list[int]
    rcond: float = LENS.rcond.default
    refresh: bool = False

    @staticmethod
    def options_of(given: Mapping[str, Any]) -> dict[str, Any]:
        return {"rcond": resolve(LENS, "rcond", given.get("rcond"))}

    @staticmethod
    def resolve(checks: RunChecks, call: MetricCall) -> NeuralCollapseQuery:
        options = NeuralCollapseQuery.options_of(call.given)
        run = checks.committed_run(call.run_a)
        if run.pooling == "tokens":
            raise InvalidArgument("NC1 needs one labelled vector per sample: use a pooled run")
        layers = checks.check_layers(run, list(call.layers_a), "layer")
        checks.check_finite(run, layers)
        return NeuralCollapseQuery(run, layers, refresh=call.refresh, **options)


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
    def options_of(given: Mapping[str, Any], limits: Any = None) -> dict[str, Any]:
        return {"test_fraction": resolve(STITCH, "test_fraction", given.get("test_fraction")),  # in (0, 1)
                "seed": resolve(STITCH, "seed", given.get("seed")),
                "tune_steps": resolve(STITCH, "tune_steps", given.get("tune_steps"), limits),
                "tune_lr": resolve(STITCH, "tune_lr", given.get("tune_lr"))}

    @staticmethod
    def resolve(checks: RunChecks, call: MetricCall) -> StitchQuery:
        if len(call.layers_a) != 1 or len(call.layers_b) != 1:
            raise InvalidArgument("a stitch joins one layer of run A to one layer of run B: give exactly one "
                                  f"of each (got {len(call.layers_a)} and {len(call.layers_b)})")
        options = StitchQuery.options_of(call.given, checks.settings)
        a, b = checks.committed_run(call.run_a), checks.committed_run(call.run_b)
        (layer_a,), (layer_b,) = call.layers_a, call.layers_b
        checks.check_layers(a, [layer_a], "layer_a")
        checks.check_layers(b, [layer_b], "layer_b")
        return StitchQuery(a, layer_a, b, layer_b, refresh=call.refresh, **options)

    @property
    def result_options(self) -> dict[str, Any]:
        """What names the result; the tuning only when asked, so untuned results keep their keys."""
        options = {"layer_a": self.layer_a, "layer_b": self.layer_b, "test_fraction": self.test_fraction,
                   "seed": self.seed}
        if self.tune_steps:
            options.update(tune_steps=self.tune_steps, tune_lr=self.tune_lr)
        return options

