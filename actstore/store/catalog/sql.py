"""Read-only SQL over the catalog while the server holds it (docs/sql.md has the schema).

Plain `duckdb` cannot open the catalog file while a server holds it, so a query is answered in two
steps: checked on a cursor of the server's connection, then run in a sandbox, a separate in-memory
DuckDB database that holds copies of the tables the query names and the role may read, and nothing
else. The sandbox is the wall; the checks are there to say clearly why a query is refused.

1. DuckDB's own parser (`extract_statements`): exactly one statement, and it must be a SELECT.
   INSERT, UPDATE, DELETE, CREATE, DROP, ALTER, ATTACH, DETACH, COPY, EXPORT, INSTALL, LOAD, SET,
   PRAGMA, CALL, BEGIN ... are other statement types: PERMISSION_DENIED.
2. The SELECT's syntax tree (DuckDB's `json_serialize_sql`): every table it names must be one of
   the role's readable catalog tables, or a CTE in scope where it is named, scoped as DuckDB's
   binder does (`_table_references`: a CTE's body sees the CTEs listed before it, not itself
   unless it is the recursive part of a recursive CTE), so `WITH audit AS (SELECT * FROM audit)`
   names the table `audit` and a reader gets PERMISSION_DENIED, as for `FROM audit`; table functions (`read_csv`,
   `read_text`, `glob`, `query`, `duckdb_*` ...), SHOW/DESCRIBE/SUMMARIZE and replacement scans of a
   path (`FROM '/etc/passwd'`, which names a table) are refused; every function called must be one
   DuckDB has loaded, and none that reads server state rather than rows (`current_setting`,
   `getenv`, `version`, `nextval`, `pg_*` ...: `_reads_server_state`). `principals` (token hashes)
   is never readable; `audit` only by admins.
3. The sandbox. The readable tables the query names are copied, in one read-only transaction of the
   catalog (a consistent snapshot), into a fresh in-memory database; then its external access is
   switched off (no file, URL, extension or ATTACH: DuckDB's `enable_external_access = false`), its
   Python replacement scans too, and its configuration is locked, before the query runs there. So
   whatever a query's syntax hides from the checks in 2 (a CTE named like a path or like a hidden
   table, a function the lists miss), it can read only those copies: `principals`, `audit` for a
   non-admin, the server's files and its settings are not in the sandbox, and nothing the query
   does there reaches the catalog. The sandbox has its own memory limit and one thread, and is
   closed after the query.
4. A timer interrupts the copy or the query after `timeout` seconds, and at most `limit` rows are
   fetched.

The catalog itself keeps external access: it is a database-wide setting that cannot be turned back
on, and the server's own catalog backups `ATTACH` a new file (`store.catalog.backups`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import duckdb

from actstore.errors import DeadlineExceeded, InvalidArgument, PermissionDenied, ResourceExhausted

READABLE_TABLES = ("models", "model_aliases", "datasets", "dataset_aliases", "label_sets", "runs", "chunks", "results",
                   "jobs")
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


def _table_references(tree: Any, scope: frozenset[str] = frozenset()) -> Iterator[tuple[dict, frozenset[str]]]:
    """Every BASE_TABLE node of `tree` with the CTE names visible where it stands, as DuckDB binds
    them: the CTEs of a WITH are visible in its query, and each in the bodies of those listed
    after it; a CTE's own name is visible in its body only in the recursive part (the right side)
    of a recursive CTE. Elsewhere the name is a table."""
    if isinstance(tree, list):
        for value in tree:
            yield from _table_references(value, scope)
        return
    if not isinstance(tree, dict):
        return
    if tree.get("type") == "BASE_TABLE":
        yield tree, scope
    entries = tree.get("cte_map", {}).get("map", []) if isinstance(tree.get("cte_map"), dict) else []
    listed = scope
    for entry in entries:
        body = entry.get("value", {}).get("query_node", {})
        if isinstance(body, dict) and body.get("type") == "RECURSIVE_CTE_NODE":
            yield from _table_references({k: v for k, v in body.items() if k != "right"}, listed)
            yield from _table_references(body.get("right"), listed | {body.get("cte_name") or entry["key"]})
        else:
            yield from _table_references(body, listed)
        listed = listed | {entry["key"]}
    for key, value in tree.items():
        if key != "cte_map":
            yield from _table_references(value, listed)


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


class CatalogSql:
    """Checks one read-only query on a cursor of the catalog's connection and runs it in a sandbox
    holding copies of the readable tables it names."""

    def __init__(self, cursor_factory, sandbox_memory_bytes: int) -> None:
        self._cursor = cursor_factory
        self._sandbox_memory_bytes = sandbox_memory_bytes
        with self._cursor() as cur:
            self._database = cur.execute("SELECT current_database()").fetchone()[0]
            self._functions = {name for (name,) in cur.execute(
                "SELECT DISTINCT function_name FROM duckdb_functions() WHERE function_type IN "
                f"({', '.join(repr(t) for t in _FUNCTION_TYPES)})").fetchall()}

    def check(self, cur: duckdb.DuckDBPyConnection, query: str, tables: tuple[str, ...]) -> tuple[str, set[str]]:
        """The one SELECT of `query` and the readable tables it names, or the error that says why it
        is refused."""
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
        readable = ", ".join(tables)
        named: set[str] = set()
        for node, ctes in _table_references(tree):
            named |= self._check_table(node, tables, ctes, readable)
        for node in _nodes(tree):
            kind = node.get("type")
            if kind == "TABLE_FUNCTION":
                name = node.get("function", {}).get("function_name", "?")
                raise PermissionDenied(f"table function {name}() is refused (it reads files or server state): "
                                       f"query the catalog tables ({readable})")
            if kind == "SHOW_REF":
                raise PermissionDenied("SHOW, DESCRIBE and SUMMARIZE are refused: docs/sql.md lists every table "
                                       "and column")
            if node.get("class") not in ("FUNCTION", "WINDOW"):
                continue
            function = node.get("function_name", "?")
            if function not in self._functions:
                raise PermissionDenied(f"function {function}() is not available here (DuckDB's built-in functions "
                                       "only; no extension is loaded for a query)")
            if _reads_server_state(function.lower()):
                raise PermissionDenied(f"function {function}() is refused (it reads server settings or state, not "
                                       f"rows): query the catalog tables ({readable})")
        return statement.query, named

    def _check_table(self, node: dict, tables: tuple[str, ...], ctes: frozenset[str], readable: str) -> set[str]:
        """The readable table `node` names (none for a CTE in scope there), or PermissionDenied."""
        name, schema, database = node.get("table_name", ""), node.get("schema_name", ""), node.get("catalog_name", "")
        if name in ctes and not schema and not database:
            # should the scoping above miss a case, the sandbox still holds: a readable table of the
            # name gets its copy there; anything else so named (a path, `principals`) is not there
            return {name} if name in tables else set()
        if database not in ("", self._database) or schema not in ("", "main") or name not in tables:
            shown = ".".join(part for part in (database, schema, name) if part)
            why = " (token hashes are never readable)" if name == "principals" else ""
            raise PermissionDenied(f"table {shown!r} is not readable{why}: the readable tables are {readable}")
        return {name}

    def run(self, query: str, tables: tuple[str, ...], limit: int, timeout: float) -> SqlAnswer:
        watch = _Watchdog(timeout)
        try:
            with self._cursor() as cur:
                statement, named = self.check(cur, query, tables)
                with watch.watching(cur):
                    copies = copy_tables(cur, sorted(named))
            with sandbox(copies, self._sandbox_memory_bytes) as box, watch.watching(box):
                box.execute(statement)
                columns = [d[0] for d in box.description]
                types = [str(d[1]) for d in box.description]
                rows = box.fetchmany(limit + 1)
        except duckdb.InterruptException:
            raise DeadlineExceeded(f"the query ran longer than {timeout:g} s (ACTSTORE_SQL_TIMEOUT_SECONDS) and "
                                   "was stopped: narrow it (WHERE, LIMIT) or aggregate") from None
        except duckdb.OutOfMemoryException as exc:
            raise ResourceExhausted(f"the query needs more memory than a query may use ({_first_line(exc)}, "
                                    "ACTSTORE_SQL_MEMORY_BYTES): narrow it or aggregate") from None
        except duckdb.PermissionException as exc:
            raise PermissionDenied(f"the query tried to reach outside the catalog tables ({_first_line(exc)}): the "
                                   "SQL endpoint reads only the catalog tables (docs/sql.md)") from None
        except duckdb.Error as exc:
            raise InvalidArgument(f"the query failed: {_first_line(exc)}") from None
        finally:
            watch.cancel()
        return SqlAnswer(columns, types, rows[:limit], len(rows) > limit)


class _Watchdog:
    """Interrupts every connection handed to it once `timeout` seconds have passed since it was made.

    Once the time is up it interrupts them again every `REPEAT_SECONDS` until cancelled: DuckDB
    clears a connection's interrupt when its next statement starts, so one interrupt that lands
    between two statements (or before the first, on a loaded machine) would be lost, and an endless
    query would run on."""

    REPEAT_SECONDS = 0.05

    def __init__(self, timeout: float) -> None:
        self._connections: list[duckdb.DuckDBPyConnection] = []
        self._lock = threading.Lock()
        self._cancelled = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(timeout,), name="sql-watchdog", daemon=True)
        self._thread.start()

    @contextmanager
    def watching(self, con: duckdb.DuckDBPyConnection) -> Iterator[None]:
        """Interrupts `con` when the time is up, while the block runs (never once it is closed)."""
        with self._lock:
            self._connections.append(con)
        try:
            yield
        finally:
            with self._lock:
                self._connections.remove(con)

    def _watch(self, timeout: float) -> None:
        if self._cancelled.wait(timeout):
            return
        while True:
            with self._lock:
                for con in self._connections:
                    con.interrupt()
            if self._cancelled.wait(self.REPEAT_SECONDS):
                return

    def cancel(self) -> None:
        self._cancelled.set()
        self._thread.join()


def copy_tables(cur: duckdb.DuckDBPyConnection, names: list[str]) -> dict[str, tuple[str, Any]]:
    """Each named catalog table as (its column list for CREATE TABLE, its rows as an Arrow table),
    read in one read-only transaction so that the copies agree with each other."""
    copies = {}
    cur.execute("BEGIN TRANSACTION READ ONLY")
    try:
        for name in names:
            columns = cur.execute(
                "SELECT column_name, data_type FROM duckdb_columns() WHERE database_name = current_database() "
                "AND schema_name = 'main' AND table_name = ? ORDER BY column_index", [name]).fetchall()
            ddl = ", ".join(f"{_quoted(column)} {data_type}" for column, data_type in columns)
            copies[name] = (ddl, cur.table(name).to_arrow_table())
    finally:
        cur.execute("ROLLBACK")
    return copies


@contextmanager
def sandbox(copies: dict[str, tuple[str, Any]], memory_bytes: int) -> Iterator[duckdb.DuckDBPyConnection]:
    """A fresh in-memory database holding `copies` and nothing else, with no way out: external access
    (files, URLs, extensions, ATTACH) and Python replacement scans off, its configuration locked."""
    config = {"threads": 1, "memory_limit": f"{max(memory_bytes // 2**20, 16)}MiB",
              "autoload_known_extensions": False, "autoinstall_known_extensions": False}
    box = duckdb.connect(":memory:", config=config)
    try:
        while copies:  # popped: each Arrow copy is freed once the sandbox holds its rows
            name, (ddl, rows) = copies.popitem()
            box.execute(f"CREATE TABLE {_quoted(name)} ({ddl})")
            box.register("_catalog_copy", rows)
            box.execute(f"INSERT INTO {_quoted(name)} SELECT * FROM _catalog_copy")
            box.unregister("_catalog_copy")
        box.execute("SET enable_external_access = false")
        box.execute("SET python_enable_replacements = false")
        box.execute("SET lock_configuration = true")
        yield box
    finally:
        box.close()


def _quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'
