"""The client's jobs that make runs (`Client.captures`): captures (and their dry runs) and imports,
and following any job to its end (the Capture and Imports services, the capture's dry run of the
Planning service).

    run = c.captures.capture("minilm-l6", "rotten-tomatoes").run_key   # or c.capture(...)
    job = c.captures.submit_capture("gpt2", "toy", site="attn_out,mlp_out")
    c.captures.wait(job.job_id, progress=True)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from actstore._proto.actstore.v1 import actstore_pb2 as pb
from actstore._proto.actstore.v1 import imports_pb2
from actstore.client.arguments import checking_arguments, options
from actstore.client.frames import Listing
from actstore.client.planning import capture_plan, capture_request
from actstore.client.progress import followed
from actstore.client.results import CaptureResult, JobInfo
from actstore.client.transport import Connection
from actstore.errors import ERRORS_BY_CODE, ActStoreError
from actstore.options import CAPTURE, IMPORTS
from actstore.records import CapturePlanInfo


@checking_arguments
@dataclass(eq=False)
class Captures:
    """Captures and imports of activations as runs, a capture's dry run, and the jobs: followed,
    waited for, listed and cancelled (every kind of job, training and matrix jobs too)."""

    connection: Connection

    @options(CAPTURE)
    def submit_capture(self, model: str, dataset: str, *, pooling: str | None = CAPTURE.pooling.default,
                       dtype: str | None = CAPTURE.dtype.default,
                       max_len: int | None = CAPTURE.max_len.default,
                       site: Sequence[str] | str | None = None,
                       max_cka_error: float | None = CAPTURE.max_cka_error.default) -> JobInfo:
        """`site`: one site, a list, or a comma-separated string (see `capture`)."""
        return self._submit(model, dataset, pooling, dtype, max_len, site, max_cka_error)

    def _submit(self, model: str, dataset: str, pooling: str | None, dtype: str | None, max_len: int | None,
                sites: list[str] | None, max_cka_error: float | None = None) -> JobInfo:
        """`submit_capture` and `capture` past their checks: the arguments are checked once, by the public call."""
        request = capture_request(model, dataset, pooling, dtype, max_len, sites, max_cka_error)
        return JobInfo.from_proto(self.connection.capture.SubmitCapture(request))

    def watch(self, job_id: str) -> Iterator[JobInfo]:
        for event in self.connection.capture.WatchJob(pb.WatchJobRequest(job_id=job_id)):
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
        job = self._submit(model, dataset, pooling, dtype, max_len, site, max_cka_error)
        return self._run_of(job, progress, f"capture {model}")

    def cancel(self, job_id: str) -> JobInfo:
        return JobInfo.from_proto(self.connection.capture.CancelJob(pb.CancelJobRequest(job_id=job_id)))

    def job(self, job_id: str) -> JobInfo:
        return JobInfo.from_proto(self.connection.capture.GetJob(pb.GetJobRequest(job_id=job_id)))

    def jobs(self, status: str | None = None) -> Listing[JobInfo]:
        jobs = self.connection.capture.ListJobs(pb.ListJobsRequest(status=status or "")).jobs
        return Listing(JobInfo.from_proto(j) for j in jobs)

    @options(IMPORTS)
    def submit_import(self, path: str | Path, *, model: str, dataset: str,
                      format: str | None = IMPORTS.format.default, pooling: str | None = IMPORTS.pooling.default,
                      dtype: str | None = IMPORTS.dtype.default) -> JobInfo:
        """Start importing the activations at `path` (on the server's disk) as a run of `model` on
        `dataset`; see `import_activations`."""
        request = imports_pb2.ImportRequest(path=str(path), model=model, dataset=dataset, format=format or "",
                                            pooling=pooling or "", dtype=dtype or "")
        return JobInfo.from_proto(self.connection.imports.SubmitImport(request))

    @options(IMPORTS)
    def import_activations(self, path: str | Path, *, model: str, dataset: str,
                           format: str | None = IMPORTS.format.default, pooling: str | None = IMPORTS.pooling.default,
                           dtype: str | None = IMPORTS.dtype.default, progress: bool = False) -> CaptureResult:
        """Import activations made elsewhere (a folder of layer_<k>.npy / .safetensors arrays, vLLM
        extract_hidden_states files, or a SAELens cached-activations dataset; docs/import.md) as a run
        of the registered `model` on the registered `dataset`, and wait for it. The same files
        imported again return the stored run at once."""
        job = self.submit_import(path, model=model, dataset=dataset, format=format, pooling=pooling, dtype=dtype)
        return self._run_of(job, progress, f"import {Path(path).name}")

    @options(CAPTURE)
    def plan_capture(self, model: str, dataset: str, *, pooling: str | None = CAPTURE.pooling.default,
                     dtype: str | None = CAPTURE.dtype.default, max_len: int | None = CAPTURE.max_len.default,
                     site: Sequence[str] | str | None = None,
                     max_cka_error: float | None = CAPTURE.max_cka_error.default) -> CapturePlanInfo:
        """What `capture` with these arguments would store and take, checked like a submit (the
        layers a `max_cka_error` keeps exact are known only once captured: counted as int8)."""
        request = capture_request(model, dataset, pooling, dtype, max_len, site, max_cka_error)
        return capture_plan(self.connection.planning.PlanCapture(request))

    def _run_of(self, job: JobInfo, progress: bool, description: str) -> CaptureResult:
        """The run a capture or import job makes, once the job is finished (a cache hit already is)."""
        if not job.finished:
            joined = job.joined
            job = self.wait(job.job_id, progress=progress, description=description)
            job = JobInfo(**{**job.__dict__, "joined": joined})
        return CaptureResult(run_key=job.run_keys[0] if job.run_keys else job.target, job=job)
