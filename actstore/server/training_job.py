"""Training jobs: one Ray task trains (a whole GPU, or every CPU), while the job registers each
checkpoint as a model the moment it appears, so a killed job keeps its checkpoints."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import ray

from actstore.errors import Cancelled, InvalidArgument, NotFound, Unavailable
from actstore.options import TRAIN, from_wire, resolve, trained_model_name
from actstore.server.dispatch import WAIT_SECONDS, get_or_raise
from actstore.server.jobs import JobManager, JobSnapshot, JobState
from actstore.server.registration import Registrar
from actstore.store.catalog import ModelRecord
from actstore.store.handle import StoreHandle
from actstore.store.keys import sha256_hex
from actstore.training import RECIPES, list_checkpoints
from actstore.workers import cluster
from actstore.workers.train_task import read_progress, run_training


@dataclass(frozen=True)
class TrainRequest:
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
        try:
            steps = from_wire(TRAIN, "steps", request.steps)  # 0 (not given): the recipe's budget
        except InvalidArgument as e:
            raise InvalidArgument(f"{e} (steps 0: the recipe's budget)") from None
        spec = {"recipe": request.recipe, "method": resolve(TRAIN, "method", request.method),
                "seed": resolve(TRAIN, "seed", request.seed), "steps": steps, "smoke": request.smoke,
                "alternating": request.alternating, "weights": from_wire(TRAIN, "weights", request.weights)}
        if request.beta is not None:  # only when given, so the keys of earlier jobs stay as they were
            spec["beta"] = resolve(TRAIN, "beta", request.beta)
        key = sha256_hex({"training": spec})
        state, joined = self.jobs.start("train", key, spec, lambda job: self._train(job, spec, key),
                                        principal=principal)
        return replace(state.snapshot, joined=joined)

    def _train(self, job: JobState, spec: dict, key: str) -> None:
        out_dir = self.store.path / "training" / key[:16]
        out_dir.mkdir(parents=True, exist_ok=True)
        gpus = cluster.cluster_gpus()
        resources = {"num_gpus": 1} if gpus else {"num_cpus": cluster.cluster_cpus()}
        task = ray.remote(max_retries=0, **resources)(run_training).remote(
            spec["recipe"], spec["method"], spec["seed"], spec["steps"], spec["smoke"], spec["alternating"],
            spec["weights"], str(out_dir), None if gpus else cluster.cluster_cpus(), spec.get("beta"))
        registered: set[str] = set()
        name = trained_model_name(spec["recipe"], spec["method"], spec["seed"], spec["smoke"], spec["steps"],
                                  spec["alternating"], spec["weights"], spec.get("beta"))
        while True:
            ready, _ = ray.wait([task], timeout=WAIT_SECONDS)
            if job.cancel_requested.is_set():
                ray.cancel(task, force=True)
                raise Cancelled(f"training {name} cancelled; its checkpoints are kept: submit it again to resume")
            self._register_new(out_dir, name, registered)
            progress = read_progress(out_dir)
            if progress:
                job.progress(progress["step"], progress["total"], "steps", f"loss {progress['loss']:.4f}")
            if ready:
                break
        get_or_raise(task, lambda cause: Unavailable(f"training {name} failed: {cause}; the checkpoints so far "
                                                     "are kept"), bugs_internal=True)
        self._register_new(out_dir, name, registered)

    def _register_new(self, out_dir: Path, name: str, registered: set[str]) -> None:
        for checkpoint in list_checkpoints(out_dir):
            if checkpoint.name not in registered:
                self._register_checkpoint(checkpoint, name)
                registered.add(checkpoint.name)

    def _register_checkpoint(self, checkpoint: Path, name: str) -> ModelRecord:
        lineage = json.loads((checkpoint / "lineage.json").read_text())
        record = self.registrar.register_model(path=str(checkpoint), name=f"{name}@step{lineage['step']}",
                                               lineage=lineage)
        self.registrar.catalog.set_model_alias(name, record.digest)  # the name alone follows the newest
        return record
