"""The client's metric queries (`Client.queries`): similarity between layers (CKA, cosine, minibatch
CKA, mutual kNN), the one-run metrics (residual norm, logit lens, neural collapse, the entropy
family), stitching, any registered measure by its identifier (the generic `Measure` RPC), the
matrix jobs over every layer of several runs, and their dry run (the Query service; the matrix
job's dry run of the Planning service).

    c.queries.cka(run_a, run_b).biased                                  # or c.cka(run_a, run_b)
    c.queries.measure("procrustes-distance=angular", run_a, run_b)
    c.queries.cka_matrix([run_1, run_2], progress=True)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from actstore import measures
from actstore._proto.actstore.v1 import actstore_pb2 as pb
from actstore.client.arguments import checking_arguments, options
from actstore.client.captures import Captures
from actstore.client.measures import MeasureMatrixResult, measure_options
from actstore.client.planning import cka_matrix_plan
from actstore.client.results import (
    CKAMatrixResult,
    CKAResult,
    COSResult,
    JobInfo,
    LayerDistribution,
    LayerValues,
    LensResult,
    MatrixResult,
    QueryAnswer,
)
from actstore.client.transport import Connection
from actstore.options import ENTROPY, LENS, SIMILARITY, STITCH
from actstore.records import CKAMatrixPlanInfo


@checking_arguments
@dataclass(eq=False)
class Queries:
    """Metric queries over stored runs, answered (and cached) by the server; the matrix jobs wait
    on `captures`, which follows every job."""

    connection: Connection
    captures: Captures

    def _similarity(self, metric, run_a, run_b, layers_a, layers_b, center="", refresh=False,
                    **extra) -> QueryAnswer:
        request = pb.SimilarityRequest(metric=metric, run_a=run_a, run_b=run_b or "",
                                       layers_a=list(layers_a or []), layers_b=list(layers_b or []),
                                       center=center, refresh=refresh, **extra)
        return QueryAnswer.from_proto(self.connection.query.Similarity(request))

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
        answer = QueryAnswer.from_proto(self.connection.query.ResidualNorm(
            pb.ResidualNormRequest(run=run, layers=list(layers or []), refresh=refresh)))
        return LayerDistribution(answer.arrays["mean"], answer.arrays["quantiles"], answer.arrays["quantile_levels"],
                                 answer.provenance.options["layers"], answer.provenance, answer.notes)

    def submit_cka_matrix(self, runs: Sequence[str], refresh: bool = False) -> JobInfo:
        request = pb.CKAMatrixRequest(runs=list(runs), refresh=refresh)
        return JobInfo.from_proto(self.connection.query.SubmitCKAMatrix(request))

    def result(self, result_key: str) -> QueryAnswer:
        return QueryAnswer.from_proto(self.connection.query.GetResult(pb.GetResultRequest(result_key=result_key)))

    def cka_matrix(self, runs: Sequence[str], *, refresh: bool = False, progress: bool = False) -> CKAMatrixResult:
        """The full CKA matrix over every layer of every run (same samples), computed as one job
        that reads the data once; resumable if cancelled or interrupted."""
        job = self.submit_cka_matrix(runs, refresh)
        if not job.finished:
            job = self.captures.wait(job.job_id, progress=progress, description="CKA matrix")
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
        return QueryAnswer.from_proto(self.connection.query.Stitch(pb.StitchRequest(
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
        the CKA of the exact values, each with probability >= 99.9% over the capture's stochastic
        rounding (`provenance.error_bound` the largest; the notes say it; docs/one-byte-storage.md)."""
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
        answer = QueryAnswer.from_proto(self.connection.query.Lens(pb.LensRequest(
            run=run, epsilon=epsilon, taus=list(taus or []), heads=heads, refresh=refresh)))
        a, s = answer.arrays, answer.scalars
        return LensResult(a["accuracy"], a["saturation_counts"], a["saturation_cumulative"],
                          int(s["effective_depth"]), int(s["effective_depth_relative"]), a["taus"], a["exits"],
                          a["exit_accuracy"], a["speedup"], int(s["n"]), answer.provenance, answer.notes)

    @options(LENS)
    def neural_collapse(self, run: str, *, layers: Sequence[int] | None = None,
                        rcond: float = LENS.rcond.default, refresh: bool = False) -> LayerValues:
        """NC1 = (1/C) tr(Sigma_W Sigma_B^+) per layer of a labelled pooled run."""
        answer = QueryAnswer.from_proto(self.connection.query.NeuralCollapse(pb.NeuralCollapseRequest(
            run=run, layers=list(layers or []), rcond=rcond, refresh=refresh)))
        return LayerValues(answer.arrays["values"], answer.provenance.options["layers"], answer.scalars,
                           answer.provenance, answer.notes)

    @options(ENTROPY)
    def entropy(self, metric: str, run: str, *, layers: Sequence[int] | None = None,
                alpha: float = ENTROPY.alpha.default, normalization: str = ENTROPY.normalization.default,
                clamp: bool = ENTROPY.clamp.default, convention: str = ENTROPY.convention.default,
                abs_cos: bool = ENTROPY.abs_cos.default, permutations: int = ENTROPY.permutations.default,
                seed: int = ENTROPY.seed.default, exp: bool = ENTROPY.exp.default,
                temperature: float = ENTROPY.temperature.default, preset: str = ENTROPY.preset.default,
                align: str = ENTROPY.align.default, word_pool: str = ENTROPY.word_pool.default,
                refresh: bool = False) -> LayerValues:
        """One value per layer of a matrix-entropy family metric (Skean et al. 2025): one of
        dataset_entropy, effective_rank (pooled runs), prompt_entropy, curvature (token-level runs),
        infonce, dime, lidar (pooled runs of an augmented dataset). preset="skean2025" reproduces the
        Layer by Layer reference code from a token-level run (docs/metrics.md, Reference presets).
        align="words" pools a token-level run's tokens to the words of each text first (word_pool:
        mean or last token of each word): dataset_entropy and effective_rank over all word vectors,
        prompt_entropy and curvature over each text's words, so models with different tokenizers
        give curves over the same units (docs/metrics.md, Cross-tokenizer alignment)."""
        request = pb.EntropyRequest(
            metric=pb.EntropyRequest.Metric.Value(metric.upper()), run=run, layers=list(layers or []), alpha=alpha,
            normalization=normalization, clamp=clamp, convention=convention, abs_cos=abs_cos,
            permutations=permutations, seed=seed, exp=exp, temperature=temperature, preset=preset, align=align,
            word_pool=word_pool, refresh=refresh)
        answer = QueryAnswer.from_proto(self.connection.query.Entropy(request))
        return LayerValues(answer.arrays["values"], answer.provenance.options["layers"], answer.scalars,
                           answer.provenance, answer.notes)

    def metric(self, metric: str, run_a: str, run_b: str | None = None, *,
               layers_a: Sequence[int] | None = None, layers_b: Sequence[int] | None = None,
               refresh: bool = False, **options: Any) -> QueryAnswer:
        """Any registered metric (`actstore measures` lists them: measures, cka, cos, the entropy
        family, residual_norm, nc1, lens, stitch) over run A's layers, or between run A's (rows)
        and run B's (columns; default A) for a metric of two runs; `options` are the metric's own.
        The answer is the metric's arrays and scalars as its own method returns them, with
        provenance and notes (`c.cka(...)` and `c.metric("cka", ...)` share one cached result)."""
        spec = measures.get(metric)
        request = pb.MeasureRequest(measure=metric, run_a=run_a, run_b=run_b or "", layers_a=list(layers_a or []),
                                    layers_b=list(layers_b or []), refresh=refresh,
                                    options_json=json.dumps(spec.check(options)))
        return QueryAnswer.from_proto(self.connection.query.Measure(request))

    def measure(self, measure: str, run_a: str, run_b: str | None = None, *,
                layers_a: Sequence[int] | None = None, layers_b: Sequence[int] | None = None,
                refresh: bool = False, require_bound: bool = SIMILARITY.require_bound.default,
                **options: Any) -> MatrixResult:
        """`measure` (a registered identifier, e.g. procrustes-distance=angular, cca-squared_score,
        nbs-score, linear_regression-r2) between layers of run A (rows) and run B (columns; default
        A). `options`: the measure's own (`actstore measures` lists them), e.g. alpha (the shape
        metric's whitening), sigma_fraction (RBF CKA's bandwidth), k (the kNN measures' neighbours).
        Not bounded over a lossy run: its answer says so (`require_bound`: refused instead)."""
        request = pb.MeasureRequest(measure=measure, run_a=run_a, run_b=run_b or "", layers_a=list(layers_a or []),
                                    layers_b=list(layers_b or []), refresh=refresh, require_bound=require_bound,
                                    options_json=json.dumps(measure_options(measure, options)))
        return self._matrix(QueryAnswer.from_proto(self.connection.query.Measure(request)))

    def submit_measure_matrix(self, runs: Sequence[str], measure: str, *, refresh: bool = False,
                              **options: Any) -> JobInfo:
        request = pb.CKAMatrixRequest(runs=list(runs), refresh=refresh, measure=measure,
                                      options_json=json.dumps(measure_options(measure, options)))
        return JobInfo.from_proto(self.connection.query.SubmitCKAMatrix(request))

    def measure_matrix(self, runs: Sequence[str], measure: str, *, refresh: bool = False, progress: bool = False,
                       **options: Any) -> MeasureMatrixResult:
        """A streamed measure over every layer of every run (same samples) as one job that reads
        the data once, like `cka_matrix`; resumable if cancelled or interrupted."""
        job = self.submit_measure_matrix(runs, measure, refresh=refresh, **options)
        if not job.finished:
            job = self.captures.wait(job.job_id, progress=progress, description=measure)
        answer = self.result(job.target)
        provenance = replace(answer.provenance, cached=job.cache_hit)
        return MeasureMatrixResult(answer.arrays["values"], answer.arrays["block_run"], answer.arrays["block_layer"],
                                   provenance.run_keys, provenance, answer.notes)

    def plan_cka_matrix(self, runs: Sequence[str]) -> CKAMatrixPlanInfo:
        """What `cka_matrix(runs)` would take: tiles, memory, FLOPs."""
        return cka_matrix_plan(self.connection.planning.PlanCKAMatrix(pb.CKAMatrixRequest(runs=list(runs))))
