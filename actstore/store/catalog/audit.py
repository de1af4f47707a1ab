"""The catalog's audit log: who called which method on what, and the outcome (`Catalog.audit`;
`server.audit` decides what is recorded)."""

from __future__ import annotations

from actstore.store.catalog.family import Family


class Audit(Family):
    def record(self, principal: str | None, method: str, target: str, status: str) -> None:
        self._catalog.execute("INSERT INTO audit (principal, method, target, status) VALUES (?, ?, ?, ?)",
                              [principal, method, target, status])
