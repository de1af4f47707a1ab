"""The thin client: gRPC stubs, the shared error types and numpy. No Ray, no torch.

    from actstore.client import Client
    with Client("127.0.0.1:50151") as c:          # a running `actstore serve`
        run = c.capture("minilm-l6", "rotten-tomatoes").run_key
        print(c.cka(run).biased)

    with Client.embedded("./actstore-data") as c:  # an in-process server and a local Ray
        ...
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np

from actstore._proto.actstore.v1 import actstore_pb2 as pb
from actstore._proto.actstore.v1 import actstore_pb2_grpc as rpc
from actstore._proto.actstore.v1 import (
    diagnostics_pb2_grpc,
    imports_pb2_grpc,
    planning_pb2_grpc,
    readers_pb2_grpc,
    tokens_pb2,
    tokens_pb2_grpc,
)
from actstore.client.arguments import checking_arguments, options
from actstore.client.diagnostics import CKAStatsResult, COSStatsResult, DiagnosticsMixin, OutlierReport
from actstore.client.entropy import EntropyMixin
from actstore.client.frames import Listing
from actstore.client.imports import ImportsMixin
from actstore.client.measures import MeasureMatrixResult, MeasuresMixin
from actstore.client.planning import CapturePlanInfo, CKAMatrixPlanInfo, PlanningMixin, capture_request
from actstore.client.probes import LabelSetInfo, ProbeResult, ProbesMixin
from actstore.client.progress import followed
from actstore.client.progression import ProgressionMixin, ProgressionResult
from actstore.client.readers import Batch, ReadersMixin, RunLocation, SqlResult
from actstore.client.results import (
    BackupInfo,
    CaptureResult,
    CKAMatrixResult,
    CKAResult,
    COSResult,
    DatasetInfo,
    GarbageItem,
    GarbageReport,
    JobInfo,
    LayerDistribution,
    LayerValues,
    LensResult,
    MatrixResult,
    ModelInfo,
    QueryAnswer,
    RunInfo,
    RunVerdict,
    VerifyReport,
)
from actstore.client.transport import MAX_MESSAGE_BYTES, Translating, read_ca, server_starter
from actstore.errors import ERRORS_BY_CODE, ActStoreError, InvalidArgument
from actstore.options import CAPTURE, DATASETS, ENTROPY, GC, LENS, SIMILARITY, STITCH, TRAIN, trained_model_name
from actstore.wire import from_ndarray

__all__ = ["BackupInfo", "Batch", "CKAMatrixPlanInfo", "CapturePlanInfo", "Client", "CKAMatrixResult", "CKAResult",
           "CKAStatsResult", "COSResult", "COSStatsResult", "CaptureResult", "DatasetInfo",
           "GarbageItem", "GarbageReport", "JobInfo", "LabelSetInfo", "LayerDistribution", "LayerValues", "LensResult",
           "Listing", "MatrixResult", "MeasureMatrixResult", "ModelInfo", "OutlierReport", "ProbeResult",
           "ProgressionResult", "QueryAnswer",
           "RunInfo", "RunLocation", "RunVerdict", "SqlResult", "VerifyReport"]

ENTROPY_METRICS = ENTROPY.metric.choices
@checking_arguments
class Client(PlanningMixin, ReadersMixin, ImportsMixin, MeasuresMixin, DiagnosticsMixin, ProgressionMixin,
             EntropyMixin, ProbesMixin):
    def __init__(self, address: str = "127.0.0.1:50151", token: str | None = None,
                 root_certificates: bytes | None = None) -> None:
        """`root_certificates`: PEM CA certificate(s) to connect over TLS and trust the server's
        certificate (default: the file ACTSTORE_TLS_CA names, else plaintext)."""
        token = token or os.environ.get("ACTSTORE_TOKEN")
        if token and not (token.isascii() and token.isprintable()):  # gRPC refuses it as "Invalid metadata"
            raise InvalidArgument("the token is not printable ASCII, as every actstore token is: check --token / "
                                  "ACTSTORE_TOKEN (an admin makes one with `actstore token create`)")
        if root_certificates is None and os.environ.get("ACTSTORE_TLS_CA"):
            root_certificates = read_ca(os.environ["ACTSTORE_TLS_CA"])
        options = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
        if root_certificates is not None:
            self._channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates), options)
        else:
            self._channel = grpc.insecure_channel(address, options)
        metadata = [("authorization", f"Bearer {token}")] if token else []
        self.address = address
        self._closed = threading.Event()

        def stub(kind):
            return Translating(kind(self._channel), metadata, self._closed)

        self._catalog, self._capture, self._query = stub(rpc.CatalogStub), stub(rpc.CaptureStub), stub(rpc.QueryStub)
        self._tokens, self._integrity = stub(tokens_pb2_grpc.TokensStub), stub(rpc.IntegrityStub)
        self._housekeeping, self._planning = stub(rpc.HousekeepingStub), stub(planning_pb2_grpc.PlanningStub)
        self._readers, self._imports = stub(readers_pb2_grpc.ReadersStub), stub(imports_pb2_grpc.ImportsStub)
        self._diagnostics = stub(diagnostics_pb2_grpc.DiagnosticsStub)
        self._connection = (token, root_certificates)  # for the connections of torch DataLoader workers
        self._server = None

    @classmethod
    def embedded(cls, path: str | Path | None = None, **settings) -> Client:
        """Start an in-process server on a free loopback port (and a local Ray unless RAY_ADDRESS
        is set) owning the store at `path`; closing the client stops it. Needs the server extra:
        FailedPrecondition says how to install it if it is missing."""
        start_embedded = server_starter()
        if path is not None:
            settings["store"] = str(path)
        server = start_embedded(**{"port": 0, **settings})
        client = cls(f"127.0.0.1:{server.port}")
        client._server = server
        return client

    def close(self) -> None:
        self._closed.set()
        self._channel.close()
        if self._server is not None:
            self._server.stop()
            self._server = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- catalog ------------------------------------------------------------------------------
    def register_model(self, path: str | Path | None = None, *, builtin: str | None = None,
                       name: str | None = None) -> ModelInfo:
        if path and builtin:  # the request carries one of them (a oneof): say so, not drop one
            raise InvalidArgument("give exactly one of a model folder path or a builtin name")
        request = pb.RegisterModelRequest(name=name or "")
        if builtin:
            request.builtin = builtin
        elif path:
            request.path = str(path)
        return ModelInfo.from_proto(self._catalog.RegisterModel(request))

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
        return DatasetInfo.from_proto(self._catalog.RegisterDataset(request))

    def models(self) -> Listing[ModelInfo]:
        return Listing(ModelInfo.from_proto(m) for m in self._catalog.ListModels(pb.ListModelsRequest()).models)

    def datasets(self) -> Listing[DatasetInfo]:
        return Listing(DatasetInfo.from_proto(d) for d in self._catalog.ListDatasets(pb.ListDatasetsRequest()).datasets)

    def runs(self, model: str | None = None, dataset: str | None = None, status: str | None = None,
             site: str | None = None) -> Listing[RunInfo]:
        """Runs, optionally only those of a model, a dataset, a status and a capture site."""
        request = pb.ListRunsRequest(model=model or "", dataset=dataset or "", status=status or "", site=site or "")
        return Listing(RunInfo.from_proto(r) for r in self._catalog.ListRuns(request).runs)

    def describe(self, run: str) -> RunInfo:
        return RunInfo.from_proto(self._catalog.DescribeRun(pb.DescribeRunRequest(run=run)))

    def delete_run(self, run: str) -> str:
        return self._catalog.DeleteRun(pb.DeleteRunRequest(run=run)).run_key

    # ---- tokens (admin) -------------------------------------------------------------------------
    def create_token(self, name: str, role: str = "reader") -> str:
        """A new token for principal `name` with `role`; the server keeps only its hash."""
        return self._tokens.CreateToken(tokens_pb2.CreateTokenRequest(name=name, role=role)).token

    def tokens(self) -> list[tuple[str, str]]:
        """(name, role) of every token holder."""
        return [(p.name, p.role) for p in self._tokens.ListTokens(tokens_pb2.ListTokensRequest()).principals]

    def revoke_token(self, name: str) -> None:
        """Revoke `name`'s token: its next call is refused."""
        self._tokens.RevokeToken(tokens_pb2.RevokeTokenRequest(name=name))

    # ---- housekeeping (admin) ------------------------------------------------------------------
    def backup_catalog(self) -> BackupInfo:
        """Have the server back its catalog up now (into backups/ beside the catalog)."""
        r = self._housekeeping.BackupCatalog(pb.BackupCatalogRequest())
        return BackupInfo(r.path, r.bytes, list(r.kept))

    @options(GC)
    def collect_garbage(self, *, older_than: str = GC.older_than.default, max_bytes: int | None = None,
                        apply: bool = GC.apply.default) -> GarbageReport:
        """Cached results, matrix-job partials and run folders nothing needs: listed, or with
        `apply` removed. `older_than` is an age such as '12h' or '7d'."""
        request = pb.CollectGarbageRequest(older_than=older_than, max_bytes=max_bytes, apply=apply)
        return GarbageReport.from_proto(self._housekeeping.CollectGarbage(request))

    # ---- capture ------------------------------------------------------------------------------
    @options(CAPTURE)
    def submit_capture(self, model: str, dataset: str, *, pooling: str | None = CAPTURE.pooling.default,
                       dtype: str | None = CAPTURE.dtype.default,
                       max_len: int | None = CAPTURE.max_len.default,
                       site: Sequence[str] | str | None = None,
                       max_cka_error: float | None = CAPTURE.max_cka_error.default) -> JobInfo:
        """`site`: one site, a list, or a comma-separated string (see `capture`)."""
        return self._submit_capture(model, dataset, pooling, dtype, max_len, site, max_cka_error)

    def _submit_capture(self, model: str, dataset: str, pooling: str | None, dtype: str | None, max_len: int | None,
                        sites: list[str] | None, max_cka_error: float | None = None) -> JobInfo:
        """`submit_capture` and `capture` past their checks: the arguments are checked once, by the public call."""
        return JobInfo.from_proto(self._capture.SubmitCapture(capture_request(model, dataset, pooling, dtype, max_len,
                                                                              sites, max_cka_error)))

    def watch(self, job_id: str) -> Iterator[JobInfo]:
        for event in self._capture.WatchJob(pb.WatchJobRequest(job_id=job_id)):
            yield JobInfo.from_proto(event.job, event.message)

    def wait(self, job_id: str, progress: bool = False, description: str = "") -> JobInfo:
        """Follow a job to its end (with a `tqdm.auto` progress bar if asked: a widget in Jupyter,
        text in a terminal; `progress.followed`); raise its error if it failed."""
        job = followed(self.watch(job_id), description, shown=progress)
        if job is not None and job.status != "done":
            error = ERRORS_BY_CODE.get(job.error_code, ActStoreError)(job.error or f"job {job.job_id} {job.status}")
            raise error
        return job

    @options(CAPTURE)
    def capture(self, model: str, dataset: str, *, pooling: str | None = CAPTURE.pooling.default,
                dtype: str | None = CAPTURE.dtype.default, max_len: int | None = CAPTURE.max_len.default,
                site: Sequence[str] | str | None = None, progress: bool = False,
                max_cka_error: float | None = CAPTURE.max_cka_error.default) -> CaptureResult:
        """Capture every layer of `model` on `dataset` (or find the stored run) and wait for it.
        `site` (default resid_post): resid_post, attn_out, mlp_out or a module path pattern with `*`
        for the block index; several sites come from one forward pass, one run each
        (`result.runs` maps site -> run key). dtype="int8": one byte a value, with error figures and
        a bound on every CKA answer; `max_cka_error` stores exactly (float32) each layer whose bound
        would be over it (`describe(run).rounding` says which)."""
        job = self._submit_capture(model, dataset, pooling, dtype, max_len, site, max_cka_error)
        return self._run_of(job, progress, f"capture {model}")

    @options(TRAIN, leave=("recipe",))
    def train(self, recipe: str, method: str, *, seed: int = TRAIN.seed.default,
              steps: int | None = TRAIN.steps.default, smoke: bool = TRAIN.smoke.default,
              alternating: bool = TRAIN.alternating.default, weights: str = TRAIN.weights.default,
              beta: float | None = TRAIN.beta.default, progress: bool = False) -> ModelInfo:
        """Train `recipe` with `method` (standard | aligned | multi-exit | ce-reg) as a job; every
        checkpoint is registered as a model named RECIPE-METHOD-sSEED@stepK, with each option given
        that changes the training in the name (`options.trained_model_name`: RECIPE-METHOD-betaB-sSEED
        with an explicit `beta`, ...-steps400-sSEED with `steps`); the name without @step follows the
        newest. Returns the final model.
        Resubmitting resumes a stopped run."""
        job = JobInfo.from_proto(self._capture.SubmitTrain(pb.TrainRequest(
            recipe=recipe, method=method, seed=seed, steps=steps, smoke=smoke, alternating=alternating,
            weights=weights, **({} if beta is None else {"beta": beta}))))
        if not job.finished:
            self.wait(job.job_id, progress=progress, description=f"train {recipe} {method}")
        name = trained_model_name(recipe, method, seed, smoke, steps, alternating, weights, beta)
        return next(m for m in self.models() if name in m.aliases)

    def cancel(self, job_id: str) -> JobInfo:
        return JobInfo.from_proto(self._capture.CancelJob(pb.CancelJobRequest(job_id=job_id)))

    def job(self, job_id: str) -> JobInfo:
        return JobInfo.from_proto(self._capture.GetJob(pb.GetJobRequest(job_id=job_id)))

    def jobs(self, status: str | None = None) -> Listing[JobInfo]:
        jobs = self._capture.ListJobs(pb.ListJobsRequest(status=status or "")).jobs
        return Listing(JobInfo.from_proto(j) for j in jobs)

    # ---- integrity ----------------------------------------------------------------------------
    def submit_verify(self, runs: Sequence[str] = (), *, all_runs: bool = False, repair: bool = False) -> JobInfo:
        """Start a scrub of `runs` (keys or prefixes) or of every run; with `repair` (admin), the
        damaged shards are dropped afterwards so the same capture submitted again rewrites them."""
        request = pb.VerifyRequest(runs=list(runs), all=all_runs)
        submit = self._integrity.SubmitRepair if repair else self._integrity.SubmitVerify
        return JobInfo.from_proto(submit(request))

    def verify_report(self, job_id: str) -> VerifyReport:
        return VerifyReport.from_proto(self._integrity.GetVerifyReport(pb.GetVerifyReportRequest(job_id=job_id)))

    def verify(self, runs: Sequence[str] = (), *, all_runs: bool = False, repair: bool = False,
               progress: bool = False) -> VerifyReport:
        """Read every chunk of `runs` (or of every run) and check it: crc32c, shapes and dtypes
        against the run's spec, the catalog's chunk rows against the shards present. Returns the
        report; `report.recapture` names the runs to capture again. See `submit_verify`."""
        job = self.submit_verify(runs, all_runs=all_runs, repair=repair)
        self.wait(job.job_id, progress=progress, description="repair" if repair else "verify")
        return self.verify_report(job.job_id)

    # ---- queries ------------------------------------------------------------------------------
    def _similarity(self, metric, run_a, run_b, layers_a, layers_b, center="", refresh=False,
                    **extra) -> QueryAnswer:
        request = pb.SimilarityRequest(metric=metric, run_a=run_a, run_b=run_b or "",
                                       layers_a=list(layers_a or []), layers_b=list(layers_b or []),
                                       center=center, refresh=refresh, **extra)
        return QueryAnswer.from_proto(self._query.Similarity(request))

    def _matrix(self, answer: QueryAnswer) -> MatrixResult:
        options = answer.provenance.options
        return MatrixResult(answer.arrays["values"], options["layers_a"], options["layers_b"], answer.scalars,
                            answer.provenance, answer.notes)

    @options(SIMILARITY)
    def minibatch_cka(self, run_a: str, run_b: str | None = None, *, batch_size: int,
                      layers_a: Sequence[int] | None = None, layers_b: Sequence[int] | None = None,
                      remainder: str = SIMILARITY.remainder.default, refresh: bool = False,
                      require_bound: bool = SIMILARITY.require_bound.default) -> MatrixResult:
        """Minibatch CKA (Nguyen et al. 2021) over consecutive batches of `batch_size` rows. Not bounded
        over a lossy run (`require_bound`: refused then)."""
        return self._matrix(self._similarity(pb.SimilarityRequest.MINIBATCH_CKA, run_a, run_b, layers_a, layers_b,
                                             refresh=refresh, batch_size=batch_size, remainder=remainder,
                                             require_bound=require_bound))

    @options(SIMILARITY)
    def mutual_knn(self, run_a: str, run_b: str | None = None, *, k: int = SIMILARITY.k.default,
                   layers_a: Sequence[int] | None = None, layers_b: Sequence[int] | None = None,
                   refresh: bool = False, require_bound: bool = SIMILARITY.require_bound.default) -> MatrixResult:
        """Mutual k-nearest-neighbour alignment (Huh et al. 2024) between layers (not bounded over a lossy run)."""
        return self._matrix(self._similarity(pb.SimilarityRequest.MUTUAL_KNN, run_a, run_b, layers_a, layers_b,
                                             refresh=refresh, k=k, require_bound=require_bound))

    def residual_norm(self, run: str, *, layers: Sequence[int] | None = None, refresh: bool = False
                      ) -> LayerDistribution:
        """||h_l|| / ||h_(l+1) - h_l|| per sample: mean and quantiles per layer l."""
        answer = QueryAnswer.from_proto(self._query.ResidualNorm(
            pb.ResidualNormRequest(run=run, layers=list(layers or []), refresh=refresh)))
        return LayerDistribution(answer.arrays["mean"], answer.arrays["quantiles"], answer.arrays["quantile_levels"],
                                 answer.provenance.options["layers"], answer.provenance, answer.notes)

    def submit_cka_matrix(self, runs: Sequence[str], refresh: bool = False) -> JobInfo:
        return JobInfo.from_proto(self._query.SubmitCKAMatrix(pb.CKAMatrixRequest(runs=list(runs), refresh=refresh)))

    def result(self, result_key: str) -> QueryAnswer:
        return QueryAnswer.from_proto(self._query.GetResult(pb.GetResultRequest(result_key=result_key)))

    def cka_matrix(self, runs: Sequence[str], *, refresh: bool = False, progress: bool = False) -> CKAMatrixResult:
        """The full CKA matrix over every layer of every run (same samples), computed as one job
        that reads the data once; resumable if cancelled or interrupted."""
        job = self.submit_cka_matrix(runs, refresh)
        if not job.finished:
            job = self.wait(job.job_id, progress=progress, description="CKA matrix")
        answer = self.result(job.target)
        provenance = replace(answer.provenance, cached=job.cache_hit)
        return CKAMatrixResult(answer.arrays["biased"], answer.arrays["debiased"], answer.arrays["block_run"],
                               answer.arrays["block_layer"], provenance.run_keys, provenance, answer.notes,
                               answer.arrays.get("bound_biased"), answer.arrays.get("bound_debiased"))

    @options(STITCH)
    def stitch(self, run_a: str, layer_a: int, run_b: str, layer_b: int, *,
               test_fraction: float = STITCH.test_fraction.default, seed: int = STITCH.seed.default,
               tune_steps: int = STITCH.tune_steps.default, tune_lr: float = STITCH.tune_lr.default,
               refresh: bool = False) -> QueryAnswer:
        """Stitch run A's layer into run B's model at layer_b (token-level runs, same tokenisation):
        scalars penalty (B's loss through the stitch minus its own), own_loss, stitched_loss, test_r2;
        with tune_steps > 0 also tuned_penalty, tuned_stitched_loss and the training loss before and
        after tuning (train_stitched_loss, tuned_train_stitched_loss)."""
        return QueryAnswer.from_proto(self._query.Stitch(pb.StitchRequest(
            run_a=run_a, layer_a=layer_a, run_b=run_b, layer_b=layer_b, test_fraction=test_fraction, seed=seed,
            tune_steps=tune_steps, tune_lr=tune_lr, refresh=refresh)))

    @options(SIMILARITY)
    def cka(self, run_a: str, run_b: str | None = None, *, layers_a: Sequence[int] | None = None,
            layers_b: Sequence[int] | None = None, align: str = SIMILARITY.align.default,
            word_pool: str = SIMILARITY.word_pool.default, refresh: bool = False) -> CKAResult:
        """Linear CKA (biased and debiased) between layers of run A and run B (default: A itself).
        Layer lists default to all layers; one layer each gives a 1 x 1 matrix. align="words":
        token-level runs of different tokenizers, rows = the (sample, word) pairs both reach, each
        word the mean (word_pool="mean") or last of its tokens; align="spans": rows = the finest
        character spans both tokenizations share (docs/metrics.md, Cross-tokenizer alignment).
        Over a lossy (int8) run, `bound_biased` / `bound_debiased` bound each entry's distance from
        the CKA of the exact values (`provenance.error_bound` the largest; docs/one-byte-storage.md)."""
        answer = self._similarity(pb.SimilarityRequest.CKA, run_a, run_b, layers_a, layers_b, "", refresh,
                                  align=align, word_pool=word_pool)
        options = answer.provenance.options
        return CKAResult(answer.arrays["biased"], answer.arrays["debiased"], options["layers_a"],
                         options["layers_b"], int(answer.scalars["n"]), answer.provenance, answer.notes,
                         answer.arrays.get("bound_biased"), answer.arrays.get("bound_debiased"))

    @options(SIMILARITY)
    def cos(self, run_a: str, run_b: str | None = None, *, layers_a: Sequence[int] | None = None,
            layers_b: Sequence[int] | None = None, center: str = SIMILARITY.center.default,
            align: str = SIMILARITY.align.default, word_pool: str = SIMILARITY.word_pool.default,
            refresh: bool = False, require_bound: bool = SIMILARITY.require_bound.default) -> COSResult:
        """Sample-wise cosine similarity between layers (same width), mean and quantiles; align as in `cka`.
        Not bounded over a lossy run (`require_bound`: refused then)."""
        answer = self._similarity(pb.SimilarityRequest.COS, run_a, run_b, layers_a, layers_b, center, refresh,
                                  align=align, word_pool=word_pool, require_bound=require_bound)
        options = answer.provenance.options
        return COSResult(answer.arrays["mean"], answer.arrays["quantiles"], answer.arrays["quantile_levels"],
                         options["layers_a"], options["layers_b"], int(answer.scalars["n"]), answer.provenance,
                         answer.notes)

    @options(LENS)
    def lens(self, run: str, *, epsilon: float = LENS.epsilon.default, taus: Sequence[float] | None = None,
             heads: str = LENS.heads.default, refresh: bool = False) -> LensResult:
        """Logit lens with the model's stored head on every layer: per-layer accuracy, saturation
        distribution, epsilon-effective depth (absolute and relative) and the multi-exit sweep.
        heads='exits' uses a multi-exit model's own per-layer classifiers instead. taus None: the
        default sweep (options.LENS)."""
        answer = QueryAnswer.from_proto(self._query.Lens(pb.LensRequest(
            run=run, epsilon=epsilon, taus=list(taus or []), heads=heads, refresh=refresh)))
        a, s = answer.arrays, answer.scalars
        return LensResult(a["accuracy"], a["saturation_counts"], a["saturation_cumulative"],
                          int(s["effective_depth"]), int(s["effective_depth_relative"]), a["taus"], a["exits"],
                          a["exit_accuracy"], a["speedup"], int(s["n"]), answer.provenance, answer.notes)

    @options(LENS)
    def neural_collapse(self, run: str, *, layers: Sequence[int] | None = None,
                        rcond: float = LENS.rcond.default, refresh: bool = False) -> LayerValues:
        """NC1 = (1/C) tr(Sigma_W Sigma_B^+) per layer of a labelled pooled run."""
        answer = QueryAnswer.from_proto(self._query.NeuralCollapse(pb.NeuralCollapseRequest(
            run=run, layers=list(layers or []), rcond=rcond, refresh=refresh)))
        return LayerValues(answer.arrays["values"], answer.provenance.options["layers"], answer.scalars,
                           answer.provenance, answer.notes)

    def read_activations(self, run: str, layer: int, start: int = 0, stop: int | None = None
                         ) -> tuple[np.ndarray, list[str]]:
        """Rows [start, stop) of one layer, streamed in bounded messages; returns (values, sample ids).
        `stop` None reads to the end."""
        if stop is not None and stop <= start:  # the request's stop 0 means "to the end"
            raise InvalidArgument(f"rows {start}..{stop} are an empty range: give stop > start, or leave stop out "
                                  "to read to the end")
        request = pb.ReadActivationsRequest(run=run, layer=layer, start=start, stop=stop or 0)
        parts, ids = [], []
        for chunk in self._query.ReadActivations(request):
            parts.append(from_ndarray(chunk.values))
            ids.extend(chunk.sample_ids)
        return np.concatenate(parts), ids
