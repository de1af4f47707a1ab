"""Training checkpoints: the folder layout, atomic writes, resume state and exit heads.

    out_dir/step-<k>/
        config.json, model.safetensors, (tokenizer files)   save_pretrained of model + tokenizer
        exit_heads.safetensors, exit_heads.json              multi-exit only (see exit_heads())
        training_state.pt                                    optimizer, schedule, step, RNG, run
        lineage.json                                         {recipe, method, seed, step, parent, ...}
        checkpoint.json                                      digest, eval metrics, timings

A checkpoint is written through ``actstore.store.atomic.atomic_directory`` (a staging folder,
every file fsynced, renamed into place), so ``step-<k>`` exists only when it is complete. Only the
newest checkpoint keeps its ``training_state.pt`` (the loop deletes older ones); every folder is a
complete Hugging Face model folder. ``DirLock`` keeps one trainer per output folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import numpy as np
import torch
from torch import nn

from actstore.errors import AlreadyExists, DataLoss, FailedPrecondition
from actstore.modeling.introspection import model_digest
from actstore.store.atomic import atomic_directory
from actstore.training import objectives as obj
from actstore.training.recipes import Recipe, quiet_transformers

__all__ = [
    "CHECKPOINT_RE",
    "EXIT_HEADS_FILE",
    "EXIT_HEADS_JSON",
    "INFO_FILE",
    "LINEAGE_FILE",
    "STATE_FILE",
    "DirLock",
    "RunIdentity",
    "exit_heads",
    "list_checkpoints",
    "load_exit_heads",
    "load_model",
    "load_state",
    "remove_staging",
    "save_checkpoint",
    "set_rng_state",
]

CHECKPOINT_RE = re.compile(r"^step-(\d+)$")
STATE_FILE = "training_state.pt"
LINEAGE_FILE = "lineage.json"
INFO_FILE = "checkpoint.json"
EXIT_HEADS_FILE = "exit_heads.safetensors"
EXIT_HEADS_JSON = "exit_heads.json"
STATE_FORMAT = 1
# Half-written checkpoints: atomic_directory's staging folders (".step-<k>.staging-*") and
# those of earlier versions, which staged in ".step-<k>.tmp-*".
_STAGING_GLOBS = (".step-*.staging-*", ".step-*.tmp-*")


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


def remove_staging(out_dir: Path) -> None:
    """Remove the staging folders of crashed checkpoint writes. Call it holding ``DirLock``: then
    no writer is live, whatever the folders' age."""
    for pattern in _STAGING_GLOBS:
        for stale in out_dir.glob(pattern):
            shutil.rmtree(stale, ignore_errors=True)


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
    trained without exit heads. Logits at layer l: the model's lens head (a
    ``metrics.lens.LensHead``) with its classifier replaced,
    ``head.with_classifier(W_l, b_l)`` (norm and pooler are shared)."""
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


def set_rng_state(state: Mapping[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])



@dataclass
class RunIdentity:
    """What makes two trainings the same run: resuming needs every field to match."""

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


def save_checkpoint(
    out_dir: Path,
    step: int,
    total: int,
    run: RunIdentity,
    model: nn.Module,
    tokenizer: Any,
    parts: obj.HeadParts,
    heads: nn.ModuleDict | None,
    optimizer: torch.optim.Optimizer,
    parent: str | None,
    metrics: dict[str, Any],
    elapsed: float,
) -> tuple[Path, str]:
    """Write ``out_dir/step-<step>`` atomically; return it and the model's digest.
    AlreadyExists if that checkpoint exists."""
    final = out_dir / f"step-{step}"
    if final.exists():
        raise AlreadyExists(f"checkpoint {final} exists already")
    try:
        with atomic_directory(final, _tensor_bytes(model, optimizer), "a training checkpoint") as staging:
            digest = _write_checkpoint(
                staging, step, total, run, model, tokenizer, parts, heads, optimizer, parent,
                metrics, elapsed,
            )
    except FileExistsError:
        raise AlreadyExists(f"checkpoint {final} exists already") from None
    return final, digest


def _tensor_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """About what a checkpoint of ``model`` and ``optimizer`` holds: their tensors' bytes."""
    tensors = [*model.state_dict().values()]
    tensors += [value for state in optimizer.state.values() for value in state.values() if torch.is_tensor(value)]
    return sum(t.numel() * t.element_size() for t in tensors)


def _write_checkpoint(
    directory: Path,
    step: int,
    total: int,
    run: RunIdentity,
    model: nn.Module,
    tokenizer: Any,
    parts: obj.HeadParts,
    heads: nn.ModuleDict | None,
    optimizer: torch.optim.Optimizer,
    parent: str | None,
    metrics: dict[str, Any],
    elapsed: float,
) -> str:
    with quiet_transformers():
        model.save_pretrained(directory)
        if tokenizer is not None:
            tokenizer.save_pretrained(directory)
    L = int(model.config.num_hidden_layers)
    if heads is not None:
        _save_exit_heads(directory, heads, parts, L)
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
    torch.save(state, directory / STATE_FILE)
    digest = model_digest(model)
    lineage = {**run.identity(), "step": step, "parent": parent}
    _write_json(directory / LINEAGE_FILE, lineage)
    _write_json(
        directory / INFO_FILE,
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
    return digest


def load_state(ckpt: Path) -> dict[str, Any]:
    # on the CPU: RNG states must stay CPU byte tensors; the optimizer moves its state to the
    # parameters' device itself
    try:
        return torch.load(ckpt / STATE_FILE, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise DataLoss(f"cannot read {ckpt / STATE_FILE} ({type(exc).__name__}: {exc})") from exc


def load_model(ckpt: Path, recipe: Recipe) -> tuple[nn.Module, Any]:
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


class DirLock:
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

