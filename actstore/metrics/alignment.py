"""Cross-tokenizer alignment: token rows of two tokenizations of the same texts, aggregated to the
words both share, or to the finest spans both share (docs/metrics.md, "Cross-tokenizer alignment").

A word is a maximal run of non-whitespace characters of the text (`str.split` words, with their
character spans). A token belongs to the word its character span [start, end) overlaps first;
special tokens (empty spans) and tokens over whitespace only belong to no word. A word's vector
is the mean of its tokens' vectors ("mean") or its last token's ("last", the last-subword
convention). Rows of an aligned comparison are the (sample, word) pairs that both tokenizations
reach (truncation at max_len may drop a text's last words in one of them), in text order.

A shared span (`span_rows`) is the finest unit both tokenizations can be cut at: token spans are
trimmed of surrounding whitespace (special tokens and whitespace-only tokens drop out), tokens of
either tokenization whose trimmed spans overlap are joined (transitively), and each joined group
is a unit, its span the union of its members'. It is kept when both tokenizations have a token in
it and their tokens cover the same extent [first start, last end) (a unit cut by one side's
truncation is left out). Units are at most as coarse as whitespace words and finer where both
tokenizations split inside a word (punctuation, "don't" -> "don" "'t" in both).
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


def trimmed_spans(text: str, spans: np.ndarray) -> np.ndarray:
    """Token spans (T, 2) without their leading and trailing whitespace; (0, 0) where a token
    covers no non-whitespace character (special tokens, spaces)."""
    out = np.zeros((len(spans), 2), dtype=np.int64)
    for t, (start, end) in enumerate(np.asarray(spans, dtype=np.int64).reshape(-1, 2).tolist()):
        piece = text[start:end]
        inner = piece.lstrip()
        if inner.strip():
            first = start + len(piece) - len(inner)
            out[t] = first, first + len(inner.rstrip())
    return out


def shared_spans(text: str, spans_a: np.ndarray, spans_b: np.ndarray) -> list[tuple[list[int], list[int]]]:
    """The units both tokenizations of `text` share (module docstring), in text order: for each,
    the token indices of A and of B in it (ascending)."""
    members = [(start, end, side, t) for side, spans in enumerate((spans_a, spans_b))
               for t, (start, end) in enumerate(trimmed_spans(text, spans).tolist()) if end > start]
    members.sort()
    groups: list[list[tuple[int, int, int, int]]] = []
    reach = -1
    for member in members:  # sorted by start: a member joins the group it overlaps
        if groups and member[0] < reach:
            groups[-1].append(member)
            reach = max(reach, member[1])
        else:
            groups.append([member])
            reach = member[1]
    units = []
    for group in groups:
        sides = [[m for m in group if m[2] == side] for side in (0, 1)]
        extents = {(min(m[0] for m in side), max(m[1] for m in side)) for side in sides if side}
        if all(sides) and len(extents) == 1:
            units.append(tuple(sorted(m[3] for m in side) for side in sides))
    return units


def span_rows(texts: list[str], spans_a: np.ndarray, offsets_a: np.ndarray, spans_b: np.ndarray,
              offsets_b: np.ndarray) -> tuple[dict, dict]:
    """{(sample, unit): token rows} of run A and of run B over the spans both share (same keys)."""
    rows_a: dict[tuple[int, int], list[int]] = {}
    rows_b: dict[tuple[int, int], list[int]] = {}
    bounds = zip(pairwise(np.asarray(offsets_a).tolist()), pairwise(np.asarray(offsets_b).tolist()))
    for sample, ((lo_a, hi_a), (lo_b, hi_b)) in enumerate(bounds):
        for unit, (in_a, in_b) in enumerate(shared_spans(texts[sample], spans_a[lo_a:hi_a], spans_b[lo_b:hi_b])):
            rows_a[sample, unit] = [lo_a + t for t in in_a]
            rows_b[sample, unit] = [lo_b + t for t in in_b]
    return rows_a, rows_b


def unit_offsets(pairs: list[tuple[int, int]], samples: int) -> np.ndarray:
    """(samples + 1,) offsets of the aligned rows of each sample: `pairs` (in text order) of
    sample i are rows offsets[i]:offsets[i+1] (the per-prompt layout of a token-level run)."""
    counts = np.bincount(np.asarray([sample for sample, _ in pairs], dtype=np.int64), minlength=samples)
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


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
