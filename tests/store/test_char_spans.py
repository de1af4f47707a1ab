"""A token-level run's character spans: a (rows, 2) int32 side array with a crc32c, absent
(None) for runs captured before they were stored."""

from __future__ import annotations

import numpy as np
import pytest

from actstore.errors import DataLoss
from actstore.store.format.arrays import ZarrArrayStore
from actstore.store.testing.runs import key, token_layout
from actstore.store.upkeep.scrub import check_run


def test_char_spans_round_trip_and_are_checksummed(tmp_path):
    store = ZarrArrayStore(tmp_path / "store")
    offsets = np.array([0, 6, 13], dtype=np.int64)
    layout = token_layout(offsets)
    store.create_run(key("spans"), layout, [f"s{i}" for i in range(layout.n)], None, offsets)
    assert store.char_spans(key("spans")) is None  # as for a run captured before spans existed
    spans = np.stack([np.arange(13), np.arange(13) + 3], axis=1)
    store.write_char_spans(key("spans"), spans)
    back = ZarrArrayStore(tmp_path / "store").char_spans(key("spans"))
    assert back.dtype == np.int32 and np.array_equal(back, spans)
    with pytest.raises(ValueError, match="rows, 2"):
        store.write_char_spans(key("spans"), spans[:5])
    chunk = next(p for p in (tmp_path / "store" / "runs" / key("spans") / "char_spans" / "c").rglob("*")
                 if p.is_file())
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(DataLoss, match="char_spans"):
        ZarrArrayStore(tmp_path / "store").char_spans(key("spans"))
    # the scrub (actstore verify) reports it
    findings = check_run(ZarrArrayStore(tmp_path / "store"), key("spans"), layout, committed=False)
    assert [f.array for f in findings] == ["char_spans"]
