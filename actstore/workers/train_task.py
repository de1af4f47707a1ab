"""Training as a Ray task on any node: `actstore.training.train`, with its checkpoints and its
progress put into the store's files area (`actstore.training.stored`), which the job follows (a Ray
task has no channel back to the job but the shared store)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import torch

from actstore.store.handle import StoreHandle
from actstore.training import stored
from actstore.training.loop import train
from actstore.training.recipes import get_recipe


def run_training(recipe: str, method: str, seed: int, steps: int | None, smoke: bool, alternating: bool,
                 weights: str, store: StoreHandle, prefix: str, num_threads: int | None = None,
                 beta: float | None = None, stop_at: int | None = None) -> dict:
    """Train the run whose files-area folder is `prefix` (`stored.run_prefix`), resuming from its
    newest stored checkpoint. A local store is trained in place; with an object store the task
    trains in a scratch folder on this node and uploads each checkpoint as it is written.
    `stop_at` ends after that step, checkpointed, as if the task were stopped there."""
    if num_threads:
        torch.set_num_threads(num_threads)
    files = store.files
    scratch = None if not store.is_remote else stored.scratch_folder(prefix)
    written = [0.0]

    def progress(step: int, total: int, metrics: dict) -> None:
        if scratch is not None and "checkpoint" in metrics:
            stored.upload(files, prefix, Path(metrics["checkpoint"]))
        now = time.monotonic()
        if now - written[0] < 0.5 and step != total and "checkpoint" not in metrics:
            return
        written[0] = now
        stored.write_progress(files, prefix, {"step": step, "total": total,
                                              "loss": float(metrics.get("loss", float("nan")))})

    try:
        if scratch is not None:
            stored.restore(files, prefix, scratch)
        out_dir = store.path / prefix if scratch is None else scratch
        result = train(get_recipe(recipe, smoke=smoke), method, seed, steps, out_dir=out_dir, progress=progress,
                       alternating=alternating, weights=weights, beta=beta, stop_at=stop_at)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    checkpoint = (None if result.checkpoint is None else str(result.checkpoint) if scratch is None
                  else f"{prefix}/{result.checkpoint.name}")
    return {"step": result.step, "total": result.total_steps, "checkpoint": checkpoint, "metrics": result.metrics}
