"""The client's catalog (`Client.catalog`): models, datasets and label sets registered, and the runs
listed, described and deleted (the Catalog service).

    c.catalog.register_dataset(builtin="rotten-tomatoes", limit=200)   # or c.register_dataset(...)
    c.catalog.register_labels("rotten-tomatoes", "lengths.csv", id_column="id", label_column="words",
                              name="length")
    c.catalog.runs(model="minilm-l6")                                  # Listing[RunInfo]
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from actstore._proto.actstore.v1 import actstore_pb2 as pb
from actstore.client.arguments import checking_arguments, options
from actstore.client.display import Tabled
from actstore.client.frames import Listing
from actstore.client.results import DatasetInfo, ModelInfo, RunInfo
from actstore.client.transport import Connection
from actstore.errors import InvalidArgument
from actstore.options import DATASETS, LABELS


@dataclass(frozen=True)
class LabelSetInfo(Tabled):
    """A registered label set of a dataset's samples (`Catalog.register_labels`)."""

    digest: str
    dataset_digest: str
    name: str
    kind: str  # categorical | continuous
    classes: list[str]
    labelled: int
    samples: int
    source: dict

    @staticmethod
    def from_proto(r: pb.LabelSet) -> LabelSetInfo:
        return LabelSetInfo(r.digest, r.dataset_digest, r.name, r.kind, list(r.classes), r.labelled, r.samples,
                            json.loads(r.source_json or "{}"))


def _inline_labels(sample_ids: Sequence[str], labels: Sequence) -> pb.InlineLabels:
    """Numbers travel as doubles (NaN: no label), anything else as strings ("": no label)."""
    if len(sample_ids) != len(labels):
        raise InvalidArgument(f"{len(sample_ids)} sample ids for {len(labels)} labels: give one label per id")
    numeric = all(v is None or (isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool))
                  for v in labels)
    if numeric:
        return pb.InlineLabels(sample_ids=list(sample_ids),
                               numbers=[math.nan if v is None else float(v) for v in labels])
    return pb.InlineLabels(sample_ids=list(sample_ids), values=["" if v is None else str(v) for v in labels])


@checking_arguments
@dataclass(eq=False)
class Catalog:
    """What the server has registered and stored: models, datasets, label sets and runs."""

    connection: Connection

    def register_model(self, path: str | Path | None = None, *, builtin: str | None = None,
                       name: str | None = None) -> ModelInfo:
        if path and builtin:  # the request carries one of them (a oneof): say so, not drop one
            raise InvalidArgument("give exactly one of a model folder path or a builtin name")
        request = pb.RegisterModelRequest(name=name or "")
        if builtin:
            request.builtin = builtin
        elif path:
            request.path = str(path)
        return ModelInfo.from_proto(self.connection.catalog.RegisterModel(request))

    @options(DATASETS)
    def register_dataset(self, path: str | Path | None = None, *, builtin: str | None = None,
                         texts: Sequence[str] | None = None, labels: Sequence[int] | None = None,
                         sample_ids: Sequence[str] | None = None, label_names: Sequence[str] | None = None,
                         name: str | None = None, limit: int | None = DATASETS.limit.default,
                         seed: int = DATASETS.seed.default, split: str | None = None,
                         text_column: str | None = DATASETS.text_column.default,
                         label_column: str | None = None, id_column: str | None = None,
                         group_column: str | None = None, augment_views: int = DATASETS.augment_views.default,
                         augment_method: str | None = DATASETS.augment_method.default) -> DatasetInfo:
        request = pb.RegisterDatasetRequest(
            name=name or "", limit=limit, seed=seed, split=split or "", text_column=text_column or "",
            label_column=label_column or "", id_column=id_column or "", group_column=group_column or "",
            augment_views=augment_views, augment_method=augment_method or "")
        if sum(source is not None and source != "" for source in (path, builtin, texts)) > 1:  # a oneof
            raise InvalidArgument("give exactly one dataset source: a file path, a builtin name or a list of texts")
        if builtin:
            request.builtin = builtin
        elif path:
            request.path = str(path)
        elif texts is not None:
            request.texts.SetInParent()  # an empty list is still a (rejected) source
            request.texts.MergeFrom(pb.TextList(texts=list(texts), labels=list(labels or []),
                                               sample_ids=list(sample_ids or []),
                                               label_names=list(label_names or [])))
        return DatasetInfo.from_proto(self.connection.catalog.RegisterDataset(request))

    def models(self) -> Listing[ModelInfo]:
        models = self.connection.catalog.ListModels(pb.ListModelsRequest()).models
        return Listing(ModelInfo.from_proto(m) for m in models)

    def datasets(self) -> Listing[DatasetInfo]:
        datasets = self.connection.catalog.ListDatasets(pb.ListDatasetsRequest()).datasets
        return Listing(DatasetInfo.from_proto(d) for d in datasets)

    def runs(self, model: str | None = None, dataset: str | None = None, status: str | None = None,
             site: str | None = None) -> Listing[RunInfo]:
        """Runs, optionally only those of a model, a dataset, a status and a capture site."""
        request = pb.ListRunsRequest(model=model or "", dataset=dataset or "", status=status or "", site=site or "")
        return Listing(RunInfo.from_proto(r) for r in self.connection.catalog.ListRuns(request).runs)

    def describe(self, run: str) -> RunInfo:
        return RunInfo.from_proto(self.connection.catalog.DescribeRun(pb.DescribeRunRequest(run=run)))

    def delete_run(self, run: str) -> str:
        return self.connection.catalog.DeleteRun(pb.DeleteRunRequest(run=run)).run_key

    @options(LABELS)
    def register_labels(self, dataset: str, path: str | Path | None = None, *,
                        sample_ids: Sequence[str] | None = None, labels: Sequence | None = None,
                        name: str | None = None, id_column: str = LABELS.id_column.default,
                        label_column: str = LABELS.label_column.default,
                        kind: str = LABELS.kind.default) -> LabelSetInfo:
        """Register labels of `dataset`'s samples by sample id: from a .csv/.jsonl/.json/.parquet
        file on the server (`path`, its `id_column` and `label_column`), or `sample_ids` with their
        `labels` (None, "" or NaN: no label). `kind`: categorical, continuous or auto. The set is
        content-addressed; it changes no dataset digest and no run key; a name is never moved to
        other labels. Ids that match no sample are refused."""
        if (path is None) == (sample_ids is None):
            raise InvalidArgument("give exactly one label source: a file path, or sample_ids with their labels")
        request = pb.RegisterLabelsRequest(dataset=dataset, name=name or "", id_column=id_column,
                                           label_column=label_column, kind=kind)
        if path is not None:
            request.path = str(path)
        else:
            request.inline.CopyFrom(_inline_labels(list(sample_ids), list(labels or [])))
        return LabelSetInfo.from_proto(self.connection.catalog.RegisterLabels(request))

    def label_sets(self, dataset: str | None = None) -> Listing[LabelSetInfo]:
        """The label sets of a dataset (None: of every dataset)."""
        found = self.connection.catalog.ListLabelSets(pb.ListLabelSetsRequest(dataset=dataset or "")).label_sets
        return Listing(LabelSetInfo.from_proto(r) for r in found)
