"""Registering models, datasets and label sets: load them once, store them under their digest,
catalog them with an alias (a label set: a name within its dataset). Model loading runs in a Ray
task (torch stays out of the server process)."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actstore.config import Settings
from actstore.errors import ActStoreError, AlreadyExists, InvalidArgument, NotFound, Unavailable
from actstore.modeling.sources import BUILTIN_MODELS
from actstore.options import DATASETS, LABELS
from actstore.server.dispatch import get_or_raise
from actstore.store import datasets as ds
from actstore.store.catalog import Catalog, DatasetRecord, LabelSetRecord, ModelRecord
from actstore.store.datasets import labels
from actstore.store.handle import StoreHandle
from actstore.workers.registry import register_model

log = logging.getLogger(__name__)
T = TypeVar("T")

# What a caller is told about a file on the server it cannot use, by kind: the general
# requirements only, never what the file holds (its header, its values) or why in detail.
_UNUSABLE = {
    "dataset": "is not a usable dataset file: it must be a .csv (with a header row), .jsonl, .json, .npz, "
               ".parquet or .arrow file or a Hugging Face save_to_disk folder, with the columns (of the types) "
               "the request names",
    "activations": "is not a usable activations source: it must be one of the layouts of docs/import.md (layer_<k>.npy "
                   "or .safetensors arrays, vLLM extract_hidden_states files, a SAELens dataset) of float values, "
                   "matching the model and the dataset",
    "model": "is not a model folder the server can load: it must be a Hugging Face model folder (config.json, "
             "weights and, for text, a tokenizer) of a supported architecture",
    "labels": "is not a usable label file: it must be a .csv (with a header row), .jsonl, .json or .parquet file "
              "with the id and label columns the request names, its ids those of the dataset",
}


@dataclass(frozen=True)
class DatasetSource:
    """Where a dataset comes from: exactly one of path, builtin, texts."""

    path: str | None = None
    builtin: str | None = None
    texts: list[str] | None = None
    labels: list[int] | None = None
    sample_ids: list[str] | None = None
    label_names: list[str] | None = None
    limit: int | None = None
    seed: int = 0
    split: str | None = None
    text_column: str = DATASETS.text_column.default
    label_column: str | None = None
    id_column: str | None = None
    group_column: str | None = None
    augment_views: int = 0
    augment_method: str = DATASETS.augment_method.default


@dataclass(frozen=True)
class LabelsSource:
    """Where a label set comes from: a file on the server's disk, or ids and values sent inline
    (values "" / None / NaN: no label)."""

    path: str | None = None
    sample_ids: list[str] | None = None
    values: list | None = None
    id_column: str = LABELS.id_column.default
    label_column: str = LABELS.label_column.default
    kind: str = LABELS.kind.default


NAME_MAX, PATH_MAX = 255, 4096  # bytes of one path component and of a whole path (Linux)


def server_path(path: str, what: str) -> Path:
    """A path on the server's disk as a request names it, refused before any file call when no
    file system could hold it (a NUL byte, a name over 255 bytes, a path over 4096)."""
    if "\x00" in path:
        raise InvalidArgument(f"the {what} path holds a NUL byte: send the path as text, without NUL characters")
    raw = os.fsencode(path)
    longest = max((len(part) for part in raw.split(b"/")), default=0)
    if len(raw) > PATH_MAX or longest > NAME_MAX:
        raise InvalidArgument(f"the {what} path is too long for a file system (a name over {NAME_MAX} bytes "
                              f"or a path over {PATH_MAX}): {path[:80]}...")
    try:
        return Path(path).expanduser()
    except RuntimeError:  # "~name" for a user the server does not have
        raise InvalidArgument(f"the {what} path {path[:80]!r} starts with a user the server does not know: "
                              "give an absolute path") from None


class Registrar:
    def __init__(self, catalog: Catalog, store: StoreHandle, settings: Settings) -> None:
        self.catalog = catalog
        self.store = store
        self.settings = settings
        # with auth on, callers are not the server's owner: what its files hold stays on the server
        self.redact_file_errors = settings.auth

    def from_server_path(self, path: str, kind: str, load: Callable[[], T]) -> T:
        """`load()` of a file (dataset), folder (model) or either (dataset, activations) on the server's
        disk (`kind` is a key of _UNUSABLE). Redacted, a failure
        says only that the path is not found or not readable, or not usable and what a usable one
        is; the detail goes to the server log under an incident id the message names."""
        if not self.redact_file_errors:
            return load()
        p = server_path(path, kind)
        try:
            usable = {"model": p.is_dir(), "dataset": p.is_file() or ds.is_dataset_folder(p),
                      "activations": p.exists(), "labels": p.is_file()}[kind] and os.access(p, os.R_OK)
        except (OSError, ValueError):  # a name too long, a NUL byte
            usable = False
        if not usable:
            raise NotFound(f"{path}: not found or not readable by the server")
        try:
            return load()
        except ActStoreError as exc:
            incident = uuid.uuid4().hex[:12]
            log.warning("registering the %s at %s failed (incident %s): %s", kind, path, incident, exc)
            raise InvalidArgument(f"{path} {_UNUSABLE[kind]} (the server's log has the details under incident "
                                  f"{incident})") from None

    def register_model(self, *, path: str | None = None, builtin: str | None = None,
                       name: str | None = None, lineage: dict | None = None, num_cpus: float = 1) -> ModelRecord:
        """`num_cpus`: what the loading task asks of Ray (`register_stored_model` says when 0)."""
        if bool(path) == bool(builtin):
            raise InvalidArgument("give exactly one of a model folder path or a builtin name "
                                  f"({', '.join(BUILTIN_MODELS)})")
        if builtin:
            if builtin not in BUILTIN_MODELS:
                raise NotFound(f"no builtin model {builtin!r}; the builtins are {', '.join(BUILTIN_MODELS)}")
            try:  # registered before: the alias is the cache (SmolLM2 takes ~20 s to dequantise)
                held = self.catalog.models.get(name or builtin)
            except NotFound:
                held = None
            if held is not None and held.lineage.get("source") == builtin:
                return held
            if held is not None:
                raise AlreadyExists(f"the alias {name or builtin!r} is held by model {held.digest[:12]} ({held.arch}, "
                                    f"from {held.lineage.get('source', 'a folder')}), not the builtin {builtin}: "
                                    "register the builtin under another --name")
        # a folder path names a folder on this (the head's) disk: load it here
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)

        def load() -> ModelRecord:
            source = builtin or str(server_path(path, "model").resolve())
            task = ray.remote(num_cpus=num_cpus)(register_model).options(
                scheduling_strategy=here if path else "DEFAULT").remote(source, self.store)
            return get_or_raise(task, lambda cause: InvalidArgument(f"the model at {source} failed to load: {cause}"))

        registered = self.from_server_path(path, "model", load) if path else load()
        record = replace(registered, lineage={**registered.lineage, **(lineage or {})})
        self.catalog.models.add(record)
        self.catalog.models.set_alias(name or builtin or Path(path).name, record.digest)
        return self.catalog.models.get(record.digest)

    def register_stored_model(self, key: str, name: str, lineage: dict) -> ModelRecord:
        """Register the model folder `key` of the store's files area (a training checkpoint that a
        task on any node uploaded) under `name`. With an object store a task on any node loads
        it from the store; a local store's folder is registered as a folder of the server's disk.
        The loading task reserves no CPU: it runs while the training that writes the checkpoints
        holds every CPU of its node, which a task asking for one would wait out (and the job with it)."""
        if not self.store.is_remote:
            return self.register_model(path=self.store.files.ref(key), name=name, lineage=lineage, num_cpus=0)
        task = ray.remote(num_cpus=0)(register_model).remote(key, self.store, True)
        registered = get_or_raise(task, lambda cause: Unavailable(
            f"the stored model {key} in {self.store.root} could not be registered: {cause}; submitting the "
            "training again registers it (its checkpoints stay in the store)"))
        record = replace(registered, lineage={**registered.lineage, **lineage})
        self.catalog.models.add(record)
        self.catalog.models.set_alias(name, record.digest)
        return self.catalog.models.get(record.digest)

    def register_dataset(self, source: DatasetSource, name: str | None = None) -> DatasetRecord:
        chosen = [s for s in (source.path, source.builtin, source.texts) if s is not None and s != ""]
        if len(chosen) != 1:
            raise InvalidArgument("give exactly one dataset source: a file path, a builtin name "
                                  f"({', '.join(ds.BUILTIN_DATASETS)}) or a list of texts")
        if source.builtin:
            data = ds.load_builtin(source.builtin, limit=source.limit, seed=source.seed, split=source.split)
        elif source.path:
            data = self.from_server_path(source.path, "dataset", lambda: ds.load_file(
                server_path(source.path, "dataset"), text_column=source.text_column,
                label_column=source.label_column, id_column=source.id_column, group_column=source.group_column,
                split=source.split))
            if source.limit:
                data = data.take(range(min(source.limit, data.n)))
        else:
            data = ds.from_texts(source.texts, labels=source.labels or None, sample_ids=source.sample_ids or None)
            if source.label_names:
                data = replace(data, label_names=list(source.label_names))
        if source.augment_views > 1:
            data = ds.augment_texts(data, n_views=source.augment_views, method=source.augment_method,
                                    seed=source.seed)
        digest = ds.dataset_digest(data)
        alias = name or (source.builtin or (Path(source.path).stem if source.path else f"texts-{digest[:8]}"))
        self._check_dataset_alias(alias, digest, data.n)
        ref = self.store.files.write_folder(f"datasets/{digest}", lambda target: ds.save_dataset(data, target))
        record = DatasetRecord(
            digest=digest, kind=data.kind, n=data.n,
            num_labels=len(data.label_names) if data.label_names else
            (int(data.labels.max()) + 1 if data.labels is not None else 0),
            has_groups=data.groups is not None, path=ref, source=data.source,
        )
        self.catalog.datasets.add(record)
        self.catalog.datasets.set_alias(alias, digest)
        return self.catalog.datasets.get(digest)

    def register_labels(self, dataset: str, source: LabelsSource, name: str | None = None) -> LabelSetRecord:
        """A label set for `dataset`'s samples, by sample id (`store.datasets.labels`): stored as a
        folder of its digest, then catalogued under `name` (a name is never moved to other labels)."""
        if bool(source.path) == (source.sample_ids is not None):
            raise InvalidArgument("give exactly one label source: a file path, or sample ids with their labels")
        record = self.catalog.datasets.get(dataset)
        dataset_ids = ds.load_dataset(self.store.local(record.path)).sample_ids
        if source.path:
            where = source.path
            ids, values = self.from_server_path(source.path, "labels", lambda: labels.read_label_file(
                server_path(source.path, "labels"), source.id_column, source.label_column))
            origin = {"file": str(server_path(source.path, "labels").resolve()), "id_column": source.id_column,
                      "label_column": source.label_column}
        else:
            where, ids, values, origin = "the labels sent", source.sample_ids, source.values or [], {"inline": True}
        made = labels.make_label_set(record.digest, dataset_ids, ids, values, source.kind, where, origin)
        digest = labels.label_set_digest(made)
        name = name or (Path(source.path).stem if source.path else f"labels-{digest[:8]}")
        if not name or name != name.strip():
            raise InvalidArgument(f"label set name {name!r} is not a valid name (no padding, not empty)")
        self.catalog.label_sets.held(record.digest, name, digest)  # a name held by other labels: refused first
        ref = self.store.files.write_folder(f"labels/{digest}",
                                            lambda target: labels.save_label_set(made, name, target))
        return self.catalog.label_sets.add(labels.label_set_record(made, digest, name, ref))

    def _check_dataset_alias(self, alias: str, digest: str, n: int) -> None:
        """A name that already names another dataset is not moved: in a shared store, everyone's
        `--dataset NAME` would silently mean other samples (as a model's alias, `register_model`).
        Registering the same dataset again under its name is a no-op."""
        try:
            held = self.catalog.datasets.get(alias)
        except NotFound:
            return
        if held.digest != digest:
            raise AlreadyExists(f"the name {alias!r} already names dataset {held.digest[:12]} ({held.n} samples); "
                                f"this one is {digest[:12]} ({n} samples): register it under another --name "
                                f"(e.g. {alias}-{n}), or use the dataset {alias!r} names")
