"""Recreate a lost catalog from the store alone: the store describes itself.

Every registered model's folder carries its record (``record.json``), every dataset's folder its
metadata, every run's group its spec and layout, every written shard its chunk rows, and every
committed run a commit marker written after the catalog commit. ``rebuild_catalog`` reads them
into a fresh catalog and reports what it could not recover: a shard that is missing or damaged
leaves its run uncommitted (``failed``, as `actstore verify --repair` leaves it) with the other
shards' chunk rows recorded, so submitting the same capture again rewrites only those shards.
``rebuild_catalog_file`` builds the catalog beside its target and moves it into place only once
complete: a rebuild that fails leaves no catalog behind. A write-ahead log that the lost catalog
left beside it (its server was killed) is moved aside first, as `catalog restore` moves it: DuckDB
would replay it onto the new file, and refuse to open that ("WAL does not match database file").
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from actstore.errors import AlreadyExists, DataLoss, NotFound
from actstore.store.array_store import StoreUpkeep
from actstore.store.atomic import FILE_MODE, fsync_path
from actstore.store.backends.files import RECORD_FILE
from actstore.store.catalog import Catalog, DatasetRecord, ModelRecord, RunRecord, backups
from actstore.store.datasets import load_dataset
from actstore.store.datasets.labels import label_set_record, load_label_set
from actstore.store.handle import StoreHandle
from actstore.store.keys import site_of

NOT_RECOVERABLE = (
    "cached metric results (they are recomputed on the next query)",
    "job history",
    "access tokens (create them again with `actstore token create`)",
    "aliases other than each model's and dataset's default name",
    "label-set names other than the name each set was first registered under",
)


@dataclass
class RebuildReport:
    models: int = 0
    datasets: int = 0
    label_sets: int = 0
    runs: int = 0
    committed_runs: int = 0
    chunk_rows: int = 0
    skipped: list[str] = field(default_factory=list)  # things found but not recovered, and why
    incomplete: list[str] = field(default_factory=list)  # runs recorded without some shards: which, what to do
    not_recoverable: tuple[str, ...] = NOT_RECOVERABLE
    wal_moved: Path | None = None  # where the lost catalog's write-ahead log went, if it left one


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
    known_datasets = {d.digest for d in catalog.datasets.all()}
    for key in files.folders("labels"):
        try:
            _add_label_set(catalog, store, key, known_datasets)
            report.label_sets += 1
        except (ValueError, KeyError, OSError, DataLoss) as exc:
            report.skipped.append(f"{key}: unreadable ({exc})")
    arrays = store.open()
    known_models = {m.digest for m in catalog.models.all()}
    for run_key in arrays.run_keys():
        try:
            spec = arrays.spec(run_key)
            layout = arrays.layout(run_key)
        except (DataLoss, NotFound) as exc:
            report.skipped.append(f"run {run_key[:12]}: its group is unreadable ({exc}); capture it again")
            continue
        if spec is None:
            report.skipped.append(f"run {run_key[:12]}: its group carries no spec (written by an older actstore)")
            continue
        if spec["model"] not in known_models or spec["dataset"] not in known_datasets:
            report.skipped.append(f"run {run_key[:12]}: its model or dataset is not in the store")
            continue
        record = RunRecord(run_key=run_key, model_digest=spec["model"],
                           dataset_digest=spec["dataset"], pooling=layout.pooling, dtype=layout.dtype,
                           max_len=spec["max_len"], n=layout.n, rows=layout.rows,
                           num_layers=layout.num_states - 1, width=layout.width, num_shards=layout.num_shards,
                           status="running", spec=spec)
        catalog.runs.open(record)
        rows, damaged = _readable_chunk_rows(arrays, run_key, layout.num_shards)
        if rows:
            catalog.chunks.insert(pa.table(rows))
            report.chunk_rows += len(rows["shard"])
        report.runs += 1
        committed = arrays.is_committed(run_key)
        if committed:  # every shard was written: one without rows is lost
            recorded = catalog.chunks.recorded_shards(run_key, record.num_layers)
            damaged |= {shard: f"shard {shard} is missing from the store" for shard in range(record.num_shards)
                        if shard not in recorded and shard not in damaged}
        if damaged:
            catalog.runs.set_status(run_key, "failed")
            report.incomplete.append(_incomplete(record, damaged, committed))
        elif committed:
            catalog.runs.commit(record)  # checks every shard's rows came back
            report.committed_runs += 1
    return report


def rebuild_catalog_file(store: StoreHandle, path: Path) -> RebuildReport:
    """`rebuild_catalog` into a new file beside ``path``, moved into place only when complete
    (AlreadyExists if a catalog is there by then; a failure leaves nothing behind)."""
    staged = path.with_name(f".{path.name}.staging-{uuid.uuid4().hex}")
    try:
        catalog = Catalog(staged)
        try:
            report = rebuild_catalog(store, catalog)
        finally:
            catalog.close()  # a checkpoint: the file alone holds everything
        fsync_path(staged)
        os.chmod(staged, FILE_MODE)
        if not path.exists():  # a catalog that appeared meanwhile owns the log beside it
            report.wal_moved = backups.move_wal_aside(path, backups.aside_path(path))
        try:
            os.link(staged, path)  # unlike a rename, never replaces a catalog that appeared meanwhile
        except FileExistsError:
            moved = f" (its write-ahead log was moved to {report.wal_moved} just before)" if report.wal_moved else ""
            raise AlreadyExists(f"the catalog {path} appeared while the rebuild ran (a server started?){moved}: "
                                "stop what created it, move it aside, and rebuild again") from None
        fsync_path(path.parent)
    finally:
        staged.unlink(missing_ok=True)
        staged.with_name(staged.name + ".wal").unlink(missing_ok=True)
    return report


def _readable_chunk_rows(arrays: StoreUpkeep, run_key: str, num_shards: int) -> tuple[dict[str, list], dict[int, str]]:
    """The chunk rows of every shard whose kept rows read back, and what is wrong with each other
    shard (a shard not stored has no rows and is not named: it may not have been written yet)."""
    try:
        return arrays.chunk_rows(run_key), {}  # every shard at once, the usual case
    except DataLoss:
        pass
    rows: dict[str, list] = {}
    damaged: dict[int, str] = {}
    for shard in range(num_shards):
        try:
            kept, _ = arrays.shard_details(run_key, shard)
        except DataLoss as exc:
            damaged[shard] = exc.damage  # "shard S of array A failed ...", without the advice
            continue
        for column, cells in (kept or {}).items():
            rows.setdefault(column, []).extend(cells)
    return rows, damaged


def _incomplete(record: RunRecord, damaged: dict[int, str], committed: bool) -> str:
    """The report line of a run recorded without some shards: which, why, and what rewrites them."""
    spec = record.spec
    again = ("import the same files again" if "source" in spec else
             f"submit the same capture again (`actstore capture --model {record.model_digest[:12]} --dataset "
             f"{record.dataset_digest[:12]} --pooling {record.pooling} --dtype {record.dtype} --max-len "
             f"{record.max_len} --site {site_of(spec)}`)")
    shards = "; ".join(why for _, why in sorted(damaged.items()))
    return (f"run {record.run_key[:12]}{' (committed in the store)' if committed else ''}: {len(damaged)} of "
            f"{record.num_shards} shards unreadable ({shards}), so it is recorded failed, with the other shards' "
            f"chunk rows: start the server and {again} to rewrite them")


def _add_model(catalog: Catalog, files, key: str) -> None:
    payload = files.read(key, RECORD_FILE)
    if payload is None:
        raise KeyError(RECORD_FILE)
    fields = json.loads(payload)
    lineage_file = files.read(key, "lineage.json")  # a training checkpoint's own lineage
    if lineage_file is not None:
        fields["lineage"] = {**fields["lineage"], **json.loads(lineage_file)}
    record = ModelRecord(**fields, path=files.ref(key))
    catalog.models.add(record)
    source = str(record.lineage.get("source", ""))
    catalog.models.set_alias(Path(source).name or record.digest[:12], record.digest)


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
    catalog.datasets.add(record)
    catalog.datasets.set_alias(_default_name(data.source, digest), digest)


def _add_label_set(catalog: Catalog, store: StoreHandle, key: str, known_datasets: set[str]) -> None:
    ref = store.files.ref(key)
    labels, digest, name = load_label_set(store.local(ref))
    if labels.dataset_digest not in known_datasets:
        raise KeyError(f"its dataset {labels.dataset_digest[:12]} is not in the store")
    catalog.label_sets.add(label_set_record(labels, digest, name or digest[:12], ref))


def _default_name(source: dict, digest: str) -> str:
    """The name registration gives by default: the builtin's, the file's stem, or texts-<digest>."""
    while isinstance(source, dict) and "of" in source:  # augmented: the name of what was augmented
        source = source["of"]
    if isinstance(source, dict) and source.get("builtin"):
        return str(source["builtin"])
    if isinstance(source, dict) and source.get("file"):
        return Path(str(source["file"])).stem
    return f"texts-{digest[:8]}"
