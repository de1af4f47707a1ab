"""Client methods for the similarity measures beyond CKA, named by similarity-repository identifiers
(`actstore.options.MEASURES`; definitions in docs/metrics.md).

    c.measure("procrustes-distance=angular", run_a, run_b)           # MatrixResult, layers_a x layers_b
    c.measure("shape_metric-alpha={alpha}-distance=angular", run, alpha=0.5)
    c.measure_matrix([run_1, run_2], "cca-squared_score")           # every layer of every run, one job

The result's `provenance.metric` is the identifier with its parameters filled in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from actstore._proto.actstore.v1 import actstore_pb2 as pb
from actstore.client.arguments import options
from actstore.client.results import JobInfo, MatrixResult, Provenance, QueryAnswer
from actstore.options import SIMILARITY


@dataclass(frozen=True)
class MeasureMatrixResult:
    """A measure over every layer of several runs: block i is layer block_layer[i] of run
    runs[block_run[i]]; `values[i, j]` compares block i (as A) with block j (as B)."""

    values: np.ndarray
    block_run: np.ndarray
    block_layer: np.ndarray
    runs: list[str]
    provenance: Provenance
    notes: list[str]

    @property
    def identifier(self) -> str:
        return self.provenance.metric

    def block(self, run_a: int, run_b: int) -> np.ndarray:
        """The (L_a+1) x (L_b+1) sub-matrix between two of the runs (by position)."""
        return self.values[np.ix_(self.block_run == run_a, self.block_run == run_b)]


class MeasuresMixin:
    """`Client`'s measure queries (needs its `_query` stub, `_matrix`, `wait` and `result`)."""

    @options(SIMILARITY)
    def measure(self, measure: str, run_a: str, run_b: str | None = None, *,
                layers_a: Sequence[int] | None = None, layers_b: Sequence[int] | None = None,
                alpha: float = SIMILARITY.alpha.default, sigma_fraction: float = SIMILARITY.sigma_fraction.default,
                k: int = SIMILARITY.k.default, refresh: bool = False) -> MatrixResult:
        """`measure` (a similarity-repository identifier, e.g. procrustes-distance=angular,
        cca-squared_score, svcca-var=0.99-score, pwcca-score) between layers of run A (rows) and
        run B (columns; default A). alpha: the shape metric's whitening; sigma_fraction: RBF CKA's
        bandwidth; k: the kNN measures' neighbours."""
        request = pb.SimilarityRequest(
            metric=pb.SimilarityRequest.MEASURE, run_a=run_a, run_b=run_b or "", layers_a=list(layers_a or []),
            layers_b=list(layers_b or []), refresh=refresh, measure=measure, alpha=alpha,
            sigma_fraction=sigma_fraction, k=k)
        return self._matrix(QueryAnswer.from_proto(self._query.Similarity(request)))

    @options(SIMILARITY)
    def submit_measure_matrix(self, runs: Sequence[str], measure: str, *, alpha: float = SIMILARITY.alpha.default,
                              refresh: bool = False) -> JobInfo:
        request = pb.CKAMatrixRequest(runs=list(runs), refresh=refresh, measure=measure, alpha=alpha)
        return JobInfo.from_proto(self._query.SubmitCKAMatrix(request))

    @options(SIMILARITY)
    def measure_matrix(self, runs: Sequence[str], measure: str, *, alpha: float = SIMILARITY.alpha.default,
                       refresh: bool = False, progress: bool = False) -> MeasureMatrixResult:
        """A streamed measure over every layer of every run (same samples) as one job that reads
        the data once, like `cka_matrix`; resumable if cancelled or interrupted."""
        job = self.submit_measure_matrix(runs, measure, alpha=alpha, refresh=refresh)
        if not job.finished:
            job = self.wait(job.job_id, progress=progress, description=measure)
        answer = self.result(job.target)
        provenance = replace(answer.provenance, cached=job.cache_hit)
        return MeasureMatrixResult(answer.arrays["values"], answer.arrays["block_run"], answer.arrays["block_layer"],
                                   provenance.run_keys, provenance, answer.notes)
