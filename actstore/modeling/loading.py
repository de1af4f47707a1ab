"""Loading a local Hugging Face model folder, strictly: float32, eval mode, no gradients.

``load_folder(path, device)`` -> (model, tokenizer or None). Every reason a folder cannot be
used (no config, unknown architecture, missing / corrupt / mismatched weights, a broken
tokenizer, a device this machine lacks) raises InvalidArgument with the reason and a hint;
transformers would otherwise initialise missing tensors randomly and carry on.

No network is ever used (``local_files_only=True``) and ``trust_remote_code`` stays off.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from torch import nn

from actstore.errors import InvalidArgument
from actstore.modeling.tokens import LOAD_HINT, load_tokenizer

__all__ = ["files_beside_weights_digest", "load_folder", "model_class", "skeleton"]

# the weight files `model_digest` covers (by the tensors loaded from them)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".index.json")



def model_class(path: Path) -> tuple[Any, Any]:
    """(class, config) of the model folder ``path``: ``config.architectures[0]``, AutoModel when absent."""
    import transformers
    from transformers import AutoConfig, AutoModel, PreTrainedModel

    if not (path / "config.json").is_file():
        raise InvalidArgument(f"cannot load a model from {path}: no config.json there; {LOAD_HINT}")
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # a boundary: every reason becomes InvalidArgument
        raise InvalidArgument(
            f"cannot read the model config in {path} ({type(exc).__name__}: {exc}); {LOAD_HINT}"
        ) from exc
    archs = list(getattr(config, "architectures", None) or [])
    model_cls: Any = AutoModel
    if archs:
        candidate = getattr(transformers, archs[0], None)
        if not (isinstance(candidate, type) and issubclass(candidate, PreTrainedModel)):
            raise InvalidArgument(
                f"the model in {path} declares architecture {archs[0]!r}, which transformers "
                f"{transformers.__version__} does not provide; {LOAD_HINT}"
            )
        model_cls = candidate
    return model_cls, config


def skeleton(path: Path) -> nn.Module:
    """The model of ``path`` built on the meta device (no weights read, no memory): its module
    tree, to name and check modules before a worker loads the real thing."""
    model_cls, config = model_class(path)
    with torch.device("meta"):
        if model_cls.__name__ == "AutoModel":
            return model_cls.from_config(config)
        return model_cls(config)


def load_folder(path: Path, device: str) -> tuple[nn.Module, Any | None]:
    """The model of ``path`` (class ``config.architectures[0]``, AutoModel when absent) on
    ``device`` in float32 eval mode with gradients off, and its tokenizer if the folder has one."""
    model_cls, config = model_class(path)
    # a GPU's model loads straight onto it (no float32 copy of every weight in host memory first);
    # on the CPU transformers' default is that device already
    straight = {} if device == "cpu" else {"device_map": device}
    try:
        model, info = model_cls.from_pretrained(
            path,
            config=config,
            dtype=torch.float32,
            local_files_only=True,
            output_loading_info=True,
            **straight,
        )
    except Exception as exc:
        raise InvalidArgument(
            f"cannot load the model weights in {path} ({type(exc).__name__}: {exc}); {LOAD_HINT}"
        ) from exc
    problems = {
        k: sorted(map(str, info.get(k) or ()))
        for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")
    }
    problems = {k: v for k, v in problems.items() if v}
    if problems:
        detail = "; ".join(
            f"{k}: {', '.join(v[:5])}{' ...' if len(v) > 5 else ''}" for k, v in problems.items()
        )
        raise InvalidArgument(
            f"the weights in {path} do not match the {model_cls.__name__} architecture ({detail}); "
            f"transformers would initialise those tensors randomly; {LOAD_HINT}"
        )
    tokenizer = load_tokenizer(path, LOAD_HINT)
    try:
        model = model.to(device=device, dtype=torch.float32).eval()
    except Exception as exc:
        raise InvalidArgument(
            f"cannot move the model to device {device!r} ({type(exc).__name__}: {exc}); "
            "pass device='cpu' or a device this machine has"
        ) from exc
    model.requires_grad_(False)
    return model, tokenizer


def files_beside_weights_digest(path: Path) -> str:
    """sha256 over the names and bytes of every file of the model folder ``path`` but its weight
    files (``WEIGHT_SUFFIXES``): the tokenizer, the configs, anything else a load reads. With the
    model's digest (its class, config and weights) it tells two folders that load the same model
    and tokenizer; a difference in any other file counts too, on the safe side."""
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file() and not p.name.endswith(WEIGHT_SUFFIXES)):
        name = file.relative_to(path).as_posix().encode()
        content = file.read_bytes()
        for part in (name, content):
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part)
    return digest.hexdigest()
