"""The training loop: one loop for every recipe and method, with atomic, resumable checkpoints.

``train(recipe, method, seed, out_dir=...)`` trains and writes checkpoints ``out_dir/step-<k>/``
(layout and atomic writes: ``actstore.training.checkpoints``). Checkpoints are taken every
``recipe.checkpoint_every`` steps and at the end. Only the newest checkpoint keeps its
``training_state.pt`` (the optimizer state is twice the model's size); older folders stay complete
Hugging Face model folders (``keep_training_states=True`` keeps every state).

Determinism: the batch of step t is a pure function of (seed, t): each epoch e is the permutation
``numpy.random.default_rng([seed, e])`` of the training rows, and step t takes the rows
``(t-1)*B .. t*B-1`` of their concatenation. The model is initialised under
``torch.manual_seed(seed)``. Dropout draws from torch's global RNG, whose state is saved in every
checkpoint and restored on resume. The learning rate is a function of the step (linear warm-up,
then cosine to 0 at the run's total steps). So on CPU a run resumed from step k reproduces the
uninterrupted run's weights bit for bit (``tests/training/test_loop.py``). Resuming with a
different ``steps`` is allowed and changes the rest of the schedule.

No Ray here: the caller (the ``actstore train`` job) runs ``train`` wherever it likes.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from actstore.errors import AlreadyExists, DataLoss, FailedPrecondition, InvalidArgument
from actstore.store.datasets import DatasetData
from actstore.training import objectives as obj
from actstore.training.checkpoints import (
    INFO_FILE,
    LINEAGE_FILE,
    STATE_FILE,
    DirLock,
    RunIdentity,
    list_checkpoints,
    load_model,
    load_state,
    remove_staging,
    save_checkpoint,
    set_rng_state,
)
from actstore.training.recipes import Recipe, get_recipe

__all__ = [
    "TrainResult",
    "batch_indices",
    "evaluate",
    "learning_rate",
    "train",
]

ProgressFn = Callable[[int, int, dict[str, Any]], None]


@dataclass
class TrainResult:
    recipe: str
    smoke: bool
    method: str
    seed: int
    out_dir: Path
    step: int  # the step of the last checkpoint
    total_steps: int
    finished: bool  # step == total_steps
    checkpoint: Path | None  # the last checkpoint folder
    checkpoints: list[Path] = field(default_factory=list)  # every checkpoint in out_dir, in order
    new_checkpoints: list[Path] = field(default_factory=list)  # the ones this call wrote
    resumed_from: int | None = None  # the step this call resumed from
    metrics: dict[str, Any] = field(default_factory=dict)  # eval metrics of the last checkpoint
    digest: str | None = None  # model_digest of the last checkpoint
    elapsed: float = 0.0  # seconds spent in this call
    train_seconds: float = 0.0  # seconds spent in optimizer steps in this call


# ---------------------------------------------------------------------------------------------
# Pure helpers: schedule and batches
# ---------------------------------------------------------------------------------------------


def learning_rate(step: int, total: int, base_lr: float, warmup: int) -> float:
    """The learning rate of optimizer step ``step`` (1-based): ``base * step / warmup`` during
    warm-up, then ``base * (1 + cos(pi * p)) / 2`` with p going from 0 to 1 over the rest."""
    if warmup > 0 and step <= warmup:
        return base_lr * step / warmup
    span = max(1, total - warmup)
    p = min(1.0, max(0.0, (step - warmup) / span))
    return base_lr * 0.5 * (1.0 + math.cos(math.pi * p))


def batch_indices(seed: int, step: int, n: int, batch_size: int) -> np.ndarray:
    """Rows of step ``step`` (1-based): positions (step-1)*B .. step*B-1 of the concatenated
    per-epoch permutations ``default_rng([seed, epoch]).permutation(n)``."""
    start = (step - 1) * batch_size
    out = []
    pos = start
    while len(out) < batch_size:
        epoch, offset = divmod(pos, n)
        perm = np.random.default_rng([seed, epoch]).permutation(n)
        take = perm[offset : offset + batch_size - len(out)]
        out.extend(take.tolist())
        pos += len(take)
    return np.asarray(out, dtype=np.int64)


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------


def _base_args(model: nn.Module) -> set[str]:
    import inspect

    params = inspect.signature(model.base_model.forward).parameters
    return {k for k, p in params.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


def _make_batch(
    recipe: Recipe,
    data: DatasetData,
    rows: np.ndarray,
    tokenizer: Any,
    allowed: set[str],
    device: torch.device,
) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    labels = None
    if data.labels is not None:
        labels = torch.from_numpy(data.labels[rows]).to(device)
    if recipe.kind == "vision":
        imgs = data.images[rows]
        if imgs.dtype == np.uint8:  # exactly ModelAdapter's conversion
            x = torch.from_numpy(imgs.astype(np.float32) / np.float32(255.0))
        else:
            x = torch.from_numpy(np.ascontiguousarray(imgs, dtype=np.float32))
        return {"pixel_values": x.to(device)}, labels
    texts = [data.texts[i] for i in rows.tolist()]
    enc = tokenizer(
        texts,
        padding="longest",
        truncation=True,
        max_length=recipe.max_len,
        return_tensors="pt",
    )
    inputs = {k: v.to(device) for k, v in enc.items() if k in allowed}
    return inputs, labels


# ---------------------------------------------------------------------------------------------
# Evaluation (cheap, logged in checkpoint.json; the lens metrics proper come from the service)
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def evaluate(
    model: nn.Module,
    recipe: Recipe,
    data: DatasetData,
    tokenizer: Any,
    heads: Mapping[str, nn.Module] | None = None,
    device: torch.device | str | None = None,
) -> dict[str, Any]:
    """Eval metrics: the last layer's accuracy and CE loss (perplexity for an LM), and the
    accuracy of the shared head at every layer 1..L (``acc_by_layer``); for a multi-exit model
    also the accuracy of its own exit classifiers (``exit_acc_by_layer``). LM accuracy is
    next-token accuracy over non-pad targets. Uses no randomness (eval mode)."""
    device = torch.device(device) if device is not None else next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        parts = obj.head_parts(model)
        allowed = _base_args(model)
        L = int(model.config.num_hidden_layers)
        correct = np.zeros(L, dtype=np.int64)
        exit_correct = np.zeros(L, dtype=np.int64)
        loss_sum = 0.0
        count = 0
        rows = np.arange(data.n)
        for start in range(0, data.n, recipe.eval_batch_size):
            idx = rows[start : start + recipe.eval_batch_size]
            inputs, labels = _make_batch(recipe, data, idx, tokenizer, allowed, device)
            states = obj.residual_states(model, inputs)
            if parts.kind == "causal-lm":
                targets = obj.lm_targets(inputs["input_ids"], inputs.get("attention_mask"))
            else:
                targets = labels
            valid = targets != obj.IGNORE_INDEX
            n_valid = int(valid.sum())
            for layer in range(1, L + 1):
                logits = obj.layer_logits(parts, states[layer])
                pred = logits.argmax(-1)
                correct[layer - 1] += int(((pred == targets) & valid).sum())
                if layer == L:
                    loss_sum += float(
                        torch.nn.functional.cross_entropy(
                            logits.reshape(-1, logits.shape[-1]).float(),
                            targets.reshape(-1),
                            ignore_index=obj.IGNORE_INDEX,
                            reduction="sum",
                        )
                    )
                if heads is not None:
                    head = heads[str(layer)] if layer < L else None
                    exit_logits = obj.layer_logits(parts, states[layer], head)
                    exit_correct[layer - 1] += int(((exit_logits.argmax(-1) == targets) & valid).sum())
            count += n_valid
        acc = (correct / max(count, 1)).tolist()
        out: dict[str, Any] = {
            "eval_n": int(data.n),
            "eval_targets": int(count),
            "acc": acc[-1],
            "loss": loss_sum / max(count, 1),
            "acc_by_layer": acc,
        }
        if parts.kind == "causal-lm":
            out["perplexity"] = float(math.exp(min(out["loss"], 50.0)))
        if heads is not None:
            out["exit_acc_by_layer"] = (exit_correct / max(count, 1)).tolist()
        return out
    finally:
        model.train(was_training)


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------


def _param_groups(
    model: nn.Module, heads: nn.ModuleDict | None, weight_decay: float
) -> list[dict[str, Any]]:
    decay, no_decay = [], []
    seen: set[int] = set()
    named = list(model.named_parameters())
    if heads is not None:
        named += [(f"exit_heads.{n}", p) for n, p in heads.named_parameters()]
    for _name, p in named:
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.ndim >= 2 else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise InvalidArgument(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def train(
    recipe: Recipe | str,
    method: str,
    seed: int = 0,
    steps: int | None = None,
    *,
    out_dir: str | os.PathLike,
    progress: ProgressFn | None = None,
    device: str | torch.device | None = None,
    resume: bool = True,
    alternating: bool = False,
    weights: str = "linear",
    beta: float | None = None,
    stop_at: int | None = None,
    keep_training_states: bool = False,
) -> TrainResult:
    """Train ``recipe`` with ``method`` (standard | aligned | multi-exit | ce-reg).

    ``steps`` defaults to ``recipe.steps``. ``out_dir`` receives the checkpoints (see the module
    docstring). When it already holds checkpoints of the same run (recipe, smoke, method, seed,
    weights, alternating, beta) and ``resume`` is true, training continues from the newest one;
    a different run there raises ``AlreadyExists``, and so does any checkpoint with
    ``resume=False``. ``progress(step, total, metrics)`` is called after every step with
    ``{"loss", "ce_last", "lr", "objective"}`` (+ ``"layer_ce"`` / ``"regulariser"`` when
    computed) and, at a checkpoint, ``"checkpoint"`` and ``"eval"``. ``stop_at`` ends the call
    after that step (checkpointed) as if interrupted; a later call resumes. ``device``: default
    CUDA when available, else CPU. ``weights``: "linear" | "uniform" (lambda_l); ``beta``: the
    ce-reg coefficient (None: ``recipe.beta``); ``alternating``: see ``objectives.objective_for_step``.
    """
    t_start = time.perf_counter()
    recipe = get_recipe(recipe) if isinstance(recipe, str) else recipe
    if not isinstance(recipe, Recipe):
        raise InvalidArgument(f"recipe must be a Recipe or a recipe name, got {type(recipe).__name__}")
    obj.check_method(method)
    seed = _check_int("seed", seed, 0)
    total = _check_int("steps", recipe.steps if steps is None else steps, 1)
    if stop_at is not None:
        stop_at = _check_int("stop_at", stop_at, 1)
    if weights not in obj.WEIGHT_SCHEMES:
        raise InvalidArgument(f"unknown weights {weights!r}; use one of {', '.join(obj.WEIGHT_SCHEMES)}")
    beta = recipe.beta if beta is None else beta
    if not (isinstance(beta, (int, float)) and math.isfinite(beta) and beta >= 0):
        raise InvalidArgument(f"beta must be a finite number >= 0, got {beta!r}")
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    run = RunIdentity(recipe, method, seed, weights, bool(alternating), float(beta))

    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    with DirLock(out):
        remove_staging(out)  # a crash mid-write; we hold the lock
        existing = list_checkpoints(out)
        resume_from: Path | None = None
        if existing:
            if not resume:
                raise AlreadyExists(
                    f"{out} holds checkpoints already ({existing[-1].name}); pass resume=True to "
                    "continue that run, or use an empty folder"
                )
            with_state = [p for p in existing if (p / STATE_FILE).is_file()]
            if not with_state:
                raise FailedPrecondition(f"no checkpoint in {out} has a {STATE_FILE} to resume from")
            resume_from = with_state[-1]
            lineage = json.loads((resume_from / LINEAGE_FILE).read_text())
            mine = run.identity()
            differ = {k: (lineage.get(k), v) for k, v in mine.items() if lineage.get(k) != v}
            if differ:
                raise AlreadyExists(
                    f"{out} holds a different run ({resume_from.name}): "
                    + ", ".join(f"{k}: stored {a!r}, asked {b!r}" for k, (a, b) in differ.items())
                )
        return _train_locked(
            run, total, out, resume_from, progress, device, stop_at, keep_training_states, t_start
        )


def _train_locked(
    run: RunIdentity,
    total: int,
    out: Path,
    resume_from: Path | None,
    progress: ProgressFn | None,
    device: torch.device,
    stop_at: int | None,
    keep_training_states: bool,
    t_start: float,
) -> TrainResult:
    recipe = run.recipe
    result = TrainResult(
        recipe=recipe.name,
        smoke=recipe.smoke,
        method=run.method,
        seed=run.seed,
        out_dir=out,
        step=0,
        total_steps=total,
        finished=False,
        checkpoint=None,
    )
    train_data = recipe.train_data()
    eval_data = recipe.eval_data()

    state: dict[str, Any] | None = None
    if resume_from is not None:
        state = load_state(resume_from)
        start = int(state["step"])
        result.resumed_from = start
        result.step = start
        result.checkpoint = resume_from
        info_path = resume_from / INFO_FILE
        if info_path.is_file():
            info = json.loads(info_path.read_text())
            result.metrics = info.get("metrics") or {}
            result.digest = info.get("digest")
        if start >= total:
            result.finished = True
            result.checkpoints = list_checkpoints(out)
            result.elapsed = time.perf_counter() - t_start
            return result
        model, tokenizer = load_model(resume_from, recipe)
    else:
        start = 0
        torch.manual_seed(run.seed)
        tokenizer = recipe.build_tokenizer(train_data)
        model = recipe.build_model(tokenizer)
    model = model.to(device=device, dtype=torch.float32)
    model.requires_grad_(True)
    model.train()
    parts = obj.head_parts(model)
    heads: nn.ModuleDict | None = None
    if run.method == "multi-exit":
        heads = obj.make_exit_heads(model, parts)
        if state is not None:
            if state.get("exit_heads") is None:
                raise DataLoss(f"{resume_from} is a multi-exit checkpoint without exit heads")
            heads.load_state_dict(state["exit_heads"])
        heads.to(device).train()
    optimizer = torch.optim.AdamW(
        _param_groups(model, heads, recipe.weight_decay), lr=recipe.lr, betas=(0.9, 0.999)
    )
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        set_rng_state(state["rng"])
    else:
        torch.manual_seed(run.seed)  # dropout stream: independent of how the model was built
    allowed = _base_args(model)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    parent = resume_from.name if resume_from is not None else None
    last_stop = total if stop_at is None else min(total, stop_at)
    train_seconds = 0.0

    for step in range(start + 1, last_stop + 1):
        t0 = time.perf_counter()
        lr = learning_rate(step, total, recipe.lr, recipe.warmup_steps)
        for g in optimizer.param_groups:
            g["lr"] = lr
        rows = batch_indices(run.seed, step, train_data.n, recipe.batch_size)
        inputs, labels = _make_batch(recipe, train_data, rows, tokenizer, allowed, device)
        out_loss = obj.training_loss(
            model,
            inputs,
            labels,
            run.method,
            step=step,
            alternating=run.alternating,
            weights=run.weights,
            exit_heads=heads,
            beta=run.beta,
            parts=parts,
        )
        if not torch.isfinite(out_loss.loss):
            raise FailedPrecondition(
                f"the loss is {float(out_loss.loss.detach())} at step {step} of {recipe.label}/{run.method}"
            )
        optimizer.zero_grad(set_to_none=True)
        out_loss.loss.backward()
        if recipe.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(params, recipe.grad_clip)
        optimizer.step()
        train_seconds += time.perf_counter() - t0
        metrics: dict[str, Any] = {
            "loss": float(out_loss.loss.detach()),
            "ce_last": out_loss.ce_last,
            "lr": lr,
            "objective": out_loss.objective,
        }
        if out_loss.layer_ce is not None:
            metrics["layer_ce"] = out_loss.layer_ce
        if out_loss.regulariser is not None:
            metrics["regulariser"] = out_loss.regulariser
        if step % recipe.checkpoint_every == 0 or step == last_stop:
            ev = evaluate(model, recipe, eval_data, tokenizer, heads, device)
            ev["train_loss"] = metrics["loss"]
            ckpt, digest = save_checkpoint(
                out, step, total, run, model, tokenizer, parts, heads, optimizer, parent, ev,
                time.perf_counter() - t_start,
            )
            if not keep_training_states and parent is not None:
                old = out / parent / STATE_FILE
                if old.is_file():
                    old.unlink()
            parent = ckpt.name
            result.step = step
            result.checkpoint = ckpt
            result.new_checkpoints.append(ckpt)
            result.metrics = ev
            result.digest = digest
            metrics["checkpoint"] = str(ckpt)
            metrics["eval"] = ev
        if progress is not None:
            progress(step, total, metrics)

    result.finished = result.step >= total
    result.checkpoints = list_checkpoints(out)
    result.elapsed = time.perf_counter() - t_start
    result.train_seconds = train_seconds
    return result
