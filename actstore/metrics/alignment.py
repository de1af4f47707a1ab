"""Cross-tokenizer alignment: token rows of two tokenizations of the same texts, aggregated to the
words both share (docs/metrics.md, "Cross-tokenizer alignment").

A word is a maximal run of non-whitespace characters of the text (`str.split` words, with their
character spans). A token belongs to the word its character span [start, end) overlaps first;
special tokens (empty spans) and tokens over whitespace only belong to no word. A word's vector
is the mean of its tokens' vectors ("mean") or its last token's ("last", the last-subword
convention). Rows of an aligned comparison are the (sample, word) pairs that both tokenizations
reach (truncation at max_len may drop a text's last words in one of them), in text order.
"""

from __future__ import annotations

import re
from itertools import pairwise
from typing import Literal

import numpy as np

WordPool = Literal["mean", "last"]

_WORD = re.compile(r"\S+")


def word_spans(text: str) -> np.ndarray:
    """(W, 2) character spans [start, end) of the whitespace-delimited words of `text`."""
    return np.array([m.span() for m in _WORD.finditer(text)], dtype=np.int64).reshape(-1, 2)


def token_words(spans: np.ndarray, words: np.ndarray) -> np.ndarray:
    """For each token span (T, 2), the index of the first word it overlaps, or -1."""
    spans = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
    out = np.full(len(spans), -1, dtype=np.int64)
    if len(words) == 0:
        return out
    for t, (start, end) in enumerate(spans):
        if end > start:
            hit = np.flatnonzero((words[:, 0] < end) & (words[:, 1] > start))
            if hit.size:
                out[t] = hit[0]
    return out


def word_rows(texts: list[str], spans: np.ndarray, offsets: np.ndarray) -> dict[tuple[int, int], list[int]]:
    """{(sample, word): the token rows of that word} over a token-level run's rows."""
    rows: dict[tuple[int, int], list[int]] = {}
    for sample, (lo, hi) in enumerate(pairwise(np.asarray(offsets).tolist())):
        for k, word in enumerate(token_words(spans[lo:hi], word_spans(texts[sample]))):
            if word >= 0:
                rows.setdefault((sample, int(word)), []).append(lo + k)
    return rows


def common_words(rows_a: dict, rows_b: dict) -> list[tuple[int, int]]:
    """The (sample, word) pairs both tokenizations reach, in text order."""
    return sorted(rows_a.keys() & rows_b.keys())


def pooling_matrix(rows: dict, pairs: list[tuple[int, int]], how: WordPool) -> tuple[np.ndarray, np.ndarray,
                                                                                       np.ndarray]:
    """A sparse pooling (row index, token row, weight) triple: aligned row i is
    `sum_k weight_k * tokens[token_row_k]` over the entries with row index i."""
    if how not in ("mean", "last"):
        raise ValueError(f"word pooling must be 'mean' or 'last', got {how!r}")
    index, token, weight = [], [], []
    for i, pair in enumerate(pairs):
        members = rows[pair] if how == "mean" else rows[pair][-1:]
        index.extend([i] * len(members))
        token.extend(members)
        weight.extend([1.0 / len(members)] * len(members))
    return np.asarray(index, np.int64), np.asarray(token, np.int64), np.asarray(weight, np.float64)


def pool_rows(tokens: np.ndarray, pooling: tuple[np.ndarray, np.ndarray, np.ndarray], n_rows: int) -> np.ndarray:
    """The (n_rows, d) float64 aligned matrix of `tokens` (T, d) under `pooling_matrix`'s triple."""
    index, token, weight = pooling
    out = np.zeros((n_rows, tokens.shape[1]))
    np.add.at(out, index, tokens[token].astype(np.float64) * weight[:, None])
    return out
