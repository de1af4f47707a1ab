"""What a Hugging Face torch model is made of: its digest, kind, blocks, final norm and head.

- ``model_digest(model)``: the content address of a model (class, config, weight tensors).
- ``decide_kind(model)``: "encoder" | "causal-lm" | "vision".
- ``find_blocks(base, config)``: the ``nn.ModuleList`` of transformer blocks.
- ``find_final_norm(base)`` / ``find_head_module(model)``: the final norm and the task head.
- ``replaced_layer(blocks, layer, values)``: a forward hook that substitutes one residual state
  (model stitching).

These functions only look at a model; loading one is ``actstore.modeling.adapter``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from actstore.errors import InvalidArgument

__all__ = [
    "DIGEST_VERSION",
    "KINDS",
    "decide_kind",
    "find_blocks",
    "find_final_norm",
    "find_head_module",
    "model_digest",
    "replaced_layer",
]

KINDS = ("encoder", "causal-lm", "vision")

# ---------------------------------------------------------------------------------------------
# Digest
# ---------------------------------------------------------------------------------------------

DIGEST_VERSION = "actstore-model-digest-v1"

# Config keys that describe how or where a model was loaded or saved, not what it computes.
# Every top-level key starting with "_" (_name_or_path, _commit_hash, _attn_implementation...)
# is dropped as well. "architectures" is dropped because it is absent on a model built in memory
# and present after save_pretrained; the class actually instantiated is hashed instead.
_VOLATILE_CONFIG_KEYS = frozenset(
    {
        "transformers_version",
        "architectures",
        "dtype",
        "torch_dtype",
        "attn_implementation",
        "use_cache",
        "output_hidden_states",
        "output_attentions",
        "return_dict",
    }
)


def _digest_config(config: Any) -> dict[str, Any]:
    # to_diff_dict (what save_pretrained writes): only the values that differ from the class
    # defaults, so a transformers upgrade that adds config attributes leaves digests unchanged.
    raw = config.to_diff_dict()
    return {
        k: v for k, v in raw.items() if not k.startswith("_") and k not in _VOLATILE_CONFIG_KEYS
    }


def _canonical_json(value: Any) -> bytes:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True, default=str
    ).encode()


def model_digest(model: nn.Module) -> str:
    """sha256 over the model class, its config and every weight tensor.

    Hashed, in this order: a version tag; the class name; the canonical JSON (sorted keys, no
    whitespace) of ``config.to_diff_dict()`` without load-time keys (see ``_VOLATILE_CONFIG_KEYS``
    and every key starting with "_"); then for each ``state_dict`` entry sorted by name, a JSON
    header {name, dtype, shape, nbytes} followed by the raw bytes (C order). A tensor that shares
    storage with one already hashed (tied embeddings) is hashed once, under its first name in
    sorted order. The digest is of the weights as loaded (actstore loads float32), so it is
    identical across save / load round trips.
    """
    h = hashlib.sha256()

    def put(chunk: bytes) -> None:
        h.update(len(chunk).to_bytes(8, "little"))
        h.update(chunk)

    put(DIGEST_VERSION.encode())
    put(type(model).__name__.encode())
    config = getattr(model, "config", None)
    put(_canonical_json(_digest_config(config) if config is not None else None))
    seen: set[tuple[int, int, tuple[int, ...], tuple[int, ...], str]] = set()
    state = model.state_dict()
    for name in sorted(state):
        tensor = state[name]
        if not isinstance(tensor, torch.Tensor):
            continue
        if tensor.device.type == "meta":
            raise InvalidArgument(
                f"tensor {name} has no data (meta device); load the weights first"
            )
        storage_key = (
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tuple(tensor.shape),
            tuple(tensor.stride()),
            str(tensor.dtype),
        )
        if tensor.numel() > 0 and storage_key in seen:
            continue  # tied: the same tensor under a second name
        seen.add(storage_key)
        data = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
        header = {
            "name": name,
            "dtype": str(tensor.dtype).removeprefix("torch."),
            "shape": list(tensor.shape),
            "nbytes": int(data.nbytes),
        }
        put(_canonical_json(header))
        h.update(memoryview(data))
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# Structure
# ---------------------------------------------------------------------------------------------


def decide_kind(model: nn.Module) -> str:
    """"vision" (pixel inputs), "causal-lm" (a decoder-only family, heads included) or "encoder".
    Encoder-decoder models raise InvalidArgument."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    if getattr(model, "main_input_name", "input_ids") == "pixel_values":
        return "vision"
    model_type = getattr(model.config, "model_type", None)
    arch = type(model).__name__
    if arch in set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()) or arch.endswith("LMHeadModel"):
        return "causal-lm"
    # A decoder-only family (has a causal LM class and no masked LM class): its base model and
    # its classification heads are causal too.
    if (
        model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        and model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES
        and not getattr(model.config, "is_encoder_decoder", False)
    ):
        return "causal-lm"
    if getattr(model.config, "is_encoder_decoder", False):
        raise InvalidArgument(f"encoder-decoder models ({arch}) are not supported")
    return "encoder"


def find_blocks(base: nn.Module, config: Any) -> tuple[str, nn.ModuleList]:
    """The name and the ``nn.ModuleList`` of the ``config.num_hidden_layers`` transformer blocks."""
    n = int(config.num_hidden_layers)
    for name, module in base.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) == n and n > 0:
            return name, module
    raise InvalidArgument(
        f"cannot find the {n} transformer blocks of {type(base).__name__}; this architecture is not supported"
    )


_FINAL_NORM_NAMES = ("norm", "ln_f", "final_layernorm", "final_layer_norm", "norm_f", "layernorm")
_HEAD_NAMES = ("classifier", "score")


def find_final_norm(base: nn.Module) -> nn.Module | None:
    """The backbone's final norm (under one of the usual HF attribute names), or None."""
    for name in _FINAL_NORM_NAMES:
        module = getattr(base, name, None)
        if isinstance(module, nn.Module) and not isinstance(module, nn.Identity):
            return module
    return None


def find_head_module(model: nn.Module) -> nn.Module | None:
    """The task head of a HF classification model (its `classifier` or `score`), or None."""
    for name in _HEAD_NAMES:
        candidate = getattr(model, name, None)
        if isinstance(candidate, nn.Module):
            return candidate
    return None


@contextmanager
def replaced_layer(blocks: nn.ModuleList, layer: int, values: torch.Tensor) -> Iterator[None]:
    """Within the block, any forward through ``blocks`` sees ``values`` (b, s, d) as residual state
    ``layer`` (0 = embeddings, L = len(blocks) = the last block's output before the final norm):
    the input of block ``layer``, or the output of the last block for layer L."""
    if layer < len(blocks):
        def pre_hook(_m: nn.Module, args: tuple, kwargs: dict):
            if args:
                return (values, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": values}

        handle = blocks[layer].register_forward_pre_hook(pre_hook, with_kwargs=True)
    else:
        def hook(_m: nn.Module, _args: tuple, output: Any):
            return (values, *output[1:]) if isinstance(output, (tuple, list)) else values

        handle = blocks[-1].register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()
