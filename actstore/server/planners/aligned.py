"""Similarity between token-level runs of different tokenizers: tokens aggregated to the words
both tokenizations share (`metrics.alignment`), then linear CKA (biased and debiased) or the
sample-wise cosine (COS, equal widths; exact quantiles) on the aligned (sample, word) rows. The
runs must cover the same texts: the same dataset, or the same sample ids with the same texts."""

from __future__ import annotations

from functools import partial

import numpy as np

from actstore.errors import FailedPrecondition, InvalidArgument
from actstore.metrics import alignment as align
from actstore.metrics import similarity as sim
from actstore.server.planners import Planner
from actstore.server.results import MetricResult
from actstore.store.catalog import RunRecord
from actstore.store.datasets import load_dataset


class AlignedPlanner(Planner):

    def similarity(self, metric: str, run_a: str, run_b: str, layers_a: list[int], layers_b: list[int],
                   word_pool: str, center: str, refresh: bool) -> MetricResult:
        a = self.checks.committed_run(run_a)
        b = self.checks.committed_run(run_b) if run_b else a
        la = self.checks.check_layers(a, layers_a, "layer")
        lb = self.checks.check_layers(b, layers_b, "layer")
        self.checks.check_matrix(len(la), len(lb))
        if a.pooling != "tokens" or b.pooling != "tokens":
            raise InvalidArgument("--align words aggregates token rows to words: capture both runs with "
                                  "--pooling tokens")
        if metric == "cos" and a.width != b.width:
            raise InvalidArgument(f"COS compares one word's vectors directly, so the widths must match "
                                  f"({a.width} != {b.width}): use CKA across widths")
        texts = self._same_texts(a, b)
        self.checks.check_finite(a, la)
        self.checks.check_finite(b, lb)
        options = {"layers_a": la, "layers_b": lb, "align": "words", "word_pool": word_pool}
        if metric == "cos":
            options["center"] = center
        name = {"cka": "linear_cka", "cos": "samplewise_cosine"}[metric]
        return self.results.cached_or_compute(name, sim.DEFINITION_VERSION, options, [a.run_key, b.run_key],
                                              refresh, lambda: self._compute(metric, a, b, la, lb, options, texts))

    def _texts(self, run: RunRecord) -> list[str]:
        return list(load_dataset(self.executor.store.local(self.catalog.dataset(run.dataset_digest).path)).texts)

    def _same_texts(self, a: RunRecord, b: RunRecord) -> list[str]:
        """The texts both runs cover: one dataset, or the same sample ids with the same texts;
        otherwise INVALID_ARGUMENT naming the first sample that differs."""
        texts = self._texts(a)
        if a.dataset_digest == b.dataset_digest:
            return texts
        for name, mine, theirs in [("sample", self.arrays.sample_ids(a.run_key), self.arrays.sample_ids(b.run_key)),
                                   ("text of sample", texts, self._texts(b))]:
            if mine != theirs:
                first = next((i for i, (x, y) in enumerate(zip(mine, theirs)) if x != y), min(len(mine), len(theirs)))
                in_a, in_b = (repr(v[first][:60]) if first < len(v) else "missing" for v in (mine, theirs))
                raise InvalidArgument(f"runs {a.run_key[:12]} and {b.run_key[:12]} do not cover the same texts: "
                                      f"{name} {first} is {in_a} in A and {in_b} in B. Capture both models on the "
                                      "same dataset")
        return texts

    def _word_rows(self, run: RunRecord, texts: list[str]) -> dict:
        spans = self.arrays.char_spans(run.run_key)
        if spans is None:
            raise FailedPrecondition(f"run {run.run_key[:12]} has no character spans (captured before they were "
                                     "stored, or its tokenizer gives no offsets): delete it and capture it again "
                                     "with a fast tokenizer")
        return align.word_rows(texts, spans, self.arrays.offsets(run.run_key))

    def _compute(self, metric: str, a: RunRecord, b: RunRecord, la: list[int], lb: list[int], options: dict,
                 texts: list[str]):
        word_pool = options["word_pool"]
        rows_a, rows_b = self._word_rows(a, texts), self._word_rows(b, texts)
        pairs = align.common_words(rows_a, rows_b)
        if len(pairs) < sim.MIN_HSIC_SAMPLES:
            raise FailedPrecondition(f"only {len(pairs)} words are common to both tokenizations: too few for CKA")
        n = len(pairs)
        self.checks.check_memory(8 * n * (len(la) * a.width + len(lb) * b.width),
                                 f"{n} aligned word rows of {len(la)} + {len(lb)} layers")
        xs = self.executor.evaluate_layers(a.run_key, la, partial(
            align.pool_rows, pooling=align.pooling_matrix(rows_a, pairs, word_pool), n_rows=n))
        ys = self.executor.evaluate_layers(b.run_key, lb, partial(
            align.pool_rows, pooling=align.pooling_matrix(rows_b, pairs, word_pool), n_rows=n))
        skipped = max(len(rows_a), len(rows_b)) - n
        notes = [f"{n} (sample, word) rows common to both tokenizations ({word_pool} of each word's tokens)"]
        if skipped:
            notes.append(f"{skipped} words reached by only one tokenization (truncation) were left out")
        if metric == "cos":
            cos = [[sim.samplewise_cosine(x, y, options["center"]) for y in ys] for x in xs]
            levels = np.asarray(sim.QUANTILE_LEVELS)
            return ({"mean": np.array([[c.mean() for c in row] for row in cos]),
                     "quantiles": np.array([[np.quantile(c, levels) for c in row] for row in cos]),
                     "quantile_levels": levels}, {"n": float(n)}, [*notes, "quantiles are exact over the word rows"])
        biased = np.array([[sim.linear_cka(x, y) for y in ys] for x in xs])
        debiased = np.array([[sim.linear_cka_debiased(x, y) for y in ys] for x in xs])
        return {"biased": biased, "debiased": debiased}, {"n": float(n)}, notes
