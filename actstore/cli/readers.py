"""Read-only SQL over the catalog of a running server (or the embedded one)."""

from __future__ import annotations

import json

from actstore.cli.common import add_option, connect, print_table
from actstore.options import SQL

SQL_HELP = """One SELECT over the catalog tables, answered by the server while it runs (plain duckdb
cannot open the catalog a server holds). Read-only: writes, ATTACH, COPY, PRAGMA, SET, file
readers (read_csv, FROM 'file') and table functions are refused. Tables: models, model_aliases,
datasets, dataset_aliases, runs, chunks, results, jobs (and audit for admins); columns in
docs/sql.md. Examples:

  actstore sql "SELECT pooling, count(*) AS runs, sum(n) AS samples FROM runs GROUP BY pooling"
  actstore sql "SELECT layer, sum(nan_count) FROM chunks WHERE run_key LIKE '3f2a%' GROUP BY layer"
"""


def cmd_sql(args) -> int:
    with connect(args) as client:
        answer = client.sql(args.query, limit=args.limit)
    if args.json:
        as_text = lambda v: v.hex() if isinstance(v, bytes) else str(v)  # noqa: E731 - blobs as hex
        print(json.dumps({"columns": answer.columns, "types": answer.types, "rows": answer.rows,
                          "truncated": answer.truncated}, default=as_text))
        return 0
    print_table([dict(zip(answer.columns, row)) for row in answer.rows], answer.columns)
    if answer.truncated:
        print(f"(cut at {len(answer.rows)} rows: more matched; narrow the query or raise --limit)")
    return 0


def add_commands(command) -> None:
    p = command("sql", cmd_sql, "read-only SQL over the catalog of the running server", SQL_HELP)
    p.add_argument("query", help="one SELECT statement (quote it)")
    add_option(p, SQL, "limit")
    p.add_argument("--json", action="store_true", help="print JSON (columns, types, rows, truncated)")
