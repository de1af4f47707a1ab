"""Read-only SQL over a real catalog file (`store.catalog.sql`), attacked with the generated corpus of
tests/sql_corpus.py: for each role, no query reads a file, a hidden table or the server's
environment, and none changes a setting of the catalog; the sandbox holds on its own, without the
checks in front of it."""

from __future__ import annotations

import os

import duckdb
import pytest

from actstore.errors import DeadlineExceeded, InvalidArgument, PermissionDenied
from actstore.store.catalog import Catalog
from actstore.store.catalog.sql import ADMIN_TABLES, READABLE_TABLES, CatalogSql, copy_tables, sandbox
from tests.sql_corpus import SECRET_FILE_TEXT, leaks, queries, shadowing_queries

MiB = 2**20
TOKEN_HASH = "f" * 24 + "token-hash-sentinel"
AUDITED = "audit-row-sentinel-91c2"
ENVIRONMENT = "environment-sentinel-5d0e"
ROLES = {"reader": READABLE_TABLES, "admin": ADMIN_TABLES}


@pytest.fixture(scope="module")
def catalog(tmp_path_factory):
    c = Catalog(tmp_path_factory.mktemp("catalog") / "catalog.duckdb")
    c.principals.add("someone", "admin", TOKEN_HASH)
    c.audit.record("someone", "Capture", AUDITED, "OK")
    yield c
    c.close()


@pytest.fixture(scope="module")
def secret(tmp_path_factory):
    path = tmp_path_factory.mktemp("server-files") / "secret.csv"
    path.write_text(f"a,b\n{SECRET_FILE_TEXT},42\n")
    return path


@pytest.fixture(scope="module")
def corpus(catalog, secret):
    with catalog.cursor() as cur:
        name = cur.execute("SELECT current_database()").fetchone()[0]
    return queries(secret, name, ("principals", "audit"))


@pytest.fixture(scope="module", autouse=True)
def environment():
    os.environ["ACTSTORE_TEST_SECRET"] = ENVIRONMENT
    yield
    del os.environ["ACTSTORE_TEST_SECRET"]


def secrets_for(role: str) -> list[str]:
    hidden = [SECRET_FILE_TEXT, TOKEN_HASH, ENVIRONMENT]
    return hidden if role == "admin" else [*hidden, AUDITED]


def catalog_settings(catalog: Catalog) -> list[tuple]:
    with catalog.cursor() as cur:
        return cur.execute("SELECT name, value FROM duckdb_settings() WHERE name IN ('enable_external_access', "
                           "'lock_configuration', 'memory_limit', 'threads', 'python_enable_replacements') "
                           "ORDER BY name").fetchall()


@pytest.mark.parametrize("role", sorted(ROLES))
def test_no_query_of_the_corpus_reads_a_secret_or_changes_the_catalog(catalog, corpus, role):
    sql = CatalogSql(catalog.cursor, 64 * MiB)
    before = catalog_settings(catalog)
    for query in corpus:
        try:
            answer = sql.run(query, ROLES[role], limit=100, timeout=5.0)
        except (PermissionDenied, InvalidArgument) as exc:
            assert not leaks(str(exc), secrets_for(role)), (query, str(exc))
            continue
        assert not leaks(repr(answer.rows), secrets_for(role)), (query, answer.rows)
    assert catalog_settings(catalog) == before
    assert [name for (name, _) in catalog.principals.all()] == ["someone"]
    assert len(corpus) > 1000


@pytest.mark.parametrize("role", sorted(ROLES))
def test_a_cte_named_like_a_secret_answers_its_own_rows(catalog, secret, role):
    sql = CatalogSql(catalog.cursor, 64 * MiB)
    for query in shadowing_queries(secret):
        assert sql.run(query, ROLES[role], limit=10, timeout=5.0).rows == [(1,)], query


def test_the_issue_probes_are_refused_for_every_role(catalog, secret):
    """The two probes that read a file and the token hashes past the syntax-tree checks alone."""
    sql = CatalogSql(catalog.cursor, 64 * MiB)
    shadowed_path = f'"{secret}"'
    probes = [f"SELECT * FROM '{secret}', (WITH {shadowed_path} AS (SELECT 1 AS a) SELECT * FROM {shadowed_path}) s",
              "WITH principals AS (SELECT * FROM principals) SELECT * FROM principals"]
    for tables in ROLES.values():
        for probe in probes:
            with pytest.raises((PermissionDenied, InvalidArgument)) as caught:
                sql.run(probe, tables, limit=10, timeout=5.0)
            assert not leaks(str(caught.value), [SECRET_FILE_TEXT, TOKEN_HASH])
    # the path outside the CTE's scope is a table the checks refuse (before, a CTE of that name
    # anywhere in the query passed it on to the sandbox, which refused the file read)
    with pytest.raises(PermissionDenied, match=r"table '.*secret\.csv' is not readable"):
        sql.run(probes[0], ADMIN_TABLES, limit=10, timeout=5.0)
    # a CTE's body does not see the CTE itself: its `principals` is the table, refused as by name
    with pytest.raises(PermissionDenied, match="table 'principals' is not readable"):
        sql.run(probes[1], ADMIN_TABLES, limit=10, timeout=5.0)
    reader_audit = "WITH audit AS (SELECT * FROM audit) SELECT * FROM audit"
    assert sql.run(reader_audit, ADMIN_TABLES, limit=10, timeout=5.0).rows[0][3] == AUDITED


# each names the table `audit` where DuckDB binds it (a CTE's body sees only the CTEs listed before
# it, and its own name only in the recursive part of a recursive CTE)
AUDIT_SPELLINGS = [
    "SELECT * FROM audit",
    "WITH audit AS (SELECT * FROM audit) SELECT * FROM audit",
    "WITH audit AS MATERIALIZED (SELECT * FROM audit) SELECT * FROM audit",
    "WITH RECURSIVE audit AS (SELECT * FROM audit) SELECT * FROM audit",
    "WITH a AS (SELECT * FROM audit), audit AS (SELECT 1 AS x) SELECT * FROM a",
    "WITH x AS (SELECT 1) SELECT * FROM (WITH audit AS (SELECT * FROM audit) SELECT * FROM audit)",
    "WITH RECURSIVE audit AS (SELECT * FROM audit UNION ALL SELECT * FROM audit WHERE false) SELECT * FROM audit",
    "WITH audit AS (SELECT 1) SELECT * FROM main.audit",
    "SELECT (WITH audit AS (SELECT count(*) FROM audit) SELECT * FROM audit)",
]


@pytest.mark.parametrize("query", AUDIT_SPELLINGS)
def test_a_hidden_table_is_permission_denied_however_spelled(catalog, query):
    """A reader gets the same PERMISSION_DENIED for `audit` named through a CTE of the same name as
    for `FROM audit` (before: INVALID_ARGUMENT 'Circular reference to CTE'); an admin reads it."""
    sql = CatalogSql(catalog.cursor, 64 * MiB)
    with pytest.raises(PermissionDenied, match="table '(main.)?audit' is not readable"):
        sql.run(query, READABLE_TABLES, limit=10, timeout=5.0)
    sql.run(query, ADMIN_TABLES, limit=10, timeout=5.0)


@pytest.mark.parametrize("query", [
    "WITH audit AS (SELECT 1 AS x) SELECT * FROM audit",
    "WITH audit AS (SELECT 1 AS x), a AS (SELECT * FROM audit) SELECT * FROM a",
    "WITH audit AS (SELECT 1 AS x) SELECT * FROM (WITH audit AS (SELECT * FROM audit) SELECT * FROM audit)",
    "WITH RECURSIVE audit AS (SELECT 1 AS x UNION ALL SELECT x + 1 FROM audit WHERE x < 3) SELECT max(x) FROM audit",
])
def test_a_cte_named_audit_answers_its_own_rows_for_a_reader(catalog, query):
    sql = CatalogSql(catalog.cursor, 64 * MiB)
    assert sql.run(query, READABLE_TABLES, limit=10, timeout=5.0).rows in ([(1,)], [(3,)])


def test_the_sandbox_alone_holds_without_the_checks(catalog, corpus):
    """Every query of the corpus run straight in a sandbox of the reader's tables: nothing of the
    files, hidden tables or environment is there, and its settings cannot be changed."""
    with catalog.cursor() as cur:
        copies = copy_tables(cur, list(READABLE_TABLES))
    with sandbox(copies, 64 * MiB) as box:
        assert {t for (t,) in box.execute("SELECT table_name FROM duckdb_tables()").fetchall()} == set(READABLE_TABLES)
        for query in corpus:
            try:
                rows = box.execute(query).fetchall()
            except duckdb.Error as exc:
                assert not leaks(str(exc), secrets_for("reader")), (query, str(exc))
                continue
            assert not leaks(repr(rows), secrets_for("reader")), (query, rows)
        settings = dict(box.execute("SELECT name, value FROM duckdb_settings()").fetchall())
        assert (settings["enable_external_access"], settings["lock_configuration"]) == ("false", "true")
        for change in ("SET enable_external_access = true", "SET lock_configuration = false", "RESET ALL"):
            with pytest.raises(duckdb.Error):
                box.execute(change)
    # the corpus's writes (`DROP TABLE runs` after a SELECT) changed the sandbox's copies only
    with catalog.cursor() as cur:
        assert cur.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'runs'").fetchone() == (1,)


def test_the_sandbox_keeps_the_catalog_types_and_one_snapshot(catalog):
    sql = CatalogSql(catalog.cursor, 64 * MiB)
    answer = sql.run("SELECT ts, principal, method, target, status FROM audit", ADMIN_TABLES, limit=10, timeout=5.0)
    assert answer.types == ["TIMESTAMP", "VARCHAR", "VARCHAR", "VARCHAR", "VARCHAR"]
    with catalog.cursor() as cur:
        expected = cur.execute("SELECT ts, principal, method, target, status FROM audit").fetchall()
    assert answer.rows == expected
    json_types = sql.run("SELECT spec, request FROM runs, jobs", READABLE_TABLES, limit=1, timeout=5.0).types
    assert json_types == ["JSON", "JSON"]


@pytest.mark.timeout(60)
def test_a_deadline_that_passes_before_the_query_starts_still_stops_it(catalog):
    """The time is up before the sandbox's statement starts (a loaded machine: the copy took the
    whole budget). DuckDB clears an interrupt when a statement starts, so an endless query must be
    interrupted again once it runs, not once only (a hang of 600 s in a loaded suite, before)."""
    sql = CatalogSql(catalog.cursor, 64 * MiB)
    endless = "WITH RECURSIVE t(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM t) SELECT count(*) FROM t"
    for timeout in (1e-6, 1e-4, 1e-3, 1e-2):
        with pytest.raises(DeadlineExceeded):
            sql.run(endless, READABLE_TABLES, limit=10, timeout=timeout)


def test_a_slow_query_in_the_sandbox_is_interrupted(catalog):
    sql = CatalogSql(catalog.cursor, 64 * MiB)
    endless = "WITH RECURSIVE t(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM t) SELECT count(*) FROM t"
    with pytest.raises(DeadlineExceeded, match="longer than 0.5 s"):
        sql.run(endless, READABLE_TABLES, limit=10, timeout=0.5)
    assert sql.run("SELECT count(*) FROM datasets", READABLE_TABLES, limit=10, timeout=5.0).rows == [(0,)]
