"""The training loop: one loop for every recipe and method, with atomic, resumable checkpoints.

``train(recipe, method, seed, out_dir=...)`` trains and writes checkpoints into ``out_dir``:

    out_dir/step-<k>/
        config.json, model.safetensors, (tokenizer files)   save_pretrained of model + tokenizer
        exit_heads.safetensors, exit_heads.json              multi-exit only (see exit_heads())
        training_state.pt                                    optimizer, schedule, step, RNG, run
        lineage.json                                         {recipe, method, seed, step, parent, ...}
        checkpoint.json                                      digest, eval metrics, timings

A checkpoint is written into a hidden temp folder and renamed into place, so ``step-<k>`` exists
only when it is complete. Checkpoints are taken every ``recipe.checkpoint_every`` steps and at
the end. Only the newest checkpoint keeps its ``training_state.pt`` (the optimizer state is twice
the model's size); older folders stay complete Hugging Face model folders
(``keep_training_states=True`` keeps every state).

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
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import numpy as np
import torch
from torch import nn

from actstore.errors import AlreadyExists, DataLoss, FailedPrecondition, InvalidArgument
from actstore.store.datasets import DatasetData
from actstore.training import objectives as obj
from actstore.training.recipes import Recipe, get_recipe, quiet_transformers

__all__ = [
    "CHECKPOINT_RE",
    "EXIT_HEADS_FILE",
    "EXIT_HEADS_JSON",
    "TrainResult",
    "batch_indices",
    "evaluate",
    "exit_heads",
    "learning_rate",
    "list_checkpoints",
    "load_exit_heads",
    "train",
]

CHECKPOINT_RE = re.compile(r"^step-(\d+)$")
STATE_FILE = "training_state.pt"
LINEAGE_FILE = "lineage.json"
INFO_FILE = "checkpoint.json"
EXIT_HEADS_FILE = "exit_heads.safetensors"
EXIT_HEADS_JSON = "exit_heads.json"
STATE_FORMAT = 1

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
# Checkpoints
# ---------------------------------------------------------------------------------------------


def list_checkpoints(out_dir: str | os.PathLike) -> list[Path]:
    """The ``step-<k>`` folders of ``out_dir`` in step order (complete by construction)."""
    d = Path(out_dir)
    if not d.is_dir():
        return []
    found = []
    for p in d.iterdir():
        m = CHECKPOINT_RE.match(p.name)
        if m and p.is_dir() and (p / "config.json").is_file() and (p / LINEAGE_FILE).is_file():
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def _step_of(path: Path) -> int:
    m = CHECKPOINT_RE.match(path.name)
    assert m is not None
    return int(m.group(1))


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True, default=str) + "\n")


def _save_exit_heads(
    directory: Path, heads: nn.ModuleDict, parts: obj.HeadParts, num_layers: int
) -> None:
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    own = {str(num_layers): parts.classifier}
    for key, head in {**dict(heads.items()), **own}.items():
        tensors[f"{key}.weight"] = head.weight.detach().to("cpu", torch.float32).contiguous().clone()
        if head.bias is not None:
            tensors[f"{key}.bias"] = head.bias.detach().to("cpu", torch.float32).contiguous().clone()
    save_file(tensors, str(directory / EXIT_HEADS_FILE), metadata={"format": "actstore-exit-heads-v1"})
    _write_json(
        directory / EXIT_HEADS_JSON,
        {
            "format": 1,
            "num_layers": num_layers,
            "layers": list(range(1, num_layers + 1)),
            "own_head_layer": num_layers,
            "bias": parts.classifier.bias is not None,
            "shape": list(parts.classifier.weight.shape),
            "description": (
                "one linear classifier per layer: z_l = W_l . x + b_l, where x is the input of "
                "the model's own classifier computed from layer l's residual state (the final "
                "norm and, for BERT, the pooler are shared: exactly lens_head() with weight / "
                "bias replaced). Layers 1..L-1 are the extra exits (initialised as copies of the "
                "model's classifier); layer L is a copy of the model's own classifier."
            ),
        },
    )


def load_exit_heads(model_dir: str | os.PathLike) -> dict[int, tuple[torch.Tensor, torch.Tensor | None]] | None:
    """As ``exit_heads`` but torch tensors."""
    d = Path(model_dir)
    path = d / EXIT_HEADS_FILE
    if not path.is_file():
        return None
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path))
        meta = json.loads((d / EXIT_HEADS_JSON).read_text())
    except Exception as exc:  # a corrupt file is data loss, whatever the parser says
        raise DataLoss(f"cannot read the exit heads in {d} ({type(exc).__name__}: {exc})") from exc
    out: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}
    for layer in meta["layers"]:
        w = tensors.get(f"{layer}.weight")
        if w is None:
            raise DataLoss(f"{path} has no weight for layer {layer}")
        out[int(layer)] = (w, tensors.get(f"{layer}.bias"))
    return out


def exit_heads(model_dir: str | os.PathLike) -> dict[int, tuple[np.ndarray, np.ndarray | None]] | None:
    """A multi-exit checkpoint's own classifiers: ``{layer: (W (C x d), b (C,) or None)}`` for
    layers 1..L (L is a copy of the model's own classifier), float32 numpy; None for a model
    trained without exit heads. Logits at layer l: take ``lens_head()`` of the model and replace
    its ``weight`` / ``bias`` by ``W_l`` / ``b_l`` (norm and pooler are shared)."""
    heads = load_exit_heads(model_dir)
    if heads is None:
        return None
    return {
        layer: (w.numpy().copy(), None if b is None else b.numpy().copy())
        for layer, (w, b) in heads.items()
    }


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: Mapping[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@dataclass
class _Run:
    recipe: Recipe
    method: str
    seed: int
    weights: str
    alternating: bool
    beta: float

    def identity(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe.name,
            "smoke": self.recipe.smoke,
            "method": self.method,
            "seed": self.seed,
            "weights": self.weights,
            "alternating": self.alternating,
            "beta": self.beta,
        }


def _save_checkpoint(
    out_dir: Path,
    step: int,
    total: int,
    run: _Run,
    model: nn.Module,
    tokenizer: Any,
    parts: obj.HeadParts,
    heads: nn.ModuleDict | None,
    optimizer: torch.optim.Optimizer,
    parent: str | None,
    metrics: dict[str, Any],
    elapsed: float,
) -> tuple[Path, str]:
    from actstore.workers.models import model_digest

    final = out_dir / f"step-{step}"
    if final.exists():
        raise AlreadyExists(f"checkpoint {final} exists already")
    tmp = Path(tempfile.mkdtemp(prefix=f".step-{step}.tmp-", dir=out_dir))
    try:
        os.chmod(tmp, 0o755)
        with quiet_transformers():
            model.save_pretrained(tmp)
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)
        L = int(model.config.num_hidden_layers)
        if heads is not None:
            _save_exit_heads(tmp, heads, parts, L)
        state = {
            "format": STATE_FORMAT,
            **run.identity(),
            "step": step,
            "total_steps": total,
            "optimizer": optimizer.state_dict(),
            "exit_heads": None if heads is None else heads.state_dict(),
            "scheduler": {
                "kind": "warmup-cosine",
                "base_lr": run.recipe.lr,
                "warmup_steps": run.recipe.warmup_steps,
                "total_steps": total,
            },
            "rng": _rng_state(),
        }
        torch.save(state, tmp / STATE_FILE)
        digest = model_digest(model)
        lineage = {**run.identity(), "step": step, "parent": parent}
        _write_json(tmp / LINEAGE_FILE, lineage)
        _write_json(
            tmp / INFO_FILE,
            {
                **lineage,
                "total_steps": total,
                "digest": digest,
                "metrics": metrics,
                "elapsed_seconds": elapsed,
                "kind": run.recipe.kind,
                "eval_source": run.recipe.eval_source(),
                "exit_heads": heads is not None,
                "lr": run.recipe.lr,
                "batch_size": run.recipe.batch_size,
            },
        )
        _fsync_tree(tmp)
        os.rename(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final, digest


def _load_state(ckpt: Path) -> dict[str, Any]:
    # on the CPU: RNG states must stay CPU byte tensors; the optimizer moves its state to the
    # parameters' device itself
    try:
        return torch.load(ckpt / STATE_FILE, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise DataLoss(f"cannot read {ckpt / STATE_FILE} ({type(exc).__name__}: {exc})") from exc


def _load_model(ckpt: Path, recipe: Recipe) -> tuple[nn.Module, Any]:
    import transformers
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(ckpt, local_files_only=True)
    arch = (getattr(config, "architectures", None) or [None])[0]
    cls = getattr(transformers, arch, None) if arch else None
    if cls is None:
        raise DataLoss(f"the checkpoint {ckpt} names no usable architecture ({arch!r})")
    with quiet_transformers():
        model, info = cls.from_pretrained(
            ckpt, config=config, dtype=torch.float32, local_files_only=True, output_loading_info=True
        )
    bad = {k: v for k, v in info.items() if v and k != "error_msgs"} | (
        {"error_msgs": info["error_msgs"]} if info.get("error_msgs") else {}
    )
    if bad:
        raise DataLoss(f"the checkpoint {ckpt} does not load cleanly: {bad}")
    tokenizer = None
    if recipe.kind != "vision":
        tokenizer = AutoTokenizer.from_pretrained(ckpt, local_files_only=True)
    return model, tokenizer


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


class _DirLock:
    """An exclusive advisory lock on ``out_dir/.lock``: one trainer per output folder."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / ".lock"
        self.fd: int | None = None

    def __enter__(self) -> Self:
        import fcntl

        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            self.fd = None
            raise FailedPrecondition(
                f"another training process is writing {self.path.parent}"
            ) from None
        return self

    def __exit__(self, *exc: object) -> None:
        import fcntl

        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


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
    beta: float = obj.DEFAULT_BETA,
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
    ce-reg coefficient; ``alternating``: see ``objectives.objective_for_step``.
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
    if not (isinstance(beta, (int, float)) and math.isfinite(beta) and beta >= 0):
        raise InvalidArgument(f"beta must be a finite number >= 0, got {beta!r}")
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    run = _Run(recipe, method, seed, weights, bool(alternating), float(beta))

    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    with _DirLock(out):
        for stale in out.glob(".step-*.tmp-*"):  # a crash mid-write; we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
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
    run: _Run,
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
        state = _load_state(resume_from)
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
        model, tokenizer = _load_model(resume_from, recipe)
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
        _set_rng_state(state["rng"])
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
            ckpt, digest = _save_checkpoint(
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
