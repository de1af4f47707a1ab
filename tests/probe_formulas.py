"""Independent reference pieces for the probe tests: the documented fold rule written out from its
text (METRICS.md, "Probes"; `metrics.probes.FOLD_RULE`), never actstore's own functions."""

from __future__ import annotations

import hashlib

import numpy as np


def folds_by_the_documented_rule(ids, k, classes=None, groups=None):
    """FOLD_RULE as its text says, written out independently: units (groups where given, with their
    first sample's class) sorted per class by sha256('actstore-folds-v1:' + key)[:8] big-endian,
    dealt round-robin in class order, the deal continuing across classes."""
    units: dict[str, list[int]] = {}
    for i, sample in enumerate(ids):
        units.setdefault(f"group:{int(groups[i])}" if groups is not None else sample, []).append(i)
    by_class: dict[int, list[str]] = {}
    for key, members in units.items():
        by_class.setdefault(0 if classes is None else int(classes[members[0]]), []).append(key)
    fold = np.empty(len(ids), dtype=np.int64)
    dealt = 0
    for value in sorted(by_class):
        ordered = sorted(by_class[value], key=lambda key: (
            int.from_bytes(hashlib.sha256(b"actstore-folds-v1:" + key.encode()).digest()[:8], "big"), key))
        for rank, key in enumerate(ordered):
            fold[units[key]] = (dealt + rank) % k
        dealt += len(ordered)
    return fold
