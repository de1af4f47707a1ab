"""Recreate a lost catalog from the store alone: the store describes itself.

Every registered model's folder carries its record (``record.json``), every dataset's folder its
metadata, every run's group its spec and layout, every written shard its chunk rows, and every
committed run a commit marker written after the catalog commit. ``rebuild_catalog`` reads them
into a fresh catalog and reports what it could not recover.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from actstore.errors import DataLoss
from actstore.store.catalog import Catalog, DatasetRecord, ModelRecord, RunRecord
from actstore.store.datasets import load_dataset
from actstore.store.files import RECORD_FILE
from actstore.store.handle import StoreHandle

NOT_RECOVERABLE = (
    "cached metric results (they are recomputed on the next query)",
    "job history",
    "access tokens (create them again with `actstore token create`)",
    "aliases other than each model's and dataset's default name",
)


@dataclass
class RebuildReport:
    models: int = 0
    datasets: int = 0
    runs: int = 0
    committed_runs: int = 0
    chunk_rows: int = 0
    skipped: list[str] = field(default_factory=list)  # things found but not recovered, and why
    not_recoverable: tuple[str, ...] = NOT_RECOVERABLE


def rebuild_catalog(store: StoreHandle, catalog: Catalog) -> RebuildReport:
    report = RebuildReport()
    files = store.files
    for key in files.folders("models"):
        try:
            _add_model(catalog, files, key)
            report.models += 1
        except (ValueError, KeyError, TypeError, DataLoss) as exc:
            report.skipped.append(f"{key}: its {RECORD_FILE} is missing or unreadable ({exc})")
    for key in files.folders("datasets"):
        try:
            _add_dataset(catalog, store, key)
            report.datasets += 1
        except (ValueError, KeyError, OSError, DataLoss) as exc:
            report.skipped.append(f"{key}: unreadable ({exc})")
    arrays = store.open()
    known_models = {m.digest for m in catalog.models()}
    known_datasets = {d.digest for d in catalog.datasets()}
    for run_key in arrays.run_keys():
        spec = arrays.spec(run_key)
        if spec is None:
            report.skipped.append(f"run {run_key[:12]}: its group carries no spec (written by an older actstore)")
            continue
        if spec["model"] not in known_models or spec["dataset"] not in known_datasets:
            report.skipped.append(f"run {run_key[:12]}: its model or dataset is not in the store")
            continue
        layout = arrays.layout(run_key)
        record = RunRecord(run_key=run_key, model_digest=spec["model"],
                           dataset_digest=spec["dataset"], pooling=layout.pooling, dtype=layout.dtype,
                           max_len=spec["max_len"], n=layout.n, rows=layout.rows,
                           num_layers=layout.num_states - 1, width=layout.width, num_shards=layout.num_shards,
                           status="running", spec=spec)
        catalog.open_run(record)
        rows = arrays.chunk_rows(run_key)
        if rows:
            catalog.record_shard(pa.table(rows))
            report.chunk_rows += len(rows["shard"])
        report.runs += 1
        if arrays.is_committed(run_key):
            catalog.commit_run(record)  # checks every shard's rows came back
            report.committed_runs += 1
    return report


def _add_model(catalog: Catalog, files, key: str) -> None:
    payload = files.read(key, RECORD_FILE)
    if payload is None:
        raise KeyError(RECORD_FILE)
    fields = json.loads(payload)
    lineage_file = files.read(key, "lineage.json")  # a training checkpoint's own lineage
    if lineage_file is not None:
        fields["lineage"] = {**fields["lineage"], **json.loads(lineage_file)}
    record = ModelRecord(**fields, path=files.ref(key))
    catalog.add_model(record)
    source = str(record.lineage.get("source", ""))
    catalog.set_model_alias(Path(source).name or record.digest[:12], record.digest)


def _add_dataset(catalog: Catalog, store: StoreHandle, key: str) -> None:
    ref = store.files.ref(key)
    data = load_dataset(store.local(ref))
    digest = key.rsplit("/", 1)[-1]
    record = DatasetRecord(
        digest=digest, kind=data.kind, n=data.n,
        num_labels=len(data.label_names) if data.label_names else
        (int(np.max(data.labels)) + 1 if data.labels is not None else 0),
        has_groups=data.groups is not None, path=ref, source=data.source,
    )
    catalog.add_dataset(record)
    catalog.set_dataset_alias(_default_name(data.source, digest), digest)


def _default_name(source: dict, digest: str) -> str:
    """The name registration gives by default: the builtin's, the file's stem, or texts-<digest>."""
    while isinstance(source, dict) and "of" in source:  # augmented: the name of what was augmented
        source = source["of"]
    if isinstance(source, dict) and source.get("builtin"):
        return str(source["builtin"])
    if isinstance(source, dict) and source.get("file"):
        return Path(str(source["file"])).stem
    return f"texts-{digest[:8]}"
