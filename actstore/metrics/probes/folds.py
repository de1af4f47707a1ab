"""The folds of a probe and its control task, both fixed by the sample ids (and groups) alone.

METRICS.md, "Probes": k folds from the sample ids by a fixed, documented rule, the same for every
run of a dataset, so that layers and models are compared on identical splits, and samples of one
group share a fold. The rule (`FOLD_RULE`), which anyone can rebuild from the ids:

1. A *unit* is a sample (key: its sample id) or, where the dataset has groups (augmented views
   of one prompt), a group (key: ``group:<id>``); a group takes the class of its first sample.
2. Each unit's rank key is the first 8 bytes, big-endian, of sha256(``actstore-folds-v1:`` + key).
3. The units of each class (classes in ascending order; a continuous target is one class) are
   sorted by rank key (ties by key) and dealt round-robin to folds 0..k-1, the deal continuing
   from one class to the next, so every fold holds floor or ceil of each class's units
   (stratified) and the folds' sizes differ by at most one unit overall.

The control task (Hewitt and Liang 2019) relabels the units by a seeded permutation of their
labels: class sizes (or the multiset of values) are kept, the link to the inputs is not.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

FOLD_RULE = ("actstore-folds-v1: units (samples; groups where the dataset has them, with their first sample's "
             "class) sorted within each class by the first 8 bytes of sha256('actstore-folds-v1:' + unit key) "
             "(key: the sample id, or 'group:<id>'), dealt round-robin to folds 0..k-1 in class order, the deal "
             "continuing across classes")
_SALT = b"actstore-folds-v1:"


def rank_key(key: str) -> int:
    """The unit's place in its class's deal (the rule's step 2)."""
    return int.from_bytes(hashlib.sha256(_SALT + key.encode("utf-8", "surrogatepass")).digest()[:8], "big")


def units_of(sample_ids: Sequence[str], groups: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(unit index of each sample, each unit's first sample, each unit's key), the units numbered
    in order of their first sample."""
    if groups is None:
        every = np.arange(len(sample_ids))
        return every, every, [str(s) for s in sample_ids]
    values, first, inverse = np.unique(np.asarray(groups), return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    renumber = np.empty(len(values), dtype=np.int64)
    renumber[order] = np.arange(len(values))
    return renumber[inverse.ravel()], first[order], [f"group:{int(values[u])}" for u in order]


def assign_folds(sample_ids: Sequence[str], folds: int, classes: np.ndarray | None = None,
                 groups: np.ndarray | None = None) -> np.ndarray:
    """The fold (0..folds-1) of every sample by `FOLD_RULE`; `classes` (int codes, one per
    sample) stratifies, None for a continuous target; samples of one group share a fold."""
    if folds < 2:
        raise ValueError(f"folds must be >= 2, got {folds}")
    unit, first, keys = units_of(sample_ids, groups)
    stratum = np.zeros(len(keys), dtype=np.int64) if classes is None else np.asarray(classes)[first]
    ranks = [rank_key(key) for key in keys]
    unit_fold = np.empty(len(keys), dtype=np.int64)
    dealt = 0
    for value in np.unique(stratum):
        members = np.flatnonzero(stratum == value)
        ordered = sorted(members, key=lambda u: (ranks[u], keys[u]))
        unit_fold[ordered] = (dealt + np.arange(len(ordered))) % folds
        dealt += len(ordered)
    return unit_fold[unit]


def control_labels(values: np.ndarray, sample_ids: Sequence[str], seed: int,
                   groups: np.ndarray | None = None) -> np.ndarray:
    """The control task's labels: the units' labels (each unit's first sample's) permuted by a
    generator seeded with `seed`, each sample taking its unit's new label. Class sizes (counted
    in units) and the multiset of values are kept."""
    unit, first, keys = units_of(sample_ids, groups)
    own = np.asarray(values)[first]
    permuted = own[np.random.default_rng(seed).permutation(len(own))]
    return permuted[unit]
