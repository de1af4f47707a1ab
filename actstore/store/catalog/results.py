"""The catalog's stored results: computed metrics by result key, with the runs they read
(`Catalog.results`); deleting a run deletes its results (`Catalog.runs.delete`)."""

from __future__ import annotations

import json

from actstore.store.catalog.family import Family


class Results(Family):
    def get(self, result_key: str) -> tuple[bytes, float] | None:
        """(payload, compute seconds) of the stored result, if any."""
        record = self.get_record(result_key)
        return (record[4], record[5]) if record else None

    def get_record(self, result_key: str) -> tuple[str, int, dict, list[str], bytes, float] | None:
        """(metric, version, options, run keys, payload, compute seconds) of the stored result, if any."""
        rows = self._catalog.rows("SELECT metric, version, options, run_keys, payload, seconds FROM results "
                                  "WHERE result_key = ?", [result_key])
        if not rows:
            return None
        metric, version, options, run_keys, payload, seconds = rows[0]
        return metric, version, json.loads(options), json.loads(run_keys), bytes(payload), seconds

    def put(self, result_key: str, metric: str, version: int, options: dict,
            run_keys: list[str], payload: bytes, seconds: float, replace: bool = False) -> None:
        """Store a result under its key. A stored result stays as it is unless `replace` (a
        recomputation the user asked for): then the new payload and compute time take its place."""
        conflict = ("DO UPDATE SET payload = excluded.payload, seconds = excluded.seconds, "
                    "created_at = now()") if replace else "DO NOTHING"
        self._catalog.execute(
            "INSERT INTO results (result_key, metric, version, options, run_keys, payload, seconds) "
            f"VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (result_key) {conflict}",
            [result_key, metric, version, json.dumps(options), json.dumps(run_keys), payload, seconds],
        )

    def cached(self) -> list[tuple[str, str, int, float]]:
        """(result key, metric, payload bytes, age in seconds) of every stored result, oldest first."""
        return self._catalog.rows("SELECT result_key, metric, octet_length(payload), "
                                  "epoch(current_timestamp::TIMESTAMP - created_at) FROM results ORDER BY created_at, "
                                  "result_key")

    def delete(self, result_keys: list[str]) -> None:
        self._catalog.execute("DELETE FROM results WHERE list_contains(?, result_key)", [result_keys])
