"""What every query over cross-tokenizer units needs (`metrics.alignment`): token-level runs, the
texts they cover, each token's character span, the token rows of each word, and whole layers
pooled to those units in one Ray task. The aligned similarity (`aligned`) and the word-level
entropy family (`word_entropy`) hold one (`TokenUnits`, composed, not inherited)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from actstore.errors import FailedPrecondition, InvalidArgument
from actstore.metrics import alignment as align
from actstore.server.planners import QueryParts
from actstore.store.catalog import RunRecord
from actstore.store.datasets import load_dataset


def _pool_then(tokens: np.ndarray, pooling: tuple, n_rows: int, then: Callable | None):
    """A whole layer's token rows pooled to the units (`alignment.pool_rows`), then `then` of them."""
    pooled = align.pool_rows(tokens, pooling, n_rows)
    return pooled if then is None else then(pooled)


class TokenUnits:
    """What a planner whose rows are units of the text (words, shared spans) pooled from token rows
    needs: the store's texts, spans and offsets, and the pooling task."""

    def __init__(self, parts: QueryParts) -> None:
        self.parts = parts

    def require_tokens(self, flag: str, *runs: RunRecord) -> None:
        """INVALID_ARGUMENT unless every run is token-level (`--pooling tokens`)."""
        if any(run.pooling != "tokens" for run in runs):
            pooled = next(run for run in runs if run.pooling != "tokens")
            raise InvalidArgument(f"{flag} aggregates token rows to units of the text, and run "
                                  f"{pooled.run_key[:12]} is pooled '{pooled.pooling}': capture with --pooling tokens")

    def texts(self, run: RunRecord) -> list[str]:
        folder = self.parts.catalog.datasets.get(run.dataset_digest).path
        return list(load_dataset(self.parts.executor.store.local(folder)).texts)

    def same_texts(self, a: RunRecord, b: RunRecord) -> list[str]:
        """The texts both runs cover: one dataset, or the same sample ids with the same texts;
        otherwise INVALID_ARGUMENT naming the first sample that differs."""
        texts = self.texts(a)
        if a.dataset_digest == b.dataset_digest:
            return texts
        sample_ids = self.parts.arrays.sample_ids
        for name, mine, theirs in [("sample", sample_ids(a.run_key), sample_ids(b.run_key)),
                                   ("text of sample", texts, self.texts(b))]:
            if mine != theirs:
                first = next((i for i, (x, y) in enumerate(zip(mine, theirs)) if x != y), min(len(mine), len(theirs)))
                in_a, in_b = (repr(v[first][:60]) if first < len(v) else "missing" for v in (mine, theirs))
                raise InvalidArgument(f"runs {a.run_key[:12]} and {b.run_key[:12]} do not cover the same texts: "
                                      f"{name} {first} is {in_a} in A and {in_b} in B. Capture both models on the "
                                      "same dataset")
        return texts

    def spans(self, run: RunRecord) -> np.ndarray:
        """The run's per-token character spans, or FAILED_PRECONDITION when it has none."""
        spans = self.parts.arrays.char_spans(run.run_key)
        if spans is None:
            raise FailedPrecondition(f"run {run.run_key[:12]} has no character spans (captured before they were "
                                     "stored, or its tokenizer gives no offsets): delete it and capture it again "
                                     "with a fast tokenizer")
        return spans

    def word_rows(self, run: RunRecord, texts: list[str]) -> dict:
        """{(sample, word): token rows} of the run (`alignment.word_rows`)."""
        return align.word_rows(texts, self.spans(run), self.parts.arrays.offsets(run.run_key))

    def pooled(self, run: RunRecord, layers: list[int], rows: dict, units: list[tuple[int, int]], how: str,
               then: Callable | None = None) -> list:
        """Per layer, the (len(units), d) float64 matrix of the units' vectors (`how`: mean or last
        of their tokens), or `then` of it, computed in one task next to the data."""
        pooling = align.pooling_matrix(rows, units, how)
        return self.parts.executor.evaluate_layers(run.run_key, layers, partial(_pool_then, pooling=pooling,
                                                                                n_rows=len(units), then=then))
