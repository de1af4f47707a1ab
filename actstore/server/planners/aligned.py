"""Similarity between token-level runs of different tokenizers: tokens aggregated to the words
both tokenizations share, or to the finest spans both share (`metrics.alignment`), then linear CKA
(biased and debiased) or the sample-wise cosine (COS, equal widths; exact quantiles) on the
aligned (sample, unit) rows. The runs must cover the same texts: the same dataset, or the same
sample ids with the same texts."""

from __future__ import annotations

import numpy as np

from actstore.errors import FailedPrecondition, InvalidArgument
from actstore.metrics import alignment as align
from actstore.metrics import similarity as sim
from actstore.server.planners import Planner, QueryParts
from actstore.server.planners.token_units import TokenUnits
from actstore.server.requests import SimilarityQuery
from actstore.server.results import MetricResult
from actstore.store.catalog import RunRecord

UNIT = {"words": "word", "spans": "shared span"}


class AlignedPlanner(Planner):
    """CKA and COS across tokenizers: rows are the text's units both runs reach (`TokenUnits`)."""

    def __init__(self, parts: QueryParts) -> None:
        super().__init__(parts)
        self.units = TokenUnits(parts)

    def similarity(self, query: SimilarityQuery) -> MetricResult:
        """CKA or COS over the rows both tokenizations share (`query.align`: words or spans)."""
        metric, a, b, la, lb = query.metric, query.a, query.b, query.layers_a, query.layers_b
        units, word_pool, center, refresh = query.align, query.word_pool, query.center, query.refresh
        self.units.require_tokens(f"--align {units}", a, b)
        if metric == "cos" and a.width != b.width:
            raise InvalidArgument(f"COS compares one unit's vectors directly, so the widths must match "
                                  f"({a.width} != {b.width}): use CKA across widths")
        texts = self.units.same_texts(a, b)
        self.parts.checks.check_finite(a, la)
        self.parts.checks.check_finite(b, lb)
        options = {"layers_a": la, "layers_b": lb, "align": units, "word_pool": word_pool}
        if metric == "cos":
            options["center"] = center
        name = {"cka": "linear_cka", "cos": "samplewise_cosine"}[metric]
        return self.parts.results.cached_or_compute(name, sim.DEFINITION_VERSION, options, [a.run_key, b.run_key],
                                                    refresh,
                                                    lambda: self._compute(metric, a, b, la, lb, options, texts))

    def _rows(self, units: str, a: RunRecord, b: RunRecord, texts: list[str]) -> tuple[dict, dict]:
        if units == "spans":
            offsets = self.parts.arrays.offsets
            return align.span_rows(texts, self.units.spans(a), offsets(a.run_key), self.units.spans(b),
                                   offsets(b.run_key))
        return self.units.word_rows(a, texts), self.units.word_rows(b, texts)

    def _compute(self, metric: str, a: RunRecord, b: RunRecord, la: list[int], lb: list[int], options: dict,
                 texts: list[str]):
        word_pool, unit = options["word_pool"], UNIT[options["align"]]
        rows_a, rows_b = self._rows(options["align"], a, b, texts)
        pairs = align.common_words(rows_a, rows_b)
        if len(pairs) < sim.MIN_HSIC_SAMPLES:
            raise FailedPrecondition(f"only {len(pairs)} {unit}s are common to both tokenizations: too few for "
                                     f"{metric.upper()}")
        n = len(pairs)
        self.parts.checks.check_memory(8 * n * (len(la) * a.width + len(lb) * b.width),
                                       f"{n} aligned {unit} rows of {len(la)} + {len(lb)} layers")
        xs = self.units.pooled(a, la, rows_a, pairs, word_pool)
        ys = self.units.pooled(b, lb, rows_b, pairs, word_pool)
        skipped = max(len(rows_a), len(rows_b)) - n
        notes = [f"{n} (sample, {unit}) rows common to both tokenizations ({word_pool} of each {unit}'s tokens)"]
        if skipped:
            notes.append(f"{skipped} {unit}s reached by only one tokenization (truncation) were left out")
        if metric == "cos":
            cos = [[sim.samplewise_cosine(x, y, options["center"]) for y in ys] for x in xs]
            levels = np.asarray(sim.QUANTILE_LEVELS)
            return ({"mean": np.array([[c.mean() for c in row] for row in cos]),
                     "quantiles": np.array([[np.quantile(c, levels) for c in row] for row in cos]),
                     "quantile_levels": levels}, {"n": float(n)}, [*notes, f"quantiles are exact over the {unit} rows"])
        biased = np.array([[sim.linear_cka(x, y) for y in ys] for x in xs])
        debiased = np.array([[sim.linear_cka_debiased(x, y) for y in ys] for x in xs])
        return {"biased": biased, "debiased": debiased}, {"n": float(n)}, notes
