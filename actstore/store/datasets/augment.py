"""Text augmentations for the invariance metrics (InfoNCE, DiME, LiDAR; METRICS.md).

``augment_texts`` makes seeded views of every text (EDA, Wei & Zou 2019) and marks the views of one
text as one group.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np

from actstore.errors import InvalidArgument
from actstore.store.datasets.core import (
    DatasetData,
    check_seed,
    dataset_digest,
    is_positive_int,
)

AUGMENT_METHODS = ("word-dropout", "word-swap")


def augment_texts(
    data: DatasetData,
    n_views: int = 2,
    method: str = "word-dropout",
    rate: float = 0.1,
    seed: int = 0,
) -> DatasetData:
    """``n_views`` seeded augmentations of every text, for the augmentation-invariance metrics.

    Row ``i * n_views + k`` is view ``k`` of original row ``i``: sample id ``"<id>#aug<k>"``,
    ``groups[i * n_views + k] = i`` (the index of the original in ``data``), the original's label.
    The originals themselves are not included. Texts are split on whitespace and rejoined with
    single spaces. Methods (EDA, Wei & Zou 2019):

    - ``"word-dropout"``: every word is deleted independently with probability ``rate``
      (0 <= rate < 1); when all words would go, one random word is kept.
    - ``"word-swap"``: ``max(1, round(rate * w))`` times, two random positions are swapped
      (w = word count; 0 <= rate <= 1; ``rate = 0`` swaps nothing; texts of one word are unchanged).

    Each view's randomness is seeded by (``seed``, method, rate, sample id, k) alone, so a view does
    not depend on the other rows: augmenting a subset gives the same views as subsetting the
    augmented set. Different views of one text may coincide (short texts, low rates).
    """
    if data.kind != "text" or data.texts is None:
        raise InvalidArgument("augment_texts needs a text dataset; this one holds images")
    if method not in AUGMENT_METHODS:
        raise InvalidArgument(
            f"unknown augmentation {method!r}; use one of {', '.join(AUGMENT_METHODS)}"
        )
    if not is_positive_int(n_views):
        raise InvalidArgument(f"n_views must be a positive integer, not {n_views!r}")
    check_seed(seed)
    try:
        rate = float(rate)
    except (TypeError, ValueError):
        raise InvalidArgument(f"rate must be a number, not {rate!r}") from None
    top_ok = rate < 1.0 if method == "word-dropout" else rate <= 1.0
    if not (math.isfinite(rate) and rate >= 0.0 and top_ok):
        bound = "0 <= rate < 1" if method == "word-dropout" else "0 <= rate <= 1"
        raise InvalidArgument(f"rate for {method} must satisfy {bound}, not {rate!r}")

    texts: list[str] = []
    ids: list[str] = []
    groups: list[int] = []
    for i, (text, sid) in enumerate(zip(data.texts, data.sample_ids)):
        words = text.split()
        for k in range(int(n_views)):
            rng = _view_rng(int(seed), method, rate, sid, k)
            if method == "word-dropout":
                view = _word_dropout(words, rate, rng)
            else:
                view = _word_swap(words, rate, rng)
            texts.append(" ".join(view))
            ids.append(f"{sid}#aug{k}")
            groups.append(i)
    labels = None if data.labels is None else np.repeat(data.labels, int(n_views))
    return DatasetData(
        kind="text",
        texts=texts,
        labels=labels,
        label_names=data.label_names,
        sample_ids=ids,
        groups=np.asarray(groups, dtype=np.int64),
        source={
            "augment": {"method": method, "n_views": int(n_views), "rate": rate, "seed": int(seed)},
            "of": data.source,
            "of_digest": dataset_digest(data),
        },
    )


def _view_rng(seed: int, method: str, rate: float, sample_id: str, k: int) -> np.random.Generator:
    text = f"{seed}\x00{method}\x00{rate!r}\x00{sample_id}\x00{k}"
    key = hashlib.sha256(text.encode("utf-8", "surrogatepass"))
    return np.random.default_rng(np.frombuffer(key.digest()[:16], dtype="<u4").tolist())


def _word_dropout(words: list[str], rate: float, rng: np.random.Generator) -> list[str]:
    if not words:
        return []
    keep = rng.random(len(words)) >= rate
    if not keep.any():
        keep[int(rng.integers(len(words)))] = True
    return [w for w, kept in zip(words, keep) if kept]


def _word_swap(words: list[str], rate: float, rng: np.random.Generator) -> list[str]:
    out = list(words)
    if len(out) < 2 or rate == 0.0:
        return out
    for _ in range(max(1, round(rate * len(out)))):
        a, b = rng.choice(len(out), size=2, replace=False)
        out[a], out[b] = out[b], out[a]
    return out
