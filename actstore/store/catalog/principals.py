"""The catalog's principals: token holders by name and role, looked up by the token's hash; the
tokens themselves are never stored (`Catalog.principals`)."""

from __future__ import annotations

from actstore.errors import AlreadyExists, NotFound
from actstore.store.catalog.family import Family


class Principals(Family):
    def add(self, name: str, role: str, token_hash: str) -> None:
        if self._catalog.rows("SELECT 1 FROM principals WHERE name = ?", [name]):
            raise AlreadyExists(f"principal {name!r} exists: pick another name or revoke it first")
        self._catalog.execute("INSERT INTO principals (token_hash, name, role) VALUES (?, ?, ?)",
                              [token_hash, name, role])

    def revoke(self, name: str) -> None:
        if not self._catalog.rows("SELECT 1 FROM principals WHERE name = ?", [name]):
            raise NotFound(f"no principal named {name!r}")
        self._catalog.execute("DELETE FROM principals WHERE name = ?", [name])

    def all(self) -> list[tuple[str, str]]:
        """(name, role) of every token holder, by name; never the hashes."""
        return [(r[0], r[1]) for r in self._catalog.rows("SELECT name, role FROM principals ORDER BY name")]

    def by_token_hash(self, token_hash: str) -> tuple[str, str] | None:
        """(name, role) of the holder of the token with this hash, if any."""
        rows = self._catalog.rows("SELECT name, role FROM principals WHERE token_hash = ?", [token_hash])
        return (rows[0][0], rows[0][1]) if rows else None
