"""A generated corpus of SQL that tries to read what the SQL endpoint must never answer: a file's
content, a hidden table (`principals` always, `audit` for non-admins), server settings, or to change
a setting. Each target is put in every syntactic position the shapes below give it (CTE shadowing,
quoted identifiers, nested and lateral subqueries, unions, EXISTS, scalar subqueries, joins,
multi-statement strings), and every file-reading table function DuckDB has (`read_*`, `*_scan`,
`glob`, `sniff_csv`, `parquet_*`, `query`, `query_table` ...) is called on the secret file.

A query of the corpus is answered safely when it is refused, or when neither its rows nor its error
message holds any of the secrets (`leaks`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb

SECRET_FILE_TEXT = "sentinel-file-content-7f3a"

# the SELECT shapes: {t} is where the forbidden thing is named as a table, {name} an identifier
# that a CTE of the query shadows it with
SHAPES = (
    "SELECT * FROM {t}",
    "SELECT * FROM runs, {t}",
    "SELECT * FROM datasets JOIN {t} ON true",
    "SELECT * FROM {t}, (WITH {name} AS (SELECT 1 AS a) SELECT * FROM {name}) s",
    "WITH {name} AS (SELECT 1 AS a) SELECT * FROM {t}, {name}",
    "WITH {name} AS (SELECT * FROM {t}) SELECT * FROM {name}",
    "WITH x AS (SELECT * FROM {t}) SELECT * FROM x",
    "WITH RECURSIVE x(a) AS (SELECT 1 UNION ALL SELECT a + 1 FROM x WHERE a < 2) SELECT * FROM x, {t}",
    "SELECT (SELECT count(*) FROM {t}) AS n",
    "SELECT (SELECT string_agg(CAST(s AS VARCHAR), ',') FROM {t} AS s) AS leaked",
    "SELECT * FROM runs WHERE EXISTS (SELECT * FROM {t})",
    "SELECT * FROM runs, LATERAL (SELECT * FROM {t}) l",
    "SELECT * FROM (SELECT * FROM (SELECT * FROM {t}) a) b",
    "SELECT 'x' AS a UNION ALL SELECT CAST(s AS VARCHAR) FROM {t} AS s",
    "SELECT CAST(s AS VARCHAR) FROM {t} AS s UNION SELECT 'x'",
    "SELECT 1 AS a; SELECT * FROM {t}",
    "SELECT CAST((SELECT s FROM {t} AS s LIMIT 1) AS INTEGER)",
    "FROM {t}",
)


def _quoted(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


def file_reading_functions() -> list[str]:
    """Every table function of this DuckDB that reads a path or runs SQL text."""
    with duckdb.connect() as con:
        names = [name for (name,) in con.execute(
            "SELECT DISTINCT function_name FROM duckdb_functions() WHERE function_type = 'table' "
            "ORDER BY function_name").fetchall()]
    return [name for name in names if name.startswith(("read_", "parquet_", "sniff_")) or name.endswith("_scan")
            or name in ("glob", "query", "query_table")]


def targets(secret: Path, catalog_name: str, hidden_tables: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    """(the FROM item, an identifier to shadow it with) for each way of naming a secret."""
    path = str(secret)
    for text in (path, f"{secret.parent}/*.csv", f"file://{path}"):
        yield f"'{text}'", _quoted(text)
        yield _quoted(text), _quoted(text)
    for function in file_reading_functions():
        argument = {"query": "'SELECT * FROM principals'", "query_table": "'principals'"}.get(function, f"'{path}'")
        yield f"{function}({argument})", function
    for table in hidden_tables:
        for named in (table, table.upper(), _quoted(table), f"main.{table}", f"{catalog_name}.main.{table}",
                      f"{_quoted(catalog_name)}.{_quoted('main')}.{_quoted(table)}"):
            yield named, table
    for function in ("duckdb_settings()", "duckdb_databases()", "duckdb_secrets()", "duckdb_tables()",
                     "pragma_table_info('principals')", "which_secret('s3://bucket/x', 's3')"):
        yield function, "s"


def queries(secret: Path, catalog_name: str, hidden_tables: tuple[str, ...]) -> list[str]:
    corpus = [shape.format(t=t, name=name) for t, name in targets(secret, catalog_name, hidden_tables)
              for shape in SHAPES]
    corpus += [
        # the two probes the issue reported, as they were sent
        f"SELECT * FROM '{secret}', (WITH {_quoted(str(secret))} AS (SELECT 1 AS a) SELECT * FROM "
        f"{_quoted(str(secret))}) s",
        "WITH principals AS (SELECT * FROM principals) SELECT * FROM principals",
        "WITH audit AS (SELECT * FROM audit) SELECT * FROM audit",
        # settings, environment and statements other than SELECT
        "SELECT current_setting('secret_directory')", "SELECT current_setting('home_directory')",
        "SELECT getenv('HOME')", "SELECT * FROM duckdb_settings() WHERE name = 'enable_external_access'",
        "SET enable_external_access = true", "RESET lock_configuration", "PRAGMA enable_profiling",
        f"ATTACH '{secret}' AS stolen", f"COPY runs TO '{secret.parent}/copied.csv'",
        f"COPY (SELECT * FROM principals) TO '{secret.parent}/copied.csv'", "INSTALL httpfs", "LOAD httpfs",
        f"CREATE TABLE stolen AS SELECT * FROM '{secret}'", "EXPORT DATABASE '/tmp/actstore-sql-export'",
        f"SELECT 1; ATTACH '{secret}'", "CALL pragma_version()", "SELECT * FROM runs; DROP TABLE runs",
    ]
    return corpus


def shadowing_queries(secret: Path) -> list[str]:
    """Legal queries that name a secret only as their own CTE: each answers [(1,)] from the CTE, and
    nothing of what the name would otherwise mean."""
    names = (_quoted(str(secret)), "principals", "audit", _quoted("principals"))
    return [f"WITH {name} AS (SELECT 1 AS a) SELECT * FROM {name}" for name in names]


def leaks(text: str, secrets: list[str]) -> list[str]:
    """The secrets found in `text` (an answer's rows or an error message, as text)."""
    return [secret for secret in secrets if secret and secret in text]
