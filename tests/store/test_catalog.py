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
    c.models.add(model_record("m"))
    c.close()
    assert path.exists()
    again = Catalog(path)  # the schema is created idempotently, the data persists
    try:
        assert again.models.get(digest("m")).path == "/models/m"
    finally:
        again.close()


def test_second_process_gets_unavailable_with_address_hint(catalog, catalog_path):
    catalog.models.add(model_record("m"))  # the first process holds the file open
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
    assert catalog.models.get(digest("m")).digest == digest("m")


# ---- models ------------------------------------------------------------------------------
def test_model_round_trip(catalog):
    record = model_record("m", max_positions=None, has_head=True)
    catalog.models.add(record)
    assert catalog.models.get(record.digest) == record
    assert catalog.models.all() == [record]


def test_add_model_twice_keeps_the_first(catalog):
    catalog.models.add(model_record("m"))
    catalog.models.add(model_record("m", path="/elsewhere"))
    assert catalog.models.get(digest("m")).path == "/models/m"
    assert len(catalog.models.all()) == 1


def test_model_alias_and_re_pointing(catalog):
    catalog.models.add(model_record("v1"))
    catalog.models.add(model_record("v2"))
    catalog.models.set_alias("bert", digest("v1"))
    catalog.models.set_alias("bert-stable", digest("v1"))
    assert catalog.models.get("bert").digest == digest("v1")
    assert catalog.models.get("bert").aliases == ("bert", "bert-stable")
    catalog.models.set_alias("bert", digest("v2"))  # re-point
    assert catalog.models.get("bert").digest == digest("v2")
    assert catalog.models.get(digest("v2")).aliases == ("bert",)
    assert catalog.models.get(digest("v1")).aliases == ("bert-stable",)
    assert {m.digest: m.aliases for m in catalog.models.all()} == {digest("v1"): ("bert-stable",),
                                                               digest("v2"): ("bert",)}


@pytest.mark.parametrize("alias", ["", " bert", "bert ", "/abs"])
def test_invalid_model_alias(catalog, alias):
    catalog.models.add(model_record("m"))
    with pytest.raises(InvalidArgument):
        catalog.models.set_alias(alias, digest("m"))


def test_alias_with_slash_and_at_is_fine(catalog):
    catalog.models.add(model_record("m"))
    catalog.models.set_alias("team/vit-fmnist-aligned@step3000", digest("m"))
    assert catalog.models.get("team/vit-fmnist-aligned@step3000").digest == digest("m")


def test_model_prefix_resolution(catalog):
    catalog.models.add(model_record("m"))
    full = digest("m")
    assert catalog.models.get(full[:8]).digest == full
    assert catalog.models.get(full[:20]).digest == full
    with pytest.raises(NotFound):  # 7 characters are not enough, even when unique
        catalog.models.get(full[:7])


def two_digests_sharing_a_prefix(length: int = 8) -> tuple[str, str]:
    """Two real sha256 digests whose first `length` hex digits agree: make two names collide."""
    shared = ("0123456789abcdef" * 4)[:length]
    return shared + "a" + digest("first")[length + 1:], shared + "b" + digest("second")[length + 1:]


def test_ambiguous_model_prefix(catalog):
    a, b = two_digests_sharing_a_prefix(9)
    catalog.models.add(model_record("a", digest=a))
    catalog.models.add(model_record("b", digest=b))
    with pytest.raises(InvalidArgument, match="ambiguous"):
        catalog.models.get(a[:8])
    with pytest.raises(InvalidArgument, match="ambiguous"):
        catalog.models.get(a[:9])
    assert catalog.models.get(a[:10]).digest == a
    assert catalog.models.get(b[:10]).digest == b


def test_unknown_model_message(catalog):
    catalog.models.add(model_record("m"))
    with pytest.raises(NotFound) as info:
        catalog.models.get("no-such-model")
    message = str(info.value)
    assert "no-such-model" in message and "actstore models" in message


def test_alias_wins_over_a_digest_prefix(catalog):
    catalog.models.add(model_record("m"))
    catalog.models.add(model_record("other"))
    catalog.models.set_alias(digest("m")[:8], digest("other"))
    assert catalog.models.get(digest("m")[:8]).digest == digest("other")


def test_alias_to_a_missing_model(catalog):
    catalog.models.set_alias("dangling", digest("never added"))
    with pytest.raises(NotFound, match="dangling"):
        catalog.models.get("dangling")


@pytest.mark.parametrize("what", ["model", "dataset", "run"])
def test_prefixes_are_literal_not_like_patterns(catalog, what):
    # A prefix is a literal start of a digest. '%' and '_' are LIKE wildcards: as a prefix they
    # would match any digest and resolve to whatever single record there is.
    if what == "model":
        catalog.models.add(model_record("m"))
        lookup = catalog.models.get
    elif what == "dataset":
        catalog.datasets.add(dataset_record("d"))
        lookup = catalog.datasets.get
    else:
        catalog.runs.add(run_record("r"))
        lookup = catalog.runs.get
    for pattern in ("%%%%%%%%", "________", "%" + "_" * 7):
        with pytest.raises(NotFound):
            lookup(pattern)


# ---- datasets ----------------------------------------------------------------------------
def test_dataset_round_trip_aliases_and_prefixes(catalog):
    record = dataset_record("d", has_groups=True)
    catalog.datasets.add(record)
    catalog.datasets.add(dataset_record("d2"))
    assert catalog.datasets.get(record.digest) == record
    catalog.datasets.set_alias("rt", digest("d"))
    assert catalog.datasets.get("rt").digest == digest("d")
    assert catalog.datasets.get(digest("d")[:8]).aliases == ("rt",)
    catalog.datasets.set_alias("rt", digest("d2"))
    assert catalog.datasets.get("rt").digest == digest("d2")
    assert catalog.datasets.get(digest("d")).aliases == ()
    assert {d.digest for d in catalog.datasets.all()} == {digest("d"), digest("d2")}
    with pytest.raises(NotFound):
        catalog.datasets.get(digest("d")[:7])
    with pytest.raises(InvalidArgument):
        catalog.datasets.set_alias(" rt", digest("d"))


def test_ambiguous_and_unknown_dataset(catalog):
    a, b = two_digests_sharing_a_prefix()
    catalog.datasets.add(dataset_record("a", digest=a))
    catalog.datasets.add(dataset_record("b", digest=b))
    with pytest.raises(InvalidArgument, match="ambiguous"):
        catalog.datasets.get(a[:8])
    assert catalog.datasets.get(a[:9]).digest == a
    with pytest.raises(NotFound) as info:
        catalog.datasets.get("no-such-set")
    assert "no-such-set" in str(info.value) and "actstore datasets" in str(info.value)


def test_model_and_dataset_aliases_are_separate(catalog):
    catalog.models.add(model_record("m"))
    catalog.datasets.add(dataset_record("d"))
    catalog.models.set_alias("same-name", digest("m"))
    catalog.datasets.set_alias("same-name", digest("d"))
    assert catalog.models.get("same-name").digest == digest("m")
    assert catalog.datasets.get("same-name").digest == digest("d")


# ---- runs --------------------------------------------------------------------------------
def test_run_add_find_and_prefix(catalog):
    record = run_record("r")
    catalog.runs.add(record)
    assert catalog.runs.find(record.run_key) == record
    assert catalog.runs.find(digest("other")) is None
    assert catalog.runs.find(record.run_key[:8]) is None  # find is exact
    assert catalog.runs.get(record.run_key) == record
    assert catalog.runs.get(record.run_key[:8]) == record
    with pytest.raises(NotFound, match="actstore runs"):
        catalog.runs.get(record.run_key[:7])
    with pytest.raises(NotFound):
        catalog.runs.get(digest("unknown"))


def test_a_short_run_prefix_says_how_long_it_must_be_and_whether_it_matches(catalog):
    record = run_record("r")
    catalog.runs.add(record)
    with pytest.raises(NotFound, match=r"too short: give at least 8 hex characters of the run key \(it is the start "
                                       r"of 1 run key\(s\)\)"):
        catalog.runs.get(record.run_key[:7])
    other = next(c for c in "0123456789abcdef" if c != record.run_key[0])
    with pytest.raises(NotFound, match=r"too short: .* \(no run key starts with it\)"):
        catalog.runs.get(other * 7)


def test_a_run_key_or_prefix_in_upper_case_names_the_run(catalog):
    record = run_record("r")
    catalog.runs.add(record)
    assert catalog.runs.get(record.run_key.upper()) == record
    assert catalog.runs.get(record.run_key[:10].upper()) == record


def test_runs_refuses_an_unknown_status(catalog):
    with pytest.raises(InvalidArgument, match="run status 'bogus' is not one of running, committed, failed"):
        catalog.runs.all(status="bogus")


def test_jobs_refuses_an_unknown_status(catalog):
    with pytest.raises(InvalidArgument, match="job status 'bogus' is not one of queued, running, done, failed, "
                                              "cancelled, interrupted"):
        catalog.jobs.all(status="bogus")
    assert catalog.jobs.all(status="done") == []


def test_add_run_twice_keeps_the_first(catalog):
    catalog.runs.add(run_record("r"))
    catalog.runs.add(run_record("r", status="committed", width=99))
    assert catalog.runs.get(digest("r")).status == "running"
    assert catalog.runs.get(digest("r")).width == 16


def test_ambiguous_run_prefix(catalog):
    a, b = two_digests_sharing_a_prefix()
    catalog.runs.add(run_record("a", run_key=a))
    catalog.runs.add(run_record("b", run_key=b))
    with pytest.raises(InvalidArgument, match="ambiguous"):
        catalog.runs.get(a[:8])
    assert catalog.runs.get(a[:9]).run_key == a


def test_committed_run(catalog):
    catalog.runs.add(run_record("r"))
    with pytest.raises(FailedPrecondition) as info:
        catalog.runs.get_committed(digest("r")[:10])
    assert "running" in str(info.value) and "actstore jobs" in str(info.value)
    catalog.runs.set_status(digest("r"), "committed")
    assert catalog.runs.get_committed(digest("r")[:10]).status == "committed"
    with pytest.raises(NotFound):
        catalog.runs.get_committed(digest("unknown"))


def test_set_run_status_sets_committed_at(catalog, catalog_path):
    catalog.runs.add(run_record("a"))
    catalog.runs.add(run_record("b"))
    catalog.runs.set_status(digest("a"), "committed")
    catalog.runs.set_status(digest("b"), "failed")
    assert catalog.runs.get(digest("a")).status == "committed"
    assert catalog.runs.get(digest("b")).status == "failed"
    rows = dict(raw_rows(catalog, catalog_path, "SELECT run_key, committed_at IS NOT NULL FROM runs"))
    assert rows == {digest("a"): True, digest("b"): False}


def test_runs_filters(catalog):
    catalog.runs.add(run_record("r1", model="m1", dataset="d1", status="committed"))
    catalog.runs.add(run_record("r2", model="m1", dataset="d2", status="running"))
    catalog.runs.add(run_record("r3", model="m2", dataset="d1", status="committed"))

    def keys(**filters) -> set[str]:
        return {r.run_key for r in catalog.runs.all(**filters)}

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
    catalog.chunks.insert(chunk_table(run_key, shards=[0, 1], layers=range(4)))
    assert catalog.chunks.recorded_shards(run_key, num_layers=3) == {0, 1}
    assert catalog.chunks.rows_total(run_key) == 10
    rows = raw_rows(catalog, catalog_path, "SELECT shard, layer, checksum FROM chunks ORDER BY shard, layer")
    assert rows == [(s, layer, 1000 * s + layer) for s in (0, 1) for layer in range(4)]


def test_insert_chunks_accepts_the_chunk_schema_itself(catalog):
    table = chunk_table(digest("r"), shards=[0], layers=range(4)).cast(CHUNK_SCHEMA)
    catalog.chunks.insert(table)
    assert catalog.chunks.recorded_shards(digest("r"), 3) == {0}


def test_insert_chunks_is_idempotent(catalog, catalog_path):
    run_key = digest("r")
    catalog.chunks.insert(chunk_table(run_key, shards=[0, 1], layers=range(4)))
    catalog.chunks.insert(chunk_table(run_key, shards=[0, 1], layers=range(4)))  # a retried task
    # a batch that overlaps recorded rows inserts only the new ones; the recorded ones stay
    catalog.chunks.insert(chunk_table(run_key, shards=[1, 2], layers=range(4), nan=7))
    assert catalog.chunks.recorded_shards(run_key, 3) == {0, 1, 2}
    assert catalog.chunks.rows_total(run_key) == 15
    health = catalog.chunks.health(run_key, 3)
    np.testing.assert_array_equal(health.nan_count, [7] * 4)  # only shard 2's rows carry nan=7
    count = raw_rows(catalog, catalog_path, "SELECT count(*) FROM chunks")[0][0]
    assert count == 12


def test_recorded_shards_needs_every_layer(catalog):
    run_key = digest("r")
    catalog.chunks.insert(chunk_table(run_key, shards=[0], layers=range(4)))
    catalog.chunks.insert(chunk_table(run_key, shards=[1], layers=[0, 1, 2]))  # layer 3 missing
    catalog.chunks.insert(chunk_table(run_key, shards=[2], layers=[3]))
    catalog.chunks.insert(chunk_table(digest("other"), shards=[1, 3], layers=range(4)))
    assert catalog.chunks.recorded_shards(run_key, 3) == {0}
    assert catalog.chunks.recorded_shards(digest("other"), 3) == {1, 3}
    assert catalog.chunks.recorded_shards(digest("nothing"), 3) == set()
    catalog.chunks.insert(chunk_table(run_key, shards=[1], layers=[3]))
    assert catalog.chunks.recorded_shards(run_key, 3) == {0, 1}


def test_chunk_health_sums_nan_and_inf_per_layer(catalog):
    run_key = digest("r")
    catalog.chunks.insert(chunk_table(run_key, shards=[0], layers=range(4), nan=0, inf=0, lo=-2.0, hi=3.0))
    catalog.chunks.insert(chunk_table(run_key, shards=[1], layers=[0, 2], nan=5, inf=1, lo=-7.0, hi=1.0))
    catalog.chunks.insert(chunk_table(run_key, shards=[2], layers=[2], nan=4, inf=2, lo=0.0, hi=9.0))
    catalog.chunks.insert(chunk_table(digest("other"), shards=[0], layers=range(4), nan=100, inf=100))
    health = catalog.chunks.health(run_key, 3)
    assert health.recorded_shards == 1
    assert health.nan_count.dtype == np.int64 and health.inf_count.dtype == np.int64
    np.testing.assert_array_equal(health.nan_count, [5, 0, 9, 0])
    np.testing.assert_array_equal(health.inf_count, [1, 0, 3, 0])
    np.testing.assert_array_equal(health.min, [-7.0, -2.0, -7.0, -2.0])
    np.testing.assert_array_equal(health.max, [3.0, 3.0, 9.0, 3.0])


def test_chunk_health_of_a_run_without_chunks(catalog):
    health = catalog.chunks.health(digest("r"), 2)
    assert health.recorded_shards == 0
    np.testing.assert_array_equal(health.nan_count, [0, 0, 0])
    np.testing.assert_array_equal(health.inf_count, [0, 0, 0])
    assert np.isnan(health.min).all() and np.isnan(health.max).all()
    assert catalog.chunks.rows_total(digest("r")) == 0


# ---- results and delete_run --------------------------------------------------------------
def test_results_put_and_get(catalog):
    assert catalog.results.get("missing") is None
    payload = bytes(range(256)) + b"\x00tail"
    catalog.results.put("k1", "cka", 2, {"debiased": True}, [digest("a"), digest("b")], payload, 1.25)
    got = catalog.results.get("k1")
    assert got == (payload, 1.25)
    assert isinstance(got[0], bytes)
    catalog.results.put("k1", "cka", 2, {"debiased": True}, [digest("a"), digest("b")], b"other", 9.0)
    assert catalog.results.get("k1") == (payload, 1.25)  # a second store of the key changes nothing
    catalog.results.put("k1", "cka", 2, {"debiased": True}, [digest("a"), digest("b")], b"again", 3.5, replace=True)
    assert catalog.results.get("k1") == (b"again", 3.5)  # unless it is a recomputation (refresh)


def test_delete_run_removes_its_run_chunks_and_results(catalog, catalog_path):
    gone, kept = digest("gone"), digest("kept")
    catalog.runs.add(run_record("gone", status="committed"))
    catalog.runs.add(run_record("kept", status="committed"))
    catalog.chunks.insert(chunk_table(gone, shards=[0, 1], layers=range(4)))
    catalog.chunks.insert(chunk_table(kept, shards=[0, 1], layers=range(4)))
    catalog.results.put("only-gone", "entropy", 1, {}, [gone], b"1", 0.1)
    catalog.results.put("both", "cka", 1, {}, [kept, gone], b"2", 0.1)
    catalog.results.put("only-kept", "entropy", 1, {}, [kept], b"3", 0.1)
    # a result whose options merely mention the run key is not about that run
    catalog.results.put("mentions", "cka", 1, {"note": gone}, [kept], b"4", 0.1)

    catalog.runs.delete(gone)

    assert catalog.runs.find(gone) is None
    assert catalog.chunks.recorded_shards(gone, 3) == set()
    assert catalog.chunks.rows_total(gone) == 0
    assert catalog.results.get("only-gone") is None
    assert catalog.results.get("both") is None
    assert catalog.results.get("only-kept") == (b"3", 0.1)
    assert catalog.results.get("mentions") == (b"4", 0.1)
    assert catalog.runs.find(kept) is not None
    assert catalog.chunks.recorded_shards(kept, 3) == {0, 1}
    catalog.runs.delete(gone)  # deleting again is a no-op
    catalog.runs.delete(digest("never existed"))
    assert catalog.runs.find(kept) is not None


# ---- jobs --------------------------------------------------------------------------------
def test_jobs_add_update_list(catalog):
    request = {"model": "bert", "layers": [0, 1], "nested": {"a": None}}
    catalog.jobs.add(JobRecord("j1", "capture", digest("r"), "running", request, 0, 10, None, "alice"))
    catalog.jobs.add(JobRecord("j2", "metric", "cka", "queued", {}, 0, 0, None))
    job = catalog.jobs.get("j1")
    assert job == JobRecord("j1", "capture", digest("r"), "running", request, 0, 10, None, "alice")
    assert catalog.jobs.get("j2").principal is None

    catalog.jobs.update("j1", done=4)
    job = catalog.jobs.get("j1")
    assert (job.status, job.done, job.total, job.error) == ("running", 4, 10, None)
    catalog.jobs.update("j1", status="failed", error="worker died", total=12)
    job = catalog.jobs.get("j1")
    assert (job.status, job.done, job.total, job.error) == ("failed", 4, 12, "worker died")
    catalog.jobs.update("j1", done=5)  # fields not given are kept
    assert catalog.jobs.get("j1").error == "worker died" and catalog.jobs.get("j1").status == "failed"

    assert {j.job_id for j in catalog.jobs.all()} == {"j1", "j2"}
    assert [j.job_id for j in catalog.jobs.all(status="queued")] == ["j2"]
    assert [j.job_id for j in catalog.jobs.all(status="failed")] == ["j1"]
    assert catalog.jobs.all(status="done") == []
    with pytest.raises(NotFound, match="actstore jobs"):
        catalog.jobs.get("nope")


# ---- principals and audit ----------------------------------------------------------------
def test_principals(catalog):
    catalog.principals.add("alice", "admin", "hash-a")
    catalog.principals.add("bob", "reader", "hash-b")
    assert catalog.principals.by_token_hash("hash-a") == ("alice", "admin")
    assert catalog.principals.by_token_hash("hash-b") == ("bob", "reader")
    assert catalog.principals.by_token_hash("hash-unknown") is None
    with pytest.raises(AlreadyExists, match="alice"):
        catalog.principals.add("alice", "reader", "hash-other")
    assert catalog.principals.by_token_hash("hash-other") is None
    assert catalog.principals.by_token_hash("hash-a") == ("alice", "admin")

    catalog.principals.revoke("alice")
    assert catalog.principals.by_token_hash("hash-a") is None
    assert catalog.principals.by_token_hash("hash-b") == ("bob", "reader")
    with pytest.raises(NotFound):
        catalog.principals.revoke("alice")
    catalog.principals.add("alice", "writer", "hash-a2")  # the name is free again
    assert catalog.principals.by_token_hash("hash-a2") == ("alice", "writer")


def test_audit_insert(catalog, catalog_path):
    catalog.audit.record("alice", "/actstore.v1.Catalog/DeleteRun", digest("r"), "OK")
    catalog.audit.record(None, "/actstore.v1.Query/Similarity", "", "UNAUTHENTICATED")
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
        catalog.models.add(ModelRecord(digest=f"{i:064d}", kind="encoder", arch="x", num_layers=1, hidden_size=2,
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
        catalog.models.add(model_record(f"m{i}"))
        catalog.close()
    con = duckdb.connect(str(path), read_only=True)
    block_size, total, free = con.execute("SELECT block_size, total_blocks, free_blocks FROM pragma_database_size() "
                                          "WHERE database_name = current_database()").fetchall()[0]
    con.close()
    assert free > 0 and path.stat().st_size < block_size * total  # the header names blocks past the end
    catalog = Catalog(path)
    assert sorted(m.digest for m in catalog.models.all()) == sorted(digest(f"m{i}") for i in range(3))
    catalog.close()
