"""The base of the catalog's table families (`Catalog.models`, `.runs`, ...): each holds the
statements of the catalog it belongs to (`Statements`: what `store.catalog.Catalog` gives them, its
one connection and lock), not the catalog itself, so the families need nothing above them.

`AliasedFamily` is what models and datasets share: rows keyed by content digest, named by
user-chosen aliases (a table ``<family>_aliases``) or by an unambiguous digest prefix.
"""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from typing import Any, Protocol

import duckdb

from actstore.errors import InvalidArgument, NotFound

MIN_DIGEST_PREFIX = 8  # hex characters of a digest that name a model or dataset


class Statements(Protocol):
    """How a family reaches the catalog file (`store.catalog.Catalog` is the one implementation)."""

    def rows(self, sql: str, params: list | tuple = ()) -> list[tuple]:
        """The rows of one statement."""

    def execute(self, sql: str, params: list | tuple = ()) -> None:
        """Run one statement for its effect."""

    def connection(self) -> AbstractContextManager[duckdb.DuckDBPyConnection]:
        """The connection, held under the catalog's lock, for statements that must run together."""


class Family:
    """One table family of the catalog; statements go through ``self._catalog``."""

    def __init__(self, catalog: Statements) -> None:
        self._catalog = catalog


class AliasedFamily(Family):
    """A digest-keyed table with an alias table; ``what`` names the kind in messages and in the
    CLI command that lists it (``actstore {what}s``)."""

    table: str
    alias_table: str
    what: str
    columns: tuple[str, ...]  # the record's fields stored in `table`, in order; a dict is stored as JSON
    alias_writes = 0  # aliases set through this family: whoever remembers names compares it

    def add(self, record: Any) -> None:
        """Insert the record; a digest already known keeps its row as it is."""
        values = [getattr(record, column) for column in self.columns]
        self._catalog.execute(
            f"INSERT INTO {self.table} ({', '.join(self.columns)}) VALUES ({', '.join('?' * len(values))}) "
            "ON CONFLICT DO NOTHING", [json.dumps(v) if isinstance(v, dict) else v for v in values])

    def set_alias(self, alias: str, digest: str) -> None:
        if not alias or alias != alias.strip() or "/" in alias and alias.startswith("/"):
            raise InvalidArgument(f"alias {alias!r} is not a valid name (no leading '/', no padding)")
        self._catalog.execute(
            f"INSERT INTO {self.alias_table} (alias, digest) VALUES (?, ?) "
            "ON CONFLICT (alias) DO UPDATE SET digest = excluded.digest, updated_at = now()",
            [alias, digest],
        )
        self.alias_writes += 1

    def _aliases(self, digest: str) -> tuple[str, ...]:
        return tuple(r[0] for r in self._catalog.rows(
            f"SELECT alias FROM {self.alias_table} WHERE digest = ? ORDER BY alias", [digest]))

    def _resolve(self, name: str) -> str:
        hit = self._catalog.rows(f"SELECT digest FROM {self.alias_table} WHERE alias = ?", [name])
        if hit:
            return hit[0][0]
        matches = self._catalog.rows(f"SELECT digest FROM {self.table} WHERE starts_with(digest, ?)", [name])
        if len(matches) == 1 and len(name) >= MIN_DIGEST_PREFIX:
            return matches[0][0]
        if len(matches) > 1 and len(name) >= MIN_DIGEST_PREFIX:
            raise InvalidArgument(f"{self.what} prefix {name!r} is ambiguous: give more characters")
        raise NotFound(f"unknown {self.what} {name!r}: list them with `actstore {self.what}s` or register it first")

    def _row(self, name_or_digest: str, columns: str) -> tuple:
        """The ``columns`` of the row a name or digest resolves to (its digest first)."""
        digest = self._resolve(name_or_digest)
        row = self._catalog.rows(f"SELECT {columns} FROM {self.table} WHERE digest = ?", [digest])
        if not row:
            raise NotFound(f"alias {name_or_digest!r} points to {self.what} {digest[:12]} which is gone")
        return row[0]

    def _digests(self) -> list[str]:
        """Every digest of the table, oldest first."""
        return [r[0] for r in self._catalog.rows(f"SELECT digest FROM {self.table} ORDER BY created_at")]
