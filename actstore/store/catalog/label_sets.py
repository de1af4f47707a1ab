"""The catalog's label sets: labels registered against a dataset by sample id, each under a name
unique within its dataset (`Catalog.label_sets`). The sets themselves are folders of the store
(`store.datasets.labels`); a row names one."""

from __future__ import annotations

import json

from actstore.errors import AlreadyExists, NotFound
from actstore.store.catalog.family import Family
from actstore.store.catalog.schema import LabelSetRecord

_COLUMNS = "dataset_digest, name, digest, kind, classes, labelled, samples, path, source"


class LabelSets(Family):
    def add(self, record: LabelSetRecord) -> LabelSetRecord:
        """Record the set under its name; the same set under its own name again is a no-op."""
        with self._catalog.connection() as con:
            existing = self.held(record.dataset_digest, record.name, record.digest)
            if existing is not None:
                return existing
            con.execute(f"INSERT INTO label_sets ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        [record.dataset_digest, record.name, record.digest, record.kind, json.dumps(record.classes),
                         record.labelled, record.samples, record.path, json.dumps(record.source)])
        return record

    def held(self, dataset_digest: str, name: str, digest: str) -> LabelSetRecord | None:
        """The record `name` holds if it holds the set `digest`; None if the name is free; and
        AlreadyExists if it holds another set of the dataset: a name is never moved (a shared
        store's `--labels NAME` would silently mean other labels)."""
        rows = self._catalog.rows(f"SELECT {_COLUMNS} FROM label_sets WHERE dataset_digest = ? AND name = ?",
                                  [dataset_digest, name])
        if not rows:
            return None
        existing = _record(rows[0])
        if existing.digest != digest:
            raise AlreadyExists(f"dataset {dataset_digest[:12]} already has a label set named {name!r} "
                                f"({existing.digest[:12]}, {existing.labelled} labels); this one is {digest[:12]}: "
                                "register it under another --name")
        return existing

    def get(self, dataset_digest: str, name: str) -> LabelSetRecord:
        """The set `name` (a name, a digest or a digest prefix of >= 8 characters) of the dataset;
        NotFound naming the dataset's sets otherwise (and where the name is another dataset's)."""
        rows = self._catalog.rows(f"SELECT {_COLUMNS} FROM label_sets WHERE dataset_digest = ? AND "
                                  "(name = ? OR (length(?) >= 8 AND starts_with(digest, ?))) ORDER BY name = ? DESC",
                                  [dataset_digest, name, name, name, name])
        if rows:
            return _record(rows[0])
        others = self._catalog.rows("SELECT DISTINCT dataset_digest FROM label_sets WHERE name = ?", [name])
        known = ", ".join(r.name for r in self.of(dataset_digest)) or "none"
        elsewhere = (f"; {name!r} is a label set of dataset {others[0][0][:12]}, not of this one: probe a run of "
                     "that dataset, or register the labels against this one") if others else ""
        raise NotFound(f"dataset {dataset_digest[:12]} has no label set {name!r} (its sets: {known}){elsewhere}. "
                       "Register one with `actstore register-labels DATASET FILE --name NAME`")

    def of(self, dataset_digest: str | None = None) -> list[LabelSetRecord]:
        """The sets of one dataset (None: of all), oldest first."""
        where, params = ("WHERE dataset_digest = ?", [dataset_digest]) if dataset_digest else ("", [])
        return [_record(r) for r in self._catalog.rows(
            f"SELECT {_COLUMNS} FROM label_sets {where} ORDER BY created_at, name", params)]


def _record(row: tuple) -> LabelSetRecord:
    return LabelSetRecord(row[0], row[1], row[2], row[3], tuple(json.loads(row[4]) or ()), int(row[5]), int(row[6]),
                          row[7], json.loads(row[8]))
