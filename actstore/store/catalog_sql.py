"""Read-only SQL over the catalog while the server holds it (docs/sql.md has the schema).

Plain `duckdb` cannot open the catalog file while a server holds it, and a second read-only
connection is impossible in the server's own process (DuckDB keeps one configuration per open
database), so a query runs on a cursor of the server's connection, inside four walls:

1. DuckDB's own parser (`extract_statements`): exactly one statement, and it must be a SELECT.
   INSERT, UPDATE, DELETE, CREATE, DROP, ALTER, ATTACH, DETACH, COPY, EXPORT, INSTALL, LOAD, SET,
   PRAGMA, CALL, BEGIN ... are other statement types: PERMISSION_DENIED.
2. The SELECT's syntax tree (DuckDB's `json_serialize_sql`): every table it names must be one of
   the readable catalog tables (or a CTE of the query); table functions (`read_csv`, `read_text`,
   `glob`, `query`, `duckdb_*` ...), SHOW/DESCRIBE/SUMMARIZE and replacement scans of a path
   (`FROM '/etc/passwd'`, which names a table) are refused; every function called must be one
   DuckDB has loaded (no extension is installed or loaded on a query's behalf), and none that
   reads server state rather than rows (`current_setting`, `getenv`, `version`, `nextval`,
   `pg_*` ...: `_reads_server_state`). `principals` (token hashes) is never readable; `audit`
   only by admins.
3. A READ ONLY transaction on the cursor, with the cursor's Python replacement scans off:
   a write that got past 1 and 2 would still fail.
4. A timer interrupts the query after `timeout` seconds, and at most `limit` rows are fetched.

`SET enable_external_access = false` is not used: it is a database-wide setting that cannot be
turned back on, and the server's own catalog backups `ATTACH` a new file (`store.backups`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import duckdb

from actstore.errors import DeadlineExceeded, InvalidArgument, PermissionDenied, ResourceExhausted

READABLE_TABLES = ("models", "model_aliases", "datasets", "dataset_aliases", "runs", "chunks", "results", "jobs")
ADMIN_TABLES = READABLE_TABLES + ("audit",)
_FUNCTION_TYPES = ("scalar", "aggregate", "macro", "window")
# scalar functions that answer from the server's settings, environment, session, sequences or
# system catalog instead of the query's rows (temp_directory, secret_directory, ... are paths)
_SERVER_STATE_FUNCTIONS = frozenset({
    "current_setting", "getvariable", "getenv", "version", "current_query", "current_query_id",
    "current_connection_id", "current_transaction_id", "txid_current", "current_user", "session_user", "user",
    "current_role", "current_catalog", "current_database", "current_schema", "current_schemas", "in_search_path",
    "get_block_size", "nextval", "currval", "stats",
})
# the PostgreSQL-compatibility functions read the system catalog, all but these two
_HARMLESS_PG_FUNCTIONS = frozenset({"pg_typeof", "pg_size_pretty"})


def _reads_server_state(name: str) -> bool:
    return (name in _SERVER_STATE_FUNCTIONS or name.startswith("duckdb_")
            or (name.startswith("pg_") and name not in _HARMLESS_PG_FUNCTIONS)
            or (name.startswith("has_") and name.endswith("_privilege")))


@dataclass(frozen=True)
class SqlAnswer:
    columns: list[str]
    types: list[str]
    rows: list[tuple[Any, ...]]
    truncated: bool


def _nodes(tree: Any) -> Iterator[dict]:
    if isinstance(tree, dict):
        yield tree
        for value in tree.values():
            yield from _nodes(value)
    elif isinstance(tree, list):
        for value in tree:
            yield from _nodes(value)


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


class CatalogSql:
    """Checks and runs one read-only query on a cursor of the catalog's connection."""

    def __init__(self, cursor_factory) -> None:
        self._cursor = cursor_factory
        with self._cursor() as cur:
            self._database = cur.execute("SELECT current_database()").fetchone()[0]
            self._functions = {name for (name,) in cur.execute(
                "SELECT DISTINCT function_name FROM duckdb_functions() WHERE function_type IN "
                f"({', '.join(repr(t) for t in _FUNCTION_TYPES)})").fetchall()}

    def check(self, cur: duckdb.DuckDBPyConnection, query: str, tables: tuple[str, ...]) -> str:
        """The one SELECT of `query`, or the error that says why it is refused."""
        try:
            statements = cur.extract_statements(query)
        except duckdb.Error as exc:
            raise InvalidArgument(f"the query does not parse: {_first_line(exc)}") from None
        if len(statements) != 1:
            raise InvalidArgument(f"send exactly one SQL statement (got {len(statements)})")
        (statement,) = statements
        if statement.type != duckdb.StatementType.SELECT:
            raise PermissionDenied(f"{statement.type.name} statements are refused: the SQL endpoint is read-only "
                                   "and answers one SELECT over the catalog tables (docs/sql.md)")
        tree = json.loads(cur.execute("SELECT json_serialize_sql(?)", [statement.query]).fetchone()[0])
        if tree.get("error"):
            raise PermissionDenied(f"this SELECT form is not answered ({tree.get('error_message')}): write a plain "
                                   "SELECT over the catalog tables")
        nodes = list(_nodes(tree))
        ctes = {entry["key"] for node in nodes if isinstance(node.get("cte_map"), dict)
                for entry in node["cte_map"].get("map", [])}
        readable = ", ".join(tables)
        for node in nodes:
            kind = node.get("type")
            if kind == "TABLE_FUNCTION":
                name = node.get("function", {}).get("function_name", "?")
                raise PermissionDenied(f"table function {name}() is refused (it reads files or server state): "
                                       f"query the catalog tables ({readable})")
            if kind == "SHOW_REF":
                raise PermissionDenied("SHOW, DESCRIBE and SUMMARIZE are refused: docs/sql.md lists every table "
                                       "and column")
            if kind == "BASE_TABLE":
                self._check_table(node, tables, ctes, readable)
            if node.get("class") not in ("FUNCTION", "WINDOW"):
                continue
            function = node.get("function_name", "?")
            if function not in self._functions:
                raise PermissionDenied(f"function {function}() is not available here (DuckDB's built-in functions "
                                       "only; no extension is loaded for a query)")
            if _reads_server_state(function.lower()):
                raise PermissionDenied(f"function {function}() is refused (it reads server settings or state, not "
                                       f"rows): query the catalog tables ({readable})")
        return statement.query

    def _check_table(self, node: dict, tables: tuple[str, ...], ctes: set[str], readable: str) -> None:
        name, schema, database = node.get("table_name", ""), node.get("schema_name", ""), node.get("catalog_name", "")
        if name in ctes and not schema and not database:
            return
        if database not in ("", self._database) or schema not in ("", "main") or name not in tables:
            shown = ".".join(part for part in (database, schema, name) if part)
            why = " (token hashes are never readable)" if name == "principals" else ""
            raise PermissionDenied(f"table {shown!r} is not readable{why}: the readable tables are {readable}")

    def run(self, query: str, tables: tuple[str, ...], limit: int, timeout: float) -> SqlAnswer:
        with self._cursor() as cur:
            statement = self.check(cur, query, tables)
            cur.execute("SET python_enable_replacements = false")  # this cursor only
            cur.execute("BEGIN TRANSACTION READ ONLY")
            timer = threading.Timer(timeout, cur.interrupt)
            timer.start()
            try:
                cur.execute(statement)
                columns = [d[0] for d in cur.description]
                types = [str(d[1]) for d in cur.description]
                rows = cur.fetchmany(limit + 1)
            except duckdb.InterruptException:
                raise DeadlineExceeded(f"the query ran longer than {timeout:g} s (ACTSTORE_SQL_TIMEOUT_SECONDS) and "
                                       "was stopped: narrow it (WHERE, LIMIT) or aggregate") from None
            except duckdb.OutOfMemoryException as exc:
                raise ResourceExhausted(f"the query needs more memory than the catalog may use ({_first_line(exc)}): "
                                        "narrow it or aggregate") from None
            except duckdb.TransactionException as exc:
                raise PermissionDenied(f"the query tried to write ({_first_line(exc)}): the SQL endpoint is "
                                       "read-only") from None
            except duckdb.Error as exc:
                raise InvalidArgument(f"the query failed: {_first_line(exc)}") from None
            finally:
                timer.cancel()
                cur.execute("ROLLBACK")
        return SqlAnswer(columns, types, rows[:limit], len(rows) > limit)
