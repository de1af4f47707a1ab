"""The catalog's datasets: registered inputs by digest, with their aliases (`Catalog.datasets`)."""

from __future__ import annotations

import json

from actstore.store.catalog.family import AliasedFamily
from actstore.store.catalog.schema import DatasetRecord

_COLUMNS = "digest, kind, n, num_labels, has_groups, path, source"


class Datasets(AliasedFamily):
    columns = tuple(_COLUMNS.split(", "))
    table, alias_table, what = "datasets", "dataset_aliases", "dataset"

    def get(self, name_or_digest: str) -> DatasetRecord:
        """The dataset an alias, digest or unambiguous digest prefix names; NotFound otherwise."""
        r = self._row(name_or_digest, _COLUMNS)
        return DatasetRecord(*r[:6], source=json.loads(r[6]), aliases=self._aliases(r[0]))

    def all(self) -> list[DatasetRecord]:
        """Every dataset, oldest first."""
        return [self.get(digest) for digest in self._digests()]
