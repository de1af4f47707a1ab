"""Cross-tokenizer units (`metrics.alignment`): shared spans against an independent character-level
union-find and against the common-boundary definition, word offsets, whitespace trimming."""

from __future__ import annotations

import numpy as np
import pytest

from actstore.metrics.alignment import (
    pool_rows,
    pooling_matrix,
    shared_spans,
    span_rows,
    trimmed_spans,
    unit_offsets,
    word_rows,
)
from tests.alignment_formulas import pool, span_units, word_units, words_of

WORDS = ["cat", "dog's", "mat,", "ran", "slowly.", "a", "don't", "big"]


def random_text(rng) -> str:
    return " ".join(rng.choice(WORDS, size=int(rng.integers(1, 9))).tolist())


def cut(text: str, rng, leading_space: bool) -> tuple[np.ndarray, set[int]]:
    """A tokenization of `text`: every word cut at random inner points, a special token (0, 0)
    first; with leading_space a word's first token also covers the space before it (byte-level
    BPE style). Returns the spans and the cut points inside words."""
    spans, cuts = [(0, 0)], set()
    for start, end in words_of(text):
        inner = sorted(int(c) for c in rng.choice(np.arange(start + 1, end), size=rng.integers(0, end - start),
                                                   replace=False)) if end - start > 1 else []
        cuts.update(inner)
        bounds = [start, *inner, end]
        for k, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            spans.append((lo - 1 if leading_space and k == 0 and lo > 0 else lo, hi))
    return np.asarray(spans, dtype=np.int64), cuts


def test_trimmed_spans_drop_whitespace_and_special_tokens():
    text = "ab  cd"
    got = trimmed_spans(text, np.array([[0, 0], [0, 2], [2, 5], [3, 4], [2, 4]]))
    assert got.tolist() == [[0, 0], [0, 2], [4, 5], [0, 0], [0, 0]]


@pytest.mark.parametrize("seed", range(20))
def test_shared_spans_match_the_character_union_find_and_the_common_boundaries(seed):
    rng = np.random.default_rng(seed)
    text = random_text(rng)
    spans_a, cuts_a = cut(text, rng, leading_space=False)
    spans_b, cuts_b = cut(text, rng, leading_space=True)
    units = shared_spans(text, spans_a, spans_b)
    assert units == span_units(text, spans_a.tolist(), spans_b.tolist())
    # the definition: units lie between consecutive boundaries common to both tokenizations
    # (word edges are boundaries of both), so there are words + common inner cuts of them
    assert len(units) == len(words_of(text)) + len(cuts_a & cuts_b)
    assert all(0 not in a and 0 not in b for a, b in units)  # the special tokens belong to none
    for in_a, in_b in units:  # a unit is the same characters on both sides
        assert spans_a[in_a[0], 0] + (text[spans_a[in_a[0], 0]] == " ") == spans_b[in_b[0], 0] + (
            text[spans_b[in_b[0], 0]] == " ")
        assert spans_a[in_a[-1], 1] == spans_b[in_b[-1], 1]


def test_a_unit_cut_by_truncation_on_one_side_is_left_out():
    text = "slowly ran"
    a = np.array([[0, 3], [3, 6], [7, 10]])  # "slo" "wly" "ran"
    b = np.array([[0, 4]])  # "slow", then truncated
    assert shared_spans(text, a, b) == []
    assert shared_spans(text, a, np.array([[0, 6], [7, 9]])) == [([0, 1], [0])]
    # several byte tokens of one character (same span) join one unit
    assert shared_spans("é x", np.array([[0, 1], [0, 1], [2, 3]]), np.array([[0, 1], [2, 3]])) == [
        ([0, 1], [0]), ([2], [1])]


def test_span_rows_give_both_runs_the_same_keys_over_global_rows():
    rng = np.random.default_rng(5)
    texts = [random_text(rng) for _ in range(4)]
    cuts = [(cut(t, rng, False)[0], cut(t, rng, True)[0]) for t in texts]
    offsets_a = np.cumsum([0] + [len(a) for a, _ in cuts])
    offsets_b = np.cumsum([0] + [len(b) for _, b in cuts])
    rows_a, rows_b = span_rows(texts, np.concatenate([a for a, _ in cuts]), offsets_a,
                               np.concatenate([b for _, b in cuts]), offsets_b)
    assert rows_a.keys() == rows_b.keys()
    for sample, (a, b) in enumerate(cuts):
        units = span_units(texts[sample], a.tolist(), b.tolist())
        for unit, (in_a, in_b) in enumerate(units):
            assert rows_a[sample, unit] == [offsets_a[sample] + t for t in in_a]
            assert rows_b[sample, unit] == [offsets_b[sample] + t for t in in_b]
        assert (sample, len(units)) not in rows_a


@pytest.mark.parametrize("how", ["mean", "last"])
def test_word_pooling_and_offsets_match_an_independent_pooling(how):
    rng = np.random.default_rng(3)
    texts = [random_text(rng) for _ in range(5)] + ["alone"]
    spans = [cut(t, rng, True)[0] for t in texts]
    offsets = np.cumsum([0] + [len(s) for s in spans])
    tokens = rng.standard_normal((int(offsets[-1]), 6)).astype(np.float32)
    rows = word_rows(texts, np.concatenate(spans), offsets)
    pairs = sorted(rows)
    pooled = pool_rows(tokens, pooling_matrix(rows, pairs, how), len(pairs))
    expected, counts = [], []
    for sample, text in enumerate(texts):
        units = word_units(text, spans[sample].tolist())
        expected.append(pool(tokens[offsets[sample]:], [units[w] for w in sorted(units)], how))
        counts.append(len(units))
    np.testing.assert_allclose(pooled, np.concatenate(expected), rtol=0, atol=1e-12)
    assert unit_offsets(pairs, len(texts)).tolist() == np.cumsum([0, *counts]).tolist()
    assert unit_offsets([(0, 0), (2, 0), (2, 1)], 4).tolist() == [0, 1, 1, 3, 3]  # a text without words
