"""Datasets from Parquet files, Arrow split files and Hugging Face save_to_disk folders, registered
through a real server: the same texts, labels and ids give the digest the CSV and JSONL give."""

from __future__ import annotations

import csv
import json

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from actstore.errors import InvalidArgument

TEXTS = ["the cat sat", "a dog ran", "birds fly south", "rain, again", "ünïcode ok", "last one"]
LABELS = ["pos", "neg", "pos", "neg", "neg", "pos"]
IDS = [f"doc-{i}" for i in range(len(TEXTS))]


def _csv(path, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def _rows():
    return [{"review": t, "sentiment": lab, "key": i} for t, lab, i in zip(TEXTS, LABELS, IDS)]


def _hf(rows) -> datasets.Dataset:
    return datasets.Dataset.from_dict({k: [r[k] for r in rows] for k in rows[0]})


@pytest.fixture
def reference(client, tmp_path):
    """The digest of the texts registered as CSV (and checked against JSONL)."""
    opts = {"text_column": "review", "label_column": "sentiment", "id_column": "key"}
    from_csv = client.register_dataset(_csv(tmp_path / "ref.csv", _rows()), **opts)
    jsonl = tmp_path / "ref.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in _rows()), encoding="utf-8")
    assert client.register_dataset(jsonl, **opts).digest == from_csv.digest
    return from_csv, opts


def test_parquet_arrow_and_folders_match_the_csv_digest(client, tmp_path, reference):
    expected, opts = reference
    rows = _rows()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "reviews.parquet")
    _hf(rows).save_to_disk(str(tmp_path / "hf-folder"))
    datasets.DatasetDict({"train": _hf(rows), "test": _hf(rows[:2])}).save_to_disk(str(tmp_path / "hf-dict"))
    arrow = next((tmp_path / "hf-folder").glob("*.arrow"))

    got = {
        "parquet": client.register_dataset(tmp_path / "reviews.parquet", **opts),
        "folder": client.register_dataset(tmp_path / "hf-folder", **opts),
        "dict split": client.register_dataset(tmp_path / "hf-dict", split="train", **opts),
        "arrow file": client.register_dataset(arrow, **opts),
    }
    for how, dataset in got.items():
        assert dataset.digest == expected.digest, how
        assert dataset.n == len(TEXTS) and dataset.num_labels == 2
    assert "reviews" in got["parquet"].aliases and "hf-folder" in got["folder"].aliases


def test_limit_keeps_the_first_rows_as_for_csv(client, tmp_path):
    rows = _rows()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "r.parquet")
    _hf(rows).save_to_disk(str(tmp_path / "folder"))
    opts = {"text_column": "review", "limit": 3, "seed": 5}
    expected = client.register_dataset(_csv(tmp_path / "r.csv", rows), **opts)
    assert expected.n == 3
    assert client.register_dataset(tmp_path / "r.parquet", **opts).digest == expected.digest
    assert client.register_dataset(tmp_path / "folder", **opts).digest == expected.digest


def test_class_label_names_are_kept(client, tmp_path):
    features = datasets.Features({"text": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["neg", "neutral", "pos"])})
    data = datasets.Dataset.from_dict({"text": TEXTS[:3], "label": [2, 0, 2]}, features=features)
    data.save_to_disk(str(tmp_path / "labelled"))
    data.to_parquet(str(tmp_path / "labelled.parquet"))
    for path in (tmp_path / "labelled", tmp_path / "labelled.parquet"):
        registered = client.register_dataset(path, label_column="label")
        assert registered.num_labels == 3  # the class names count, not the largest label + 1
    plain = client.register_dataset(texts=TEXTS[:3], labels=[2, 0, 2])
    assert registered.digest == plain.digest  # names are not identity


def test_augmentation_uses_the_seed_as_for_csv(client, tmp_path):
    rows = _rows()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "r.parquet")
    opts = {"text_column": "review", "augment_views": 2, "seed": 3}
    expected = client.register_dataset(_csv(tmp_path / "r.csv", rows), **opts)
    assert client.register_dataset(tmp_path / "r.parquet", **opts).digest == expected.digest
    other = client.register_dataset(tmp_path / "r.parquet", **{**opts, "seed": 4}, name="r-seed4")
    assert other.digest != expected.digest


def test_bad_columnar_inputs_are_invalid_argument(client, tmp_path):
    pq.write_table(pa.Table.from_pylist(_rows()), tmp_path / "r.parquet")
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), tmp_path / "empty.parquet")
    pq.write_table(pa.table({"text": [1, 2, 3]}), tmp_path / "numbers.parquet")
    pq.write_table(pa.table({"text": ["a", "b"], "label": [0.5, 1.5]}), tmp_path / "float-labels.parquet")
    pq.write_table(pa.table({"text": ["a", None]}), tmp_path / "null.parquet")
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"PAR1" + b"\x00garbage" * 20)
    _hf(_rows()).save_to_disk(str(tmp_path / "folder"))
    datasets.DatasetDict({"train": _hf(_rows()), "test": _hf(_rows())}).save_to_disk(str(tmp_path / "dict"))

    cases = [
        (tmp_path / "r.parquet", {}, "no column 'text'"),
        (tmp_path / "r.parquet", {"text_column": "review", "label_column": "stars"}, "no column 'stars'"),
        (tmp_path / "empty.parquet", {}, "dataset is empty"),
        (tmp_path / "numbers.parquet", {}, "holds int64, not text"),
        (tmp_path / "float-labels.parquet", {"label_column": "label"}, "holds double, not integers or strings"),
        (tmp_path / "null.parquet", {}, "row 1 has no value in column 'text'"),
        (corrupt, {}, "cannot read"),
        (tmp_path / "folder", {}, "no column 'text'"),
        (tmp_path / "folder", {"text_column": "review", "split": "train"}, "has no splits"),
        (tmp_path / "dict", {"text_column": "review"}, "pick one with split"),
        (tmp_path / "dict", {"text_column": "review", "split": "valid"}, "no split 'valid'"),
        (tmp_path / "r.csv", {"split": "train"}, "has no splits"),
    ]
    _csv(tmp_path / "r.csv", [{"text": "a"}])
    for path, opts, message in cases:
        with pytest.raises(InvalidArgument, match=message):
            client.register_dataset(path, **opts)


def test_folders_and_parquet_register_under_auth_with_redacted_errors(tmp_path, ray_cluster):
    from actstore.client import Client
    from actstore.server.app import start_server
    from actstore.server.auth import create_token
    from tests.conftest import make_settings

    running = start_server(make_settings(tmp_path / "store", auth=True))
    try:
        _hf(_rows()).save_to_disk(str(tmp_path / "folder"))
        pq.write_table(pa.table({"text": [7, 8]}), tmp_path / "hunter2.parquet")
        with Client(f"127.0.0.1:{running.port}", token=create_token(running.service.catalog, "ada", "admin")) as c:
            assert c.register_dataset(tmp_path / "folder", text_column="review").n == len(TEXTS)
            with pytest.raises(InvalidArgument) as info:
                c.register_dataset(tmp_path / "hunter2.parquet")
            message = str(info.value)
            assert "is not a usable dataset file" in message and "int64" not in message and "incident" in message
    finally:
        running.stop()
