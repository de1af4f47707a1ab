"""The catalog's models: registered checkpoints by digest, with their aliases (`Catalog.models`)."""

from __future__ import annotations

import json

from actstore.store.catalog.family import AliasedFamily
from actstore.store.catalog.schema import ModelRecord

_COLUMNS = "digest, kind, arch, num_layers, hidden_size, max_positions, path, has_head, lineage"


class Models(AliasedFamily):
    columns = tuple(_COLUMNS.split(", "))
    table, alias_table, what = "models", "model_aliases", "model"

    def get(self, name_or_digest: str) -> ModelRecord:
        """The model an alias, digest or unambiguous digest prefix names; NotFound otherwise."""
        r = self._row(name_or_digest, _COLUMNS)
        return ModelRecord(*r[:8], lineage=json.loads(r[8]), aliases=self._aliases(r[0]))

    def all(self) -> list[ModelRecord]:
        """Every model, oldest first."""
        return [self.get(digest) for digest in self._digests()]
