"""Thin gRPC servicers: proto in, a service-layer call, proto out. No logic lives here."""

from __future__ import annotations

import json

from actstore._proto.actstore.v1 import actstore_pb2 as pb
from actstore._proto.actstore.v1 import actstore_pb2_grpc as rpc
from actstore.errors import InvalidArgument
from actstore.server.interceptors import current_principal
from actstore.server.jobs import JobSnapshot
from actstore.server.queries import MetricResult
from actstore.server.service import ActStoreService, CaptureRequest, DatasetSource, TrainRequest
from actstore.store.catalog import DatasetRecord, ModelRecord, RunRecord
from actstore.wire import to_ndarray

_EVENT_KIND = {"done": pb.JobEvent.DONE, "failed": pb.JobEvent.FAILED, "cancelled": pb.JobEvent.CANCELLED,
               "interrupted": pb.JobEvent.FAILED}


def enum_name(enum_type, value: int, what: str) -> str:
    """The lower-case name of a proto enum value; an unknown number is the caller's mistake."""
    if value not in enum_type.values():
        raise InvalidArgument(f"unknown {what} {value}: use one of {', '.join(enum_type.keys()[1:])}")
    return enum_type.Name(value).lower()


def model_proto(m: ModelRecord) -> pb.Model:
    return pb.Model(digest=m.digest, aliases=m.aliases, kind=m.kind, arch=m.arch, num_layers=m.num_layers,
                    hidden_size=m.hidden_size, has_head=m.has_head, lineage_json=json.dumps(m.lineage))


def dataset_proto(d: DatasetRecord) -> pb.Dataset:
    return pb.Dataset(digest=d.digest, aliases=d.aliases, kind=d.kind, n=d.n, num_labels=d.num_labels,
                      has_groups=d.has_groups, source_json=json.dumps(d.source))


def run_proto(r: RunRecord, recorded_shards: int = 0) -> pb.Run:
    return pb.Run(run_key=r.run_key, model_digest=r.model_digest, dataset_digest=r.dataset_digest,
                  pooling=r.pooling, dtype=r.dtype, max_len=r.max_len, n=r.n, rows=r.rows,
                  num_layers=r.num_layers, width=r.width, status=r.status, num_shards=r.num_shards,
                  recorded_shards=recorded_shards)


def job_proto(s: JobSnapshot) -> pb.Job:
    return pb.Job(job_id=s.job_id, kind=s.kind, status=s.status, target=s.target, done=s.done, total=s.total,
                  error=s.error, error_code=s.error_code, cache_hit=s.cache_hit, joined=s.joined, unit=s.unit)


def result_proto(r: MetricResult) -> pb.QueryResult:
    p = r.provenance
    return pb.QueryResult(
        arrays={k: to_ndarray(v) for k, v in r.arrays.items()},
        scalars=r.scalars,
        provenance=pb.Provenance(metric=p.metric, definition_version=p.definition_version,
                                 options_json=json.dumps(p.options), run_keys=p.run_keys, cached=p.cached,
                                 seconds=p.seconds, result_key=p.result_key),
        notes=r.notes,
    )


class CatalogServicer(rpc.CatalogServicer):
    def __init__(self, service: ActStoreService) -> None:
        self.service = service

    def ListModels(self, request, context):
        return pb.ListModelsResponse(models=[model_proto(m) for m in self.service.catalog.models()])

    def ListDatasets(self, request, context):
        return pb.ListDatasetsResponse(datasets=[dataset_proto(d) for d in self.service.catalog.datasets()])

    def ListRuns(self, request, context):
        catalog = self.service.catalog
        model = catalog.model(request.model).digest if request.model else None
        dataset = catalog.dataset(request.dataset).digest if request.dataset else None
        runs = catalog.runs(model, dataset, request.status or None)
        return pb.ListRunsResponse(runs=[run_proto(r) for r in runs])

    def DescribeRun(self, request, context):
        record, health, stored = self.service.describe_run(request.run)
        run = run_proto(record, health.recorded_shards)
        run.stored_bytes = stored
        run.model_aliases.extend(self.service.catalog.model(record.model_digest).aliases)
        run.dataset_aliases.extend(self.service.catalog.dataset(record.dataset_digest).aliases)
        for layer in range(record.num_layers + 1):
            run.health.append(pb.LayerHealth(layer=layer, nan_count=int(health.nan_count[layer]),
                                             inf_count=int(health.inf_count[layer]),
                                             min=float(health.min[layer]), max=float(health.max[layer])))
        return run

    def RegisterModel(self, request, context):
        source = request.WhichOneof("source")
        return model_proto(self.service.register_model(
            path=request.path if source == "path" else None,
            builtin=request.builtin if source == "builtin" else None, name=request.name or None))

    def RegisterDataset(self, request, context):
        which = request.WhichOneof("source")
        texts = request.texts if which == "texts" else None
        source = DatasetSource(
            path=request.path if which == "path" else None,
            builtin=request.builtin if which == "builtin" else None,
            texts=list(texts.texts) if texts is not None else None,
            labels=list(texts.labels) if texts is not None else None,
            sample_ids=list(texts.sample_ids) if texts is not None else None,
            label_names=list(texts.label_names) if texts is not None else None,
            limit=request.limit or None, seed=request.seed, split=request.split or None,
            text_column=request.text_column or "text", label_column=request.label_column or None,
            id_column=request.id_column or None, group_column=request.group_column or None,
            augment_views=request.augment_views, augment_method=request.augment_method or "word-dropout",
        )
        return dataset_proto(self.service.register_dataset(source, request.name or None))

    def DeleteRun(self, request, context):
        return pb.DeleteRunResponse(run_key=self.service.delete_run(request.run))


class CaptureServicer(rpc.CaptureServicer):
    def __init__(self, service: ActStoreService) -> None:
        self.service = service

    def SubmitCapture(self, request, context):
        snapshot = self.service.submit_capture(
            CaptureRequest(model=request.model, dataset=request.dataset, pooling=request.pooling,
                           dtype=request.dtype, max_len=request.max_len),
            principal=current_principal.get())
        return job_proto(snapshot)

    def WatchJob(self, request, context):
        for snapshot in self.service.jobs.follow(request.job_id):
            if not context.is_active():
                return
            kind = _EVENT_KIND.get(snapshot.status, pb.JobEvent.PROGRESS)
            yield pb.JobEvent(kind=kind, job=job_proto(snapshot), message=snapshot.message)

    def CancelJob(self, request, context):
        return job_proto(self.service.jobs.cancel(request.job_id))

    def GetJob(self, request, context):
        return job_proto(self.service.jobs.snapshot(request.job_id))

    def SubmitTrain(self, request, context):
        return job_proto(self.service.submit_train(
            TrainRequest(recipe=request.recipe, method=request.method, seed=request.seed, steps=request.steps,
                         smoke=request.smoke, alternating=request.alternating, weights=request.weights),
            principal=current_principal.get()))

    def ListJobs(self, request, context):
        return pb.ListJobsResponse(jobs=[job_proto(s) for s in self.service.jobs.list(request.status or None)])


class QueryServicer(rpc.QueryServicer):
    def __init__(self, service: ActStoreService) -> None:
        self.service = service

    def Similarity(self, request, context):
        metric = enum_name(pb.SimilarityRequest.Metric, request.metric, "similarity metric")
        result = self.service.queries.similarity(metric, request.run_a, request.run_b, list(request.layers_a),
                                                 list(request.layers_b), request.center, request.refresh,
                                                 request.batch_size, request.remainder, request.k)
        return result_proto(result)

    def Entropy(self, request, context):
        metric = enum_name(pb.EntropyRequest.Metric, request.metric, "entropy metric")
        return result_proto(self.service.queries.entropy(
            metric, request.run, list(request.layers), alpha=request.alpha, normalization=request.normalization,
            clamp=request.clamp, convention=request.convention, abs_cos=request.abs_cos,
            permutations=request.permutations, seed=request.seed, exp=request.exp,
            temperature=request.temperature, refresh=request.refresh))

    def ResidualNorm(self, request, context):
        return result_proto(self.service.queries.residual_norm(request.run, list(request.layers), request.refresh))

    def Stitch(self, request, context):
        return result_proto(self.service.stitch(request.run_a, request.layer_a, request.run_b, request.layer_b,
                                                request.test_fraction, request.seed, request.refresh))

    def SubmitCKAMatrix(self, request, context):
        return job_proto(self.service.submit_cka_matrix(list(request.runs), request.refresh,
                                                        principal=current_principal.get()))

    def Lens(self, request, context):
        return result_proto(self.service.queries.lens(request.run, request.epsilon, list(request.taus),
                                                      request.heads, request.refresh))

    def NeuralCollapse(self, request, context):
        return result_proto(self.service.queries.neural_collapse(request.run, list(request.layers), request.rcond,
                                                                 request.refresh))

    def GetResult(self, request, context):
        return result_proto(self.service.queries.result(request.result_key))

    def ReadActivations(self, request, context):
        for start, values, ids in self.service.read_activations(request.run, request.layer, request.start,
                                                                request.stop):
            yield pb.ActivationChunk(start=start, values=to_ndarray(values), sample_ids=ids)
