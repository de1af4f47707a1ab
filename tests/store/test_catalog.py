"""The DuckDB catalog, on real catalog files under tmp_path."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from actstore.errors import (
    AlreadyExists,
    DataLoss,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from actstore.store.catalog import (
    CHUNK_SCHEMA,
    Catalog,
    DatasetRecord,
    JobRecord,
    ModelRecord,
    RunRecord,
)

REPO = Path(__file__).resolve().parents[2]


def digest(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def model_record(name: str, **overrides) -> ModelRecord:
    fields = {"digest": digest(name), "kind": "hf", "arch": "BertModel", "num_layers": 3, "hidden_size": 16,
              "max_positions": 64, "path": f"/models/{name}", "has_head": False,
              "lineage": {"source": name, "steps": [1, 2]}}
    return ModelRecord(**{**fields, **overrides})


def dataset_record(name: str, **overrides) -> DatasetRecord:
    fields = {"digest": digest(name), "kind": "text", "n": 10, "num_labels": 2, "has_groups": False,
              "path": f"/datasets/{name}", "source": {"builtin": name, "limit": 10}}
    return DatasetRecord(**{**fields, **overrides})


def run_record(name: str, model: str = "m", dataset: str = "d", status: str = "running", **overrides) -> RunRecord:
    fields = {"run_key": digest(name), "model_digest": digest(model), "dataset_digest": digest(dataset),
              "pooling": "mean", "dtype": "float16", "max_len": 32, "n": 10, "rows": 10, "num_layers": 3,
              "width": 16, "num_shards": 2, "status": status,
              "spec": {"pooling": "mean", "layers": [0, 1, 2, 3]}}
    return RunRecord(**{**fields, **overrides})


def chunk_table(run_key: str, shards, layers, rows: int = 5, nan=0, inf=0, lo=-1.0, hi=1.0) -> pa.Table:
    """Chunk rows as a capture task reports them (plain Python lists, int64 / float64 columns)."""
    cells = [(s, layer) for s in shards for layer in layers]
    return pa.table({
        "run_key": [run_key] * len(cells),
        "shard": [s for s, _ in cells],
        "layer": [layer for _, layer in cells],
        "rows": [rows] * len(cells),
        "checksum": [1000 * s + layer for s, layer in cells],
        "min": [lo] * len(cells),
        "max": [hi] * len(cells),
        "nan_count": [nan] * len(cells),
        "inf_count": [inf] * len(cells),
    })


@pytest.fixture
def catalog_path(tmp_path) -> Path:
    return tmp_path / "store" / "catalog.duckdb"


@pytest.fixture
def catalog(catalog_path):
    c = Catalog(catalog_path)
    yield c
    c.close()


def raw_rows(catalog: Catalog, path: Path, sql: str, params=()) -> list[tuple]:
    """Read a table the Catalog has no reader for, through a separate plain DuckDB connection."""
    catalog.close()
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute(sql, params).fetchall()
    finally:
        con.close()


# ---- opening -----------------------------------------------------------------------------
def test_open_creates_the_file_and_parent_directories(tmp_path):
    path = tmp_path / "a" / "b" / "catalog.duckdb"
    c = Catalog(path)
    c.add_model(model_record("m"))
    c.close()
    assert path.exists()
    again = Catalog(path)  # the schema is created idempotently, the data persists
    try:
        assert again.model(digest("m")).path == "/models/m"
    finally:
        again.close()


def test_second_process_gets_unavailable_with_address_hint(catalog, catalog_path):
    catalog.add_model(model_record("m"))  # the first process holds the file open
    script = textwrap.dedent(f"""
        from pathlib import Path
        from actstore.store.catalog import Catalog
        try:
            Catalog(Path({str(catalog_path)!r}))
        except Exception as exc:
            print(type(exc).__name__)
            print(exc)
        else:
            print("opened")
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    name, _, message = done.stdout.partition("\n")
    assert name == Unavailable.__name__, done.stdout
    assert "--address" in message
    assert str(catalog_path) in message
    # the first process still works
    assert catalog.model(digest("m")).digest == digest("m")


# ---- models ------------------------------------------------------------------------------
def test_model_round_trip(catalog):
    record = model_record("m", max_positions=None, has_head=True)
    catalog.add_model(record)
    assert catalog.model(record.digest) == record
    assert catalog.models() == [record]


def test_add_model_twice_keeps_the_first(catalog):
    catalog.add_model(model_record("m"))
    catalog.add_model(model_record("m", path="/elsewhere"))
    assert catalog.model(digest("m")).path == "/models/m"
    assert len(catalog.models()) == 1


def test_model_alias_and_re_pointing(catalog):
    catalog.add_model(model_record("v1"))
    catalog.add_model(model_record("v2"))
    catalog.set_model_alias("bert", digest("v1"))
    catalog.set_model_alias("bert-stable", digest("v1"))
    assert catalog.model("bert").digest == digest("v1")
    assert catalog.model("bert").aliases == ("bert", "bert-stable")
    catalog.set_model_alias("bert", digest("v2"))  # re-point
    assert catalog.model("bert").digest == digest("v2")
    assert catalog.model(digest("v2")).aliases == ("bert",)
    assert catalog.model(digest("v1")).aliases == ("bert-stable",)
    assert {m.digest: m.aliases for m in catalog.models()} == {digest("v1"): ("bert-stable",),
                                                               digest("v2"): ("bert",)}


@pytest.mark.parametrize("alias", ["", " bert", "bert ", "/abs"])
def test_invalid_model_alias(catalog, alias):
    catalog.add_model(model_record("m"))
    with pytest.raises(InvalidArgument):
        catalog.set_model_alias(alias, digest("m"))


def test_alias_with_slash_and_at_is_fine(catalog):
    catalog.add_model(model_record("m"))
    catalog.set_model_alias("team/vit-fmnist-aligned@step3000", digest("m"))
    assert catalog.model("team/vit-fmnist-aligned@step3000").digest == digest("m")


def test_model_prefix_resolution(catalog):
    catalog.add_model(model_record("m"))
    full = digest("m")
    assert catalog.model(full[:8]).digest == full
    assert catalog.model(full[:20]).digest == full
    with pytest.raises(NotFound):  # 7 characters are not enough, even when unique
        catalog.model(full[:7])


def two_digests_sharing_a_prefix(length: int = 8) -> tuple[str, str]:
    """Two real sha256 digests whose first `length` hex digits agree: make two names collide."""
    shared = ("0123456789abcdef" * 4)[:length]
    return shared + "a" + digest("first")[length + 1:], shared + "b" + digest("second")[length + 1:]


def test_ambiguous_model_prefix(catalog):
    a, b = two_digests_sharing_a_prefix(9)
    catalog.add_model(model_record("a", digest=a))
    catalog.add_model(model_record("b", digest=b))
    with pytest.raises(InvalidArgument, match="ambiguous"):
        catalog.model(a[:8])
    with pytest.raises(InvalidArgument, match="ambiguous"):
        catalog.model(a[:9])
    assert catalog.model(a[:10]).digest == a
    assert catalog.model(b[:10]).digest == b


def test_unknown_model_message(catalog):
    catalog.add_model(model_record("m"))
    with pytest.raises(NotFound) as info:
        catalog.model("no-such-model")
    message = str(info.value)
    assert "no-such-model" in message and "actstore models" in message


def test_alias_wins_over_a_digest_prefix(catalog):
    catalog.add_model(model_record("m"))
    catalog.add_model(model_record("other"))
    catalog.set_model_alias(digest("m")[:8], digest("other"))
    assert catalog.model(digest("m")[:8]).digest == digest("other")


def test_alias_to_a_missing_model(catalog):
    catalog.set_model_alias("dangling", digest("never added"))
    with pytest.raises(NotFound, match="dangling"):
        catalog.model("dangling")


@pytest.mark.parametrize("what", ["model", "dataset", "run"])
def test_prefixes_are_literal_not_like_patterns(catalog, what):
    # A prefix is a literal start of a digest. '%' and '_' are LIKE wildcards: as a prefix they
    # would match any digest and resolve to whatever single record there is.
    if what == "model":
        catalog.add_model(model_record("m"))
        lookup = catalog.model
    elif what == "dataset":
        catalog.add_dataset(dataset_record("d"))
        lookup = catalog.dataset
    else:
        catalog.add_run(run_record("r"))
        lookup = catalog.run
    for pattern in ("%%%%%%%%", "________", "%" + "_" * 7):
        with pytest.raises(NotFound):
            lookup(pattern)


# ---- datasets ----------------------------------------------------------------------------
def test_dataset_round_trip_aliases_and_prefixes(catalog):
    record = dataset_record("d", has_groups=True)
    catalog.add_dataset(record)
    catalog.add_dataset(dataset_record("d2"))
    assert catalog.dataset(record.digest) == record
    catalog.set_dataset_alias("rt", digest("d"))
    assert catalog.dataset("rt").digest == digest("d")
    assert catalog.dataset(digest("d")[:8]).aliases == ("rt",)
    catalog.set_dataset_alias("rt", digest("d2"))
    assert catalog.dataset("rt").digest == digest("d2")
    assert catalog.dataset(digest("d")).aliases == ()
    assert {d.digest for d in catalog.datasets()} == {digest("d"), digest("d2")}
    with pytest.raises(NotFound):
        catalog.dataset(digest("d")[:7])
    with pytest.raises(InvalidArgument):
        catalog.set_dataset_alias(" rt", digest("d"))


def test_ambiguous_and_unknown_dataset(catalog):
    a, b = two_digests_sharing_a_prefix()
    catalog.add_dataset(dataset_record("a", digest=a))
    catalog.add_dataset(dataset_record("b", digest=b))
    with pytest.raises(InvalidArgument, match="ambiguous"):
        catalog.dataset(a[:8])
    assert catalog.dataset(a[:9]).digest == a
    with pytest.raises(NotFound) as info:
        catalog.dataset("no-such-set")
    assert "no-such-set" in str(info.value) and "actstore datasets" in str(info.value)


def test_model_and_dataset_aliases_are_separate(catalog):
    catalog.add_model(model_record("m"))
    catalog.add_dataset(dataset_record("d"))
    catalog.set_model_alias("same-name", digest("m"))
    catalog.set_dataset_alias("same-name", digest("d"))
    assert catalog.model("same-name").digest == digest("m")
    assert catalog.dataset("same-name").digest == digest("d")


# ---- runs --------------------------------------------------------------------------------
def test_run_add_find_and_prefix(catalog):
    record = run_record("r")
    catalog.add_run(record)
    assert catalog.find_run(record.run_key) == record
    assert catalog.find_run(digest("other")) is None
    assert catalog.find_run(record.run_key[:8]) is None  # find_run is exact
    assert catalog.run(record.run_key) == record
    assert catalog.run(record.run_key[:8]) == record
    with pytest.raises(NotFound, match="actstore runs"):
        catalog.run(record.run_key[:7])
    with pytest.raises(NotFound):
        catalog.run(digest("unknown"))


def test_a_short_run_prefix_says_how_long_it_must_be_and_whether_it_matches(catalog):
    record = run_record("r")
    catalog.add_run(record)
    with pytest.raises(NotFound, match=r"too short: give at least 8 hex characters of the run key \(it is the start "
                                       r"of 1 run key\(s\)\)"):
        catalog.run(record.run_key[:7])
    other = next(c for c in "0123456789abcdef" if c != record.run_key[0])
    with pytest.raises(NotFound, match=r"too short: .* \(no run key starts with it\)"):
        catalog.run(other * 7)


def test_a_run_key_or_prefix_in_upper_case_names_the_run(catalog):
    record = run_record("r")
    catalog.add_run(record)
    assert catalog.run(record.run_key.upper()) == record
    assert catalog.run(record.run_key[:10].upper()) == record


def test_runs_refuses_an_unknown_status(catalog):
    with pytest.raises(InvalidArgument, match="run status 'bogus' is not one of running, committed, failed"):
        catalog.runs(status="bogus")


def test_jobs_refuses_an_unknown_status(catalog):
    with pytest.raises(InvalidArgument, match="job status 'bogus' is not one of queued, running, done, failed, "
                                              "cancelled, interrupted"):
        catalog.jobs(status="bogus")
    assert catalog.jobs(status="done") == []


def test_add_run_twice_keeps_the_first(catalog):
    catalog.add_run(run_record("r"))
    catalog.add_run(run_record("r", status="committed", width=99))
    assert catalog.run(digest("r")).status == "running"
    assert catalog.run(digest("r")).width == 16


def test_ambiguous_run_prefix(catalog):
    a, b = two_digests_sharing_a_prefix()
    catalog.add_run(run_record("a", run_key=a))
    catalog.add_run(run_record("b", run_key=b))
    with pytest.raises(InvalidArgument, match="ambiguous"):
        catalog.run(a[:8])
    assert catalog.run(a[:9]).run_key == a


def test_committed_run(catalog):
    catalog.add_run(run_record("r"))
    with pytest.raises(FailedPrecondition) as info:
        catalog.committed_run(digest("r")[:10])
    assert "running" in str(info.value) and "actstore jobs" in str(info.value)
    catalog.set_run_status(digest("r"), "committed")
    assert catalog.committed_run(digest("r")[:10]).status == "committed"
    with pytest.raises(NotFound):
        catalog.committed_run(digest("unknown"))


def test_set_run_status_sets_committed_at(catalog, catalog_path):
    catalog.add_run(run_record("a"))
    catalog.add_run(run_record("b"))
    catalog.set_run_status(digest("a"), "committed")
    catalog.set_run_status(digest("b"), "failed")
    assert catalog.run(digest("a")).status == "committed"
    assert catalog.run(digest("b")).status == "failed"
    rows = dict(raw_rows(catalog, catalog_path, "SELECT run_key, committed_at IS NOT NULL FROM runs"))
    assert rows == {digest("a"): True, digest("b"): False}


def test_runs_filters(catalog):
    catalog.add_run(run_record("r1", model="m1", dataset="d1", status="committed"))
    catalog.add_run(run_record("r2", model="m1", dataset="d2", status="running"))
    catalog.add_run(run_record("r3", model="m2", dataset="d1", status="committed"))

    def keys(**filters) -> set[str]:
        return {r.run_key for r in catalog.runs(**filters)}

    assert keys() == {digest("r1"), digest("r2"), digest("r3")}
    assert keys(model_digest=digest("m1")) == {digest("r1"), digest("r2")}
    assert keys(dataset_digest=digest("d1")) == {digest("r1"), digest("r3")}
    assert keys(status="committed") == {digest("r1"), digest("r3")}
    assert keys(model_digest=digest("m1"), status="committed") == {digest("r1")}
    assert keys(model_digest=digest("m2"), dataset_digest=digest("d2")) == set()
    assert keys(model_digest=digest("nobody")) == set()


# ---- chunks ------------------------------------------------------------------------------
def test_insert_chunks_from_arrow(catalog, catalog_path):
    run_key = digest("r")
    catalog.insert_chunks(chunk_table(run_key, shards=[0, 1], layers=range(4)))
    assert catalog.recorded_shards(run_key, num_layers=3) == {0, 1}
    assert catalog.chunk_rows_total(run_key) == 10
    rows = raw_rows(catalog, catalog_path, "SELECT shard, layer, checksum FROM chunks ORDER BY shard, layer")
    assert rows == [(s, layer, 1000 * s + layer) for s in (0, 1) for layer in range(4)]


def test_insert_chunks_accepts_the_chunk_schema_itself(catalog):
    table = chunk_table(digest("r"), shards=[0], layers=range(4)).cast(CHUNK_SCHEMA)
    catalog.insert_chunks(table)
    assert catalog.recorded_shards(digest("r"), 3) == {0}


def test_insert_chunks_is_idempotent(catalog, catalog_path):
    run_key = digest("r")
    catalog.insert_chunks(chunk_table(run_key, shards=[0, 1], layers=range(4)))
    catalog.insert_chunks(chunk_table(run_key, shards=[0, 1], layers=range(4)))  # a retried task
    # a batch that overlaps recorded rows inserts only the new ones; the recorded ones stay
    catalog.insert_chunks(chunk_table(run_key, shards=[1, 2], layers=range(4), nan=7))
    assert catalog.recorded_shards(run_key, 3) == {0, 1, 2}
    assert catalog.chunk_rows_total(run_key) == 15
    health = catalog.chunk_health(run_key, 3)
    np.testing.assert_array_equal(health.nan_count, [7] * 4)  # only shard 2's rows carry nan=7
    count = raw_rows(catalog, catalog_path, "SELECT count(*) FROM chunks")[0][0]
    assert count == 12


def test_recorded_shards_needs_every_layer(catalog):
    run_key = digest("r")
    catalog.insert_chunks(chunk_table(run_key, shards=[0], layers=range(4)))
    catalog.insert_chunks(chunk_table(run_key, shards=[1], layers=[0, 1, 2]))  # layer 3 missing
    catalog.insert_chunks(chunk_table(run_key, shards=[2], layers=[3]))
    catalog.insert_chunks(chunk_table(digest("other"), shards=[1, 3], layers=range(4)))
    assert catalog.recorded_shards(run_key, 3) == {0}
    assert catalog.recorded_shards(digest("other"), 3) == {1, 3}
    assert catalog.recorded_shards(digest("nothing"), 3) == set()
    catalog.insert_chunks(chunk_table(run_key, shards=[1], layers=[3]))
    assert catalog.recorded_shards(run_key, 3) == {0, 1}


def test_chunk_health_sums_nan_and_inf_per_layer(catalog):
    run_key = digest("r")
    catalog.insert_chunks(chunk_table(run_key, shards=[0], layers=range(4), nan=0, inf=0, lo=-2.0, hi=3.0))
    catalog.insert_chunks(chunk_table(run_key, shards=[1], layers=[0, 2], nan=5, inf=1, lo=-7.0, hi=1.0))
    catalog.insert_chunks(chunk_table(run_key, shards=[2], layers=[2], nan=4, inf=2, lo=0.0, hi=9.0))
    catalog.insert_chunks(chunk_table(digest("other"), shards=[0], layers=range(4), nan=100, inf=100))
    health = catalog.chunk_health(run_key, 3)
    assert health.recorded_shards == 1
    assert health.nan_count.dtype == np.int64 and health.inf_count.dtype == np.int64
    np.testing.assert_array_equal(health.nan_count, [5, 0, 9, 0])
    np.testing.assert_array_equal(health.inf_count, [1, 0, 3, 0])
    np.testing.assert_array_equal(health.min, [-7.0, -2.0, -7.0, -2.0])
    np.testing.assert_array_equal(health.max, [3.0, 3.0, 9.0, 3.0])


def test_chunk_health_of_a_run_without_chunks(catalog):
    health = catalog.chunk_health(digest("r"), 2)
    assert health.recorded_shards == 0
    np.testing.assert_array_equal(health.nan_count, [0, 0, 0])
    np.testing.assert_array_equal(health.inf_count, [0, 0, 0])
    assert np.isnan(health.min).all() and np.isnan(health.max).all()
    assert catalog.chunk_rows_total(digest("r")) == 0


# ---- results and delete_run --------------------------------------------------------------
def test_results_put_and_get(catalog):
    assert catalog.result("missing") is None
    payload = bytes(range(256)) + b"\x00tail"
    catalog.put_result("k1", "cka", 2, {"debiased": True}, [digest("a"), digest("b")], payload, 1.25)
    got = catalog.result("k1")
    assert got == (payload, 1.25)
    assert isinstance(got[0], bytes)
    catalog.put_result("k1", "cka", 2, {"debiased": True}, [digest("a"), digest("b")], b"other", 9.0)
    assert catalog.result("k1") == (payload, 1.25)  # a second store of the key changes nothing
    catalog.put_result("k1", "cka", 2, {"debiased": True}, [digest("a"), digest("b")], b"again", 3.5, replace=True)
    assert catalog.result("k1") == (b"again", 3.5)  # unless it is a recomputation (refresh)


def test_delete_run_removes_its_run_chunks_and_results(catalog, catalog_path):
    gone, kept = digest("gone"), digest("kept")
    catalog.add_run(run_record("gone", status="committed"))
    catalog.add_run(run_record("kept", status="committed"))
    catalog.insert_chunks(chunk_table(gone, shards=[0, 1], layers=range(4)))
    catalog.insert_chunks(chunk_table(kept, shards=[0, 1], layers=range(4)))
    catalog.put_result("only-gone", "entropy", 1, {}, [gone], b"1", 0.1)
    catalog.put_result("both", "cka", 1, {}, [kept, gone], b"2", 0.1)
    catalog.put_result("only-kept", "entropy", 1, {}, [kept], b"3", 0.1)
    # a result whose options merely mention the run key is not about that run
    catalog.put_result("mentions", "cka", 1, {"note": gone}, [kept], b"4", 0.1)

    catalog.delete_run(gone)

    assert catalog.find_run(gone) is None
    assert catalog.recorded_shards(gone, 3) == set()
    assert catalog.chunk_rows_total(gone) == 0
    assert catalog.result("only-gone") is None
    assert catalog.result("both") is None
    assert catalog.result("only-kept") == (b"3", 0.1)
    assert catalog.result("mentions") == (b"4", 0.1)
    assert catalog.find_run(kept) is not None
    assert catalog.recorded_shards(kept, 3) == {0, 1}
    catalog.delete_run(gone)  # deleting again is a no-op
    catalog.delete_run(digest("never existed"))
    assert catalog.find_run(kept) is not None


# ---- jobs --------------------------------------------------------------------------------
def test_jobs_add_update_list(catalog):
    request = {"model": "bert", "layers": [0, 1], "nested": {"a": None}}
    catalog.add_job(JobRecord("j1", "capture", digest("r"), "running", request, 0, 10, None, "alice"))
    catalog.add_job(JobRecord("j2", "metric", "cka", "queued", {}, 0, 0, None))
    job = catalog.job("j1")
    assert job == JobRecord("j1", "capture", digest("r"), "running", request, 0, 10, None, "alice")
    assert catalog.job("j2").principal is None

    catalog.update_job("j1", done=4)
    job = catalog.job("j1")
    assert (job.status, job.done, job.total, job.error) == ("running", 4, 10, None)
    catalog.update_job("j1", status="failed", error="worker died", total=12)
    job = catalog.job("j1")
    assert (job.status, job.done, job.total, job.error) == ("failed", 4, 12, "worker died")
    catalog.update_job("j1", done=5)  # fields not given are kept
    assert catalog.job("j1").error == "worker died" and catalog.job("j1").status == "failed"

    assert {j.job_id for j in catalog.jobs()} == {"j1", "j2"}
    assert [j.job_id for j in catalog.jobs(status="queued")] == ["j2"]
    assert [j.job_id for j in catalog.jobs(status="failed")] == ["j1"]
    assert catalog.jobs(status="done") == []
    with pytest.raises(NotFound, match="actstore jobs"):
        catalog.job("nope")


# ---- principals and audit ----------------------------------------------------------------
def test_principals(catalog):
    catalog.add_principal("alice", "admin", "hash-a")
    catalog.add_principal("bob", "reader", "hash-b")
    assert catalog.principal("hash-a") == ("alice", "admin")
    assert catalog.principal("hash-b") == ("bob", "reader")
    assert catalog.principal("hash-unknown") is None
    with pytest.raises(AlreadyExists, match="alice"):
        catalog.add_principal("alice", "reader", "hash-other")
    assert catalog.principal("hash-other") is None
    assert catalog.principal("hash-a") == ("alice", "admin")

    catalog.revoke_principal("alice")
    assert catalog.principal("hash-a") is None
    assert catalog.principal("hash-b") == ("bob", "reader")
    with pytest.raises(NotFound):
        catalog.revoke_principal("alice")
    catalog.add_principal("alice", "writer", "hash-a2")  # the name is free again
    assert catalog.principal("hash-a2") == ("alice", "writer")


def test_audit_insert(catalog, catalog_path):
    catalog.audit("alice", "/actstore.v1.Catalog/DeleteRun", digest("r"), "OK")
    catalog.audit(None, "/actstore.v1.Query/Similarity", "", "UNAUTHENTICATED")
    rows = raw_rows(catalog, catalog_path,
                    "SELECT principal, method, target, status, ts IS NOT NULL FROM audit ORDER BY status")
    assert rows == [
        ("alice", "/actstore.v1.Catalog/DeleteRun", digest("r"), "OK", True),
        (None, "/actstore.v1.Query/Similarity", "", "UNAUTHENTICATED", True),
    ]


def test_a_file_that_is_not_a_catalog_is_data_loss_saying_how_to_rebuild(tmp_path):
    path = tmp_path / "catalog.duckdb"
    path.write_bytes(b"not a database at all" * 500)
    with pytest.raises(DataLoss, match="catalog rebuild") as info:
        Catalog(path)
    assert "Traceback" not in str(info.value) and "owns" not in str(info.value)


def test_a_truncated_catalog_is_data_loss(tmp_path):
    path = tmp_path / "catalog.duckdb"
    catalog = Catalog(path)
    for i in range(2000):
        catalog.add_model(ModelRecord(digest=f"{i:064d}", kind="encoder", arch="x", num_layers=1, hidden_size=2,
                                      max_positions=None, path="/m", has_head=False, lineage={"i": i}))
    catalog.close()
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataLoss, match="damaged"):
        Catalog(path)


def test_a_catalog_whose_trailing_free_blocks_duckdb_trimmed_opens(tmp_path):
    """A checkpoint cuts free blocks off the file's end after writing the header, so the header
    counts blocks the file no longer holds: that is DuckDB's own doing, not damage."""
    path = tmp_path / "catalog.duckdb"
    Catalog(path).close()
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE filler AS SELECT range AS i, md5(range::VARCHAR) AS s FROM range(100000)")
    con.execute("CHECKPOINT")
    con.execute("DROP TABLE filler")
    con.execute("CHECKPOINT")
    con.close()
    for i in range(3):  # each open and close checkpoints again, as `actstore token create` does
        catalog = Catalog(path)
        catalog.add_model(model_record(f"m{i}"))
        catalog.close()
    con = duckdb.connect(str(path), read_only=True)
    block_size, total, free = con.execute("SELECT block_size, total_blocks, free_blocks FROM pragma_database_size() "
                                          "WHERE database_name = current_database()").fetchall()[0]
    con.close()
    assert free > 0 and path.stat().st_size < block_size * total  # the header names blocks past the end
    catalog = Catalog(path)
    assert sorted(m.digest for m in catalog.models()) == sorted(digest(f"m{i}") for i in range(3))
    catalog.close()
