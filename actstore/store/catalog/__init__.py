"""The catalog: what exists in the store, by digest and key, in one DuckDB file.

`Catalog` (`database`) owns the file's one connection and its lock; each table family's statements
are a module of their own (`models`, `datasets`, `label_sets`, `runs`, `chunks`, `results`, `jobs`,
`principals`, `audit`, on the base in `family`), reached as attributes of the catalog; the rows they
return are the records of `schema`. `sql` answers read-only SQL over the tables, `backups` copies,
keeps and restores the file.
"""

from actstore.store.catalog.database import Catalog
from actstore.store.catalog.schema import (
    CHUNK_SCHEMA,
    ChunkHealth,
    DatasetRecord,
    JobRecord,
    LabelSetRecord,
    ModelRecord,
    RunRecord,
)

__all__ = ["CHUNK_SCHEMA", "Catalog", "ChunkHealth", "DatasetRecord", "JobRecord", "LabelSetRecord", "ModelRecord",
           "RunRecord"]
