"""Datasets: the model-ready inputs a capture runs over, their identity, and where they come from.

A dataset is a ``DatasetData``: texts *or* images, optional integer labels, stable unique sample
ids, and optional augmentation groups. ``dataset_digest`` is its identity (DESIGN, Identity).
``save_dataset`` / ``load_dataset`` materialise one into a directory of the store.

Sources, all offline (DESIGN, "Models and data available offline"):

- builtins, ``load_builtin(name, ...)``; ``BUILTIN_DATASETS`` lists them;
- a user file, ``load_file(path, ...)``: ``.csv``, ``.jsonl``, ``.json``, ``.npz``, ``.parquet``,
  ``.arrow`` or a Hugging Face ``save_to_disk`` folder (``tables``);
- a Python list, ``from_texts(texts, ...)``;
- text augmentations of another dataset for the invariance metrics, ``augment_texts(...)``.

Errors are ``actstore.errors`` classes: ``InvalidArgument`` for a bad request or a bad user file,
``NotFound`` for a missing file or an unknown/uninstalled builtin, ``AlreadyExists`` when a store
directory holds a *different* dataset, ``DataLoss`` when stored or system files are corrupt.

Modules: ``core`` (the object, validation, digest), ``storage`` (the on-disk format),
``builtins`` (the builtin sources), ``austen`` (the Jane Austen builtin, from an R package),
``columns`` (label/group/id columns, ``from_texts``), ``parsers`` (user files), ``tables`` (Parquet,
Arrow, Hugging Face folders), ``augment``.
This package re-exports the public API, so callers import from ``actstore.store.datasets``.
"""

from actstore.store.datasets.augment import AUGMENT_METHODS, augment_texts
from actstore.store.datasets.austen import austen_package_dir
from actstore.store.datasets.builtins import BUILTIN_DATASETS, load_builtin
from actstore.store.datasets.columns import from_texts
from actstore.store.datasets.core import DatasetData, dataset_digest
from actstore.store.datasets.parsers import load_file
from actstore.store.datasets.storage import load_dataset, save_dataset
from actstore.store.datasets.tables import is_dataset_folder

__all__ = [
    "AUGMENT_METHODS",
    "BUILTIN_DATASETS",
    "DatasetData",
    "augment_texts",
    "austen_package_dir",
    "dataset_digest",
    "from_texts",
    "is_dataset_folder",
    "load_builtin",
    "load_dataset",
    "load_file",
    "save_dataset",
]
