"""Independent computations of cross-tokenizer units from tokenizers' own offset mappings, for the
alignment tests (the library's `metrics.alignment` is not used here)."""

from __future__ import annotations

import numpy as np


def words_of(text: str) -> list[tuple[int, int]]:
    """Character spans of the whitespace-delimited words of `text`."""
    spans, at = [], 0
    for word in text.split():
        start = text.index(word, at)
        spans.append((start, start + len(word)))
        at = start + len(word)
    return spans


def word_units(text: str, offsets) -> dict[int, list[int]]:
    """{word: the indices of the tokens whose span overlaps it first}."""
    out: dict[int, list[int]] = {}
    words = words_of(text)
    for t, (start, end) in enumerate(offsets):
        hit = [w for w, (ws, we) in enumerate(words) if end > start and ws < end and we > start]
        if hit:
            out.setdefault(hit[0], []).append(t)
    return out


def span_units(text: str, offsets_a, offsets_b) -> list[tuple[list[int], list[int]]]:
    """The units both tokenizations share, by characters: non-space characters of one token are
    joined (union-find), so are those of every token of either side; a group of characters is a
    unit when every character of it is covered by a token of both sides. Returns, in text order,
    each unit's token indices in A and in B."""
    parent = list(range(len(text)))

    def root(c: int) -> int:
        while parent[c] != c:
            parent[c] = parent[parent[c]]
            c = parent[c]
        return c

    covered: list[dict[int, set[int]]] = [{}, {}]
    for side, offsets in enumerate((offsets_a, offsets_b)):
        for t, (start, end) in enumerate(offsets):
            chars = [c for c in range(start, end) if not text[c].isspace()]
            for c in chars:
                covered[side].setdefault(c, set()).add(t)
                parent[root(c)] = root(chars[0])
    groups: dict[int, list[int]] = {}
    for c in sorted(covered[0].keys() | covered[1].keys()):
        groups.setdefault(root(c), []).append(c)
    units = []
    for chars in sorted(groups.values()):
        if all(c in covered[0] and c in covered[1] for c in chars):
            units.append(tuple(sorted(set().union(*(covered[side][c] for c in chars))) for side in (0, 1)))
    return units


def pool(z: np.ndarray, members: list[list[int]], how: str) -> np.ndarray:
    """Rows of `z` (float64) pooled per unit: the mean of its rows or its last row."""
    z = np.asarray(z, dtype=np.float64)
    return np.stack([z[rows].mean(axis=0) if how == "mean" else z[rows[-1]] for rows in members])
