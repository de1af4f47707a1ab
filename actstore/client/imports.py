"""The client's import methods (a mixin of `Client`): activations made elsewhere become a run."""

from __future__ import annotations

from pathlib import Path

from actstore._proto.actstore.v1 import imports_pb2
from actstore.client.arguments import options
from actstore.client.results import CaptureResult, JobInfo
from actstore.options import IMPORTS


class ImportsMixin:
    """Needs `self._imports` (the Imports stub) and `self.wait` from `Client`; `_run_of` serves
    `Client.capture` too."""

    @options(IMPORTS)
    def submit_import(self, path: str | Path, *, model: str, dataset: str,
                      format: str | None = IMPORTS.format.default, pooling: str | None = IMPORTS.pooling.default,
                      dtype: str | None = IMPORTS.dtype.default) -> JobInfo:
        """Start importing the activations at `path` (on the server's disk) as a run of `model` on
        `dataset`; see `import_activations`."""
        request = imports_pb2.ImportRequest(path=str(path), model=model, dataset=dataset, format=format or "",
                                            pooling=pooling or "", dtype=dtype or "")
        return JobInfo.from_proto(self._imports.SubmitImport(request))

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

    def _run_of(self, job: JobInfo, progress: bool, description: str) -> CaptureResult:
        """The run a capture or import job makes, once the job is finished (a cache hit already is)."""
        if not job.finished:
            joined = job.joined
            job = self.wait(job.job_id, progress=progress, description=description)
            job = JobInfo(**{**job.__dict__, "joined": joined})
        return CaptureResult(run_key=job.run_keys[0] if job.run_keys else job.target, job=job)
