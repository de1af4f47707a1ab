"""Read-only SQL over the catalog of a real server with auth on: what a reader may read, every kind
of write or file access refused (and the catalog unchanged afterwards), the row limit, the
timeout, the CLI, and the server's own backups still working after SQL ran."""

from __future__ import annotations

import datetime as dt

import pytest

from actstore.cli import main
from actstore.client import Client
from actstore.errors import DeadlineExceeded, InvalidArgument, PermissionDenied, ResourceExhausted
from actstore.server.app import start_server
from actstore.server.auth import create_token, hash_token
from tests.conftest import make_settings
from tests.sql_corpus import SECRET_FILE_TEXT, leaks, queries

MiB = 2**20

WRITES = [
    "INSERT INTO runs (run_key) VALUES ('x')",
    "UPDATE datasets SET n = 0",
    "DELETE FROM datasets",
    "DROP TABLE runs",
    "CREATE TABLE stolen AS SELECT * FROM principals",
    "ALTER TABLE runs ADD COLUMN x INTEGER",
    "ATTACH '/tmp/actstore-sql-test.duckdb' AS other",
    "DETACH other",
    "COPY runs TO '/tmp/actstore-sql-test.csv'",
    "COPY (SELECT 1) TO '/tmp/actstore-sql-test.csv'",
    "EXPORT DATABASE '/tmp/actstore-sql-test'",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET enable_external_access = false",
    "PRAGMA database_size",
    "CALL pragma_version()",
    "BEGIN TRANSACTION",
    "CHECKPOINT",
]
FILE_READS = [
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM '/etc/passwd'",
    "SELECT * FROM read_text('/etc/passwd')",
    "SELECT * FROM glob('/etc/*')",
    "SELECT * FROM runs, LATERAL (SELECT * FROM read_blob('/etc/hostname'))",
    "SELECT (SELECT count(*) FROM read_parquet('/tmp/x.parquet'))",
    "SELECT * FROM query('SELECT * FROM principals')",
    "SELECT * FROM duckdb_settings()",
    "DESCRIBE runs",
]
SERVER_STATE = [
    "SELECT current_setting('temp_directory'), current_setting('secret_directory')",
    "SELECT n FROM datasets WHERE CURRENT_SETTING('enable_external_access')",
    "SELECT getvariable('x')",
    "SELECT version()",
    "SELECT current_database()",
    "SELECT nextval('s')",
    "SELECT pg_get_viewdef(1)",
    "SELECT has_table_privilege('runs', 'select')",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory, ray_cluster):
    running = start_server(make_settings(tmp_path_factory.mktemp("store"), auth=True, sql_max_rows=5,
                                         sql_timeout_seconds=1.0, max_message_bytes=2 * MiB))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def tokens(server):
    return {role: create_token(server.service.catalog, f"{role}-sql", role) for role in ("reader", "writer", "admin")}


@pytest.fixture(scope="module")
def reader(server, tokens):
    with Client(f"127.0.0.1:{server.port}", token=tokens["reader"]) as c:
        yield c


@pytest.fixture(scope="module")
def admin(server, tokens):
    with Client(f"127.0.0.1:{server.port}", token=tokens["admin"]) as c:
        c.register_dataset(texts=["a b c", "d e f", "g h"], labels=[0, 1, 0], name="tiny")
        yield c


def test_a_reader_reads_the_catalog_tables_with_their_types(reader, admin):
    answer = reader.sql("SELECT n, num_labels, source, created_at FROM datasets")
    assert answer.columns == ["n", "num_labels", "source", "created_at"]
    assert answer.types == ["BIGINT", "INTEGER", "JSON", "TIMESTAMP"] and not answer.truncated
    ((n, labels, source, created),) = answer.rows
    assert (n, labels) == (3, 2) and "texts" in source
    assert dt.datetime.fromisoformat(created).year >= 2024
    cells = reader.sql("SELECT 18446744073709551615::UBIGINT AS big, -5 AS small, NULL AS nothing, true AS yes, "
                       "1.5::DOUBLE AS x, 'ab'::BLOB AS raw").rows[0]
    assert cells == (18446744073709551615, -5, None, True, 1.5, b"ab")
    nested = reader.sql("SELECT [1, 2] AS l, {'a': 'x', 'b': [true]} AS s, 1.50::DECIMAL(4, 2) AS d").rows[0]
    assert nested == ("[1, 2]", '{"a": "x", "b": [true]}', "1.50")
    frame = reader.sql("SELECT alias FROM dataset_aliases").to_pandas()
    assert frame["alias"].tolist() == ["tiny"]
    with_cte = reader.sql("WITH d AS (SELECT digest FROM datasets) SELECT count(*) AS k FROM d JOIN dataset_aliases "
                          "a USING (digest)")
    assert with_cte.rows == [(1,)]


@pytest.mark.parametrize("query", WRITES)
def test_every_write_or_setting_is_refused_and_changes_nothing(reader, admin, query):
    for client in (reader, admin):
        with pytest.raises(PermissionDenied, match="read-only"):
            client.sql(query)
    assert admin.sql("SELECT count(*) FROM datasets").rows == [(1,)]
    assert admin.sql("SELECT count(*) FROM runs").rows == [(0,)]


@pytest.mark.parametrize("query", FILE_READS)
def test_files_table_functions_and_server_state_are_refused(reader, admin, query):
    for client in (reader, admin):
        with pytest.raises(PermissionDenied, match="refused|not readable"):
            client.sql(query)


@pytest.mark.parametrize("query", SERVER_STATE)
def test_functions_that_read_server_settings_or_state_are_refused(reader, admin, query):
    for client in (reader, admin):
        with pytest.raises(PermissionDenied, match=r"\(\) is refused \(it reads server settings or state"):
            client.sql(query)
    assert reader.sql("SELECT pg_typeof(1) AS t, lower('A') AS a").rows == [("integer", "a")]


def test_the_generated_corpus_reads_no_file_hidden_table_or_setting_for_any_role(server, tokens, admin,
                                                                                tmp_path):
    """tests/sql_corpus.py over gRPC, for each role (tests/store/test_catalog_sql.py runs every query of
    it for the reader's and the admin's tables; here a fixed fifth of it and the issue's probes, per
    role, through the server's role mapping)."""
    secret = tmp_path / "secret.csv"
    secret.write_text(f"a,b\n{SECRET_FILE_TEXT},42\n")
    audited = "audit-row-sentinel-3b8e"
    server.service.catalog.audit.record("someone", "Capture", audited, "OK")
    with server.service.catalog.cursor() as cur:
        database = cur.execute("SELECT current_database()").fetchone()[0]
    corpus = queries(secret, database, ("principals", "audit"))
    probes = [query for query in corpus if query.startswith("WITH principals") or "(WITH \"/" in query]
    chosen = corpus[::5] + probes
    hashes = [hash_token(token) for token in tokens.values()]
    before = admin.sql("SELECT count(*) FROM runs").rows
    for role, token in tokens.items():
        hidden = [SECRET_FILE_TEXT, *hashes] + ([] if role == "admin" else [audited])
        with Client(f"127.0.0.1:{server.port}", token=token) as client:
            for query in chosen:
                try:
                    answer = client.sql(query)
                except (PermissionDenied, InvalidArgument) as exc:
                    assert not leaks(str(exc), hidden), (role, query, str(exc))
                    continue
                assert not leaks(repr(answer.rows), hidden), (role, query, answer.rows)
    assert admin.sql("SELECT count(*) FROM runs").rows == before
    assert admin.sql(f"SELECT target FROM audit WHERE target = '{audited}'").rows == [(audited,)]


def test_rows_over_the_reply_size_budget_say_so(reader):
    """The server's replies are at most 2 MiB, half of it for rows: a cell larger than that, or
    rows that add up past it, are refused with what to narrow, not cut as if by the row limit."""
    with pytest.raises(ResourceExhausted, match=r"size budget of 1\.00 MiB .*not even one row fits: select fewer "
                                                r"or narrower columns"):
        reader.sql("SELECT repeat('a', 2000000) AS x")
    rows = ("WITH RECURSIVE t(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM t WHERE i < 3) "
            "SELECT repeat('a', 400000) FROM t")
    with pytest.raises(ResourceExhausted, match="only the first 2 rows fit: add LIMIT 2"):
        reader.sql(rows)
    assert len(reader.sql(rows + " LIMIT 2").rows) == 2


def test_several_statements_or_bad_sql_are_invalid(reader):
    with pytest.raises(InvalidArgument, match="exactly one SQL statement"):
        reader.sql("SELECT 1; DROP TABLE runs")
    with pytest.raises(InvalidArgument, match="exactly one SQL statement"):
        reader.sql("SELECT 1; SELECT 2")
    with pytest.raises(InvalidArgument, match="does not parse"):
        reader.sql("SELEC 1")
    with pytest.raises(InvalidArgument, match="failed.*no_such_column"):
        reader.sql("SELECT no_such_column FROM runs")


def test_token_hashes_are_never_readable_and_the_audit_only_by_admins(reader, admin):
    for client in (reader, admin):
        with pytest.raises(PermissionDenied, match="token hashes are never readable"):
            client.sql("SELECT token_hash FROM principals")
        with pytest.raises(PermissionDenied, match="not readable"):
            client.sql("SELECT 1 WHERE EXISTS (SELECT * FROM main.principals)")
        with pytest.raises(PermissionDenied, match="not readable"):
            client.sql("SELECT * FROM information_schema.tables")
    for spelling in ("SELECT count(*) FROM audit", "WITH audit AS (SELECT * FROM audit) SELECT count(*) FROM audit"):
        with pytest.raises(PermissionDenied, match="'audit' is not readable"):
            reader.sql(spelling)
        assert admin.sql(spelling).rows[0][0] >= 0


def test_row_limit_and_timeout(reader):
    hundred = "WITH RECURSIVE t(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM t WHERE i < 100) SELECT i FROM t"
    answer = reader.sql(hundred)
    assert answer.rows == [(i,) for i in range(1, 6)] and answer.truncated  # the server's sql_max_rows = 5
    assert reader.sql(hundred, limit=3).rows == [(1,), (2,), (3,)]
    assert not reader.sql(hundred.replace("100", "4")).truncated
    with pytest.raises(ResourceExhausted, match="ACTSTORE_SQL_MAX_ROWS"):
        reader.sql(hundred, limit=6)
    with pytest.raises(InvalidArgument, match="limit 0 must be >= 1"):
        reader.sql(hundred, limit=0)
    endless = "WITH RECURSIVE t(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM t) SELECT count(*) FROM t"
    with pytest.raises(DeadlineExceeded, match="longer than 1 s"):
        reader.sql(endless)
    assert reader.sql("SELECT 42 AS answer").rows == [(42,)]  # the server goes on answering


def test_the_servers_own_backup_still_works_after_sql(admin, reader):
    reader.sql("SELECT count(*) FROM runs")
    backup = admin.backup_catalog()
    assert backup.bytes > 0 and backup.path in backup.kept


def test_cli_prints_a_table_and_refuses_writes(server, tokens, capsys):
    address = ["--address", f"127.0.0.1:{server.port}", "--token", tokens["reader"]]
    assert main([*address, "sql", "SELECT alias, digest IS NOT NULL AS known FROM dataset_aliases"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["alias", "known"] and out[1].split() == ["tiny", "True"]
    assert main([*address, "sql", "--json", "--limit", "1",
                 "WITH RECURSIVE t(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM t WHERE i < 3) SELECT i FROM t"]) == 0
    assert '"truncated": true' in capsys.readouterr().out
    assert main([*address, "sql", "DROP TABLE runs"]) == 2
    assert "PERMISSION_DENIED" in capsys.readouterr().err
