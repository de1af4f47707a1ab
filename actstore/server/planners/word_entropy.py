"""The matrix-entropy family over the words of a token-level run (`--align words`): each layer's
token rows pooled to words (`metrics.alignment`: mean or last token of each whitespace word), then
the formulas of `metrics.entropy` on the word rows, so models with different tokenizers give
curves over the same units.

- dataset_entropy, effective_rank: the (n_words, d) matrix of every word of every text
  (normalised over all words, as dataset entropy normalises over the set);
- prompt_entropy, curvature: per text, the matrix (trajectory) of its words, averaged over texts
  with at least 2 (3) words.

InfoNCE, DiME and LiDAR compare augmented views of pooled prompts and have no word form.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from actstore.errors import FailedPrecondition, InvalidArgument
from actstore.metrics import alignment as align
from actstore.metrics import entropy as ent
from actstore.server.planners import Planner, QueryParts
from actstore.server.planners.token_units import TokenUnits
from actstore.server.results import MetricResult
from actstore.store.catalog import RunRecord

WORD_METRICS = ("dataset_entropy", "effective_rank", "prompt_entropy", "curvature")
PER_TEXT = {"prompt_entropy": ent.PromptEntropyAccumulator.min_tokens, "curvature": ent.CurvatureAccumulator.min_tokens}


def _word_value(words: np.ndarray, metric: str, offsets: np.ndarray, options: dict):
    """One layer's value from its (n_words, d) word rows; texts are rows offsets[i]:offsets[i+1]."""
    if metric == "dataset_entropy":
        return ent.matrix_entropy(words, options["alpha"], options["normalization"], options["clamp"])
    if metric == "effective_rank":
        return ent.effective_rank(words, options["convention"])
    accumulator = (ent.PromptEntropyAccumulator(options["alpha"], options["normalization"], options["clamp"])
                   if metric == "prompt_entropy" else ent.CurvatureAccumulator(options["abs_cos"]))
    return accumulator.update(words, offsets).finalize()


class WordEntropyPlanner(Planner):
    """The entropy family over the words of a token-level run's texts (`TokenUnits`)."""

    def __init__(self, parts: QueryParts) -> None:
        super().__init__(parts)
        self.units = TokenUnits(parts)

    def entropy(self, metric: str, run: RunRecord, layers: list[int], options: dict, word_pool: str,
                refresh: bool) -> MetricResult:
        """`metric` with `options` (the result options of its `EntropyQuery`) over the run's words."""
        if metric not in WORD_METRICS:
            raise InvalidArgument(f"--align words covers {', '.join(WORD_METRICS)}, not {metric} (it compares "
                                  "augmented views of pooled prompts): drop --align")
        self.units.require_tokens("--align words", run)
        options = {**options, "align": "words", "word_pool": word_pool}
        return self.parts.results.cached_or_compute(metric, ent.DEFINITION_VERSION, options, [run.run_key], refresh,
                                                    lambda: self._compute(metric, run, layers, options))

    def _compute(self, metric: str, run: RunRecord, layers: list[int], options: dict):
        rows = self.units.word_rows(run, self.units.texts(run))
        words = sorted(rows)  # (sample, word) in text order
        texts = len(self.parts.arrays.offsets(run.run_key)) - 1
        offsets = align.unit_offsets(words, texts)
        n = len(words)
        least = PER_TEXT.get(metric, 2)
        enough = int(np.sum(np.diff(offsets) >= least)) if metric in PER_TEXT else n
        if enough < (1 if metric in PER_TEXT else least):
            what = f"a text of at least {least} words" if metric in PER_TEXT else f"at least {least} words"
            raise FailedPrecondition(f"{metric} over words needs {what}; run {run.run_key[:12]} has {n} words in "
                                     f"{texts} texts")
        gram = 8 * n * n if metric == "dataset_entropy" and n <= run.width else 0
        self.parts.checks.check_memory(8 * run.width * (run.rows + 2 * n) + gram,
                                       f"a layer of {run.rows} token rows and its {n} word rows")
        values = self.units.pooled(run, layers, rows, words, options["word_pool"],
                             then=partial(_word_value, metric=metric, offsets=offsets, options=options))
        notes = [f"{n} words of {texts} texts ({options['word_pool']} of each word's tokens)"]
        if metric in PER_TEXT and enough < texts:
            notes.append(f"{texts - enough} texts had fewer than {least} words and were skipped")
        scalar = {"prompts": float(enough)} if metric in PER_TEXT else {"n": float(n)}
        return {"values": np.asarray(values, dtype=np.float64)}, {**scalar, "words": float(n)}, notes
