"""Training jobs: one Ray task trains (a whole GPU, or every CPU of one node) on whichever node Ray
picks, putting its checkpoints into the store's files area (`actstore.training.stored`), while the
job registers each checkpoint from the store as a model the moment it appears, so a killed job
keeps its checkpoints."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import ray

from actstore.errors import Cancelled, InvalidArgument, NotFound, Unavailable
from actstore.options import TRAIN, trained_model_name
from actstore.server.dispatch import WAIT_SECONDS, get_or_raise
from actstore.server.jobs import JobManager, JobSnapshot, JobState
from actstore.server.registration import Registrar
from actstore.store.catalog import ModelRecord
from actstore.store.handle import StoreHandle
from actstore.store.keys import sha256_hex
from actstore.training import RECIPES, stored
from actstore.workers import cluster
from actstore.workers.train_task import run_training


@dataclass(frozen=True)
class TrainRequest:
    """A SubmitTrain request, its options resolved through the TRAIN table at the boundary."""

    recipe: str
    method: str
    seed: int = 0
    steps: int = 0
    smoke: bool = False
    alternating: bool = False
    weights: str = ""
    beta: float | None = None  # ce-reg; None: the recipe's


class TrainingJobs:
    def __init__(self, jobs: JobManager, registrar: Registrar, store: StoreHandle) -> None:
        self.jobs = jobs
        self.registrar = registrar
        self.store = store

    def submit(self, request: TrainRequest, principal: str | None = None) -> JobSnapshot:
        if request.recipe not in RECIPES:
            raise NotFound(f"no recipe {request.recipe!r}; the recipes are {', '.join(RECIPES)}")
        if not request.method:  # required: the table has no default
            raise InvalidArgument(f"method is required: one of {', '.join(TRAIN.method.choices)}")
        spec = {"recipe": request.recipe, "method": request.method, "seed": request.seed,
                "steps": request.steps or None,  # 0 (not given): the recipe's budget
                "smoke": request.smoke, "alternating": request.alternating, "weights": request.weights}
        if request.beta is not None:  # only when given, so the keys of earlier jobs stay as they were
            spec["beta"] = request.beta
        key = sha256_hex({"training": spec})
        state, joined = self.jobs.start("train", key, spec, lambda job: self._train(job, spec, key),
                                        principal=principal)
        return replace(state.snapshot, joined=joined)

    def _train(self, job: JobState, spec: dict, key: str) -> None:
        prefix = stored.run_prefix(key)  # checkpoints: the store's files area, whichever node trains
        gpus = cluster.cluster_gpus()
        cpus = cluster.largest_node_cpus()  # one task runs on one node: never more CPUs than a node has
        resources = {"num_gpus": 1} if gpus else {"num_cpus": cpus}
        task = ray.remote(max_retries=0, **resources)(run_training).remote(
            spec["recipe"], spec["method"], spec["seed"], spec["steps"], spec["smoke"], spec["alternating"],
            spec["weights"], self.store, prefix, None if gpus else cpus, spec.get("beta"))
        registered: set[str] = set()
        name = trained_model_name(spec["recipe"], spec["method"], spec["seed"], spec["smoke"], spec["steps"],
                                  spec["alternating"], spec["weights"], spec.get("beta"))
        # Checkpoints are registered in a thread of their own: a registration takes seconds (a Ray
        # task loads the model), and the job's progress follows the training's progress.json meanwhile.
        with ThreadPoolExecutor(1, thread_name_prefix=f"register-{job.snapshot.job_id}") as registering:
            registration = None
            while True:
                ready, _ = ray.wait([task], timeout=WAIT_SECONDS)
                if job.cancel_requested.is_set():
                    ray.cancel(task, force=True)
                    raise Cancelled(f"training {name} cancelled; its checkpoints are kept: submit it again to resume")
                if registration is None or registration.done():
                    if registration is not None:
                        registration.result()  # its error is the job's
                    registration = registering.submit(self._register_new, prefix, name, registered)
                progress = stored.read_progress(self.store.files, prefix)
                if progress:
                    job.progress(progress["step"], progress["total"], "steps", f"loss {progress['loss']:.4f}")
                if ready:
                    break
            registration.result()
        get_or_raise(task, lambda cause: Unavailable(f"training {name} failed: {cause}; the checkpoints so far "
                                                     "are kept: submit it again to resume"), bugs_internal=True)
        self._register_new(prefix, name, registered)

    def _register_new(self, prefix: str, name: str, registered: set[str]) -> None:
        for checkpoint in stored.stored_checkpoints(self.store, prefix):
            if checkpoint not in registered:
                self._register_checkpoint(checkpoint, name)
                registered.add(checkpoint)

    def _register_checkpoint(self, checkpoint: str, name: str) -> ModelRecord:
        lineage = json.loads(self.store.files.read(checkpoint, stored.LINEAGE_FILE))
        record = self.registrar.register_stored_model(checkpoint, f"{name}@step{lineage['step']}", lineage)
        self.registrar.catalog.models.set_alias(name, record.digest)  # the name alone follows the newest
        return record
