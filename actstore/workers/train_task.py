"""Training as a Ray task: `actstore.training.train` with its progress written to a file that the
job manager follows (a Ray task has no channel back to the job but the shared store)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from actstore.store.atomic import atomic_write_text
from actstore.training.loop import train
from actstore.training.recipes import get_recipe

PROGRESS_FILE = "progress.json"


def progress_path(out_dir: str | Path) -> Path:
    return Path(out_dir) / PROGRESS_FILE


def read_progress(out_dir: str | Path) -> dict | None:
    try:
        return json.loads(progress_path(out_dir).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def run_training(recipe: str, method: str, seed: int, steps: int | None, smoke: bool, alternating: bool,
                 weights: str, out_dir: str, num_threads: int | None = None, beta: float | None = None) -> dict:
    if num_threads:
        torch.set_num_threads(num_threads)
    path = progress_path(out_dir)
    written = [0.0]

    def progress(step: int, total: int, metrics: dict) -> None:
        now = time.monotonic()
        if now - written[0] < 0.5 and step != total and "checkpoint" not in metrics:
            return
        written[0] = now
        record = {"step": step, "total": total, "loss": float(metrics.get("loss", float("nan")))}
        atomic_write_text(path, json.dumps(record))

    result = train(get_recipe(recipe, smoke=smoke), method, seed, steps, out_dir=out_dir, progress=progress,
                   alternating=alternating, weights=weights, beta=beta)
    return {"step": result.step, "total": result.total_steps, "checkpoint": str(result.checkpoint),
            "metrics": result.metrics}
