"""The lens head of a torch model: read into a ``metrics.lens.LensHead``, applied with torch.

``describe_lens_head(model, ...)`` takes the final norm (weight, bias, eps, kind), the pooler (if
any) and the classifier / unembedding out of a Hugging Face model into the typed, numpy-only
``LensHead``; that object is what registration stores and lens tasks load.

``TorchLensHead(head, device)`` applies a ``LensHead`` in float32 torch on a device (the GEMM
against a 49k-token unembedding is the lens's whole cost, so it runs where the activations are).
It is the same formula as ``LensHead.logits`` (float64 numpy, the reference), term for term.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from actstore.errors import InvalidArgument
from actstore.metrics.lens_head import LensHead
from actstore.modeling.introspection import find_final_norm, find_head_module

__all__ = ["TorchLensHead", "describe_lens_head"]

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "tanh": torch.tanh,
    "relu": torch.relu,
    "gelu": F.gelu,
}


def _activation_name(module: nn.Module) -> str | None:
    if isinstance(module, nn.Tanh):
        return "tanh"
    if isinstance(module, nn.ReLU):
        return "relu"
    if isinstance(module, nn.GELU) and getattr(module, "approximate", "none") == "none":
        return "gelu"
    return None


def _np(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else t.detach().float().cpu().numpy().copy()


def _norm_spec(module: nn.Module | None, width: int) -> dict[str, Any]:
    """A final norm module as LensHead's {norm, norm_weight, norm_bias, eps}. A norm without a
    learned scale gets ones; the lens self-check catches any variant whose forward differs from
    the formula (Gemma's (1 + w) scale, for one)."""
    spec: dict[str, Any] = {"norm": "none", "norm_weight": None, "norm_bias": None, "eps": 0.0}
    if module is None:
        return spec
    if isinstance(module, nn.LayerNorm):
        spec["norm"] = "layernorm"
        spec["eps"] = float(module.eps)
    elif type(module).__name__.endswith("RMSNorm") or isinstance(
        module, getattr(nn, "RMSNorm", ())
    ):
        eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
        spec["norm"] = "rmsnorm"
        spec["eps"] = float(eps) if eps is not None else float(torch.finfo(torch.float32).eps)
    else:
        raise InvalidArgument(f"final norm {type(module).__name__} is not supported by the lens")
    weight = getattr(module, "weight", None)
    bias = getattr(module, "bias", None)
    spec["norm_weight"] = (
        _np(weight) if isinstance(weight, torch.Tensor) else np.ones(width, dtype=np.float32)
    )
    if isinstance(bias, torch.Tensor):
        spec["norm_bias"] = _np(bias)
    return spec


def describe_lens_head(model: nn.Module, kind: str, digest: str) -> LensHead | None:
    """The head of ``model`` (a HF model of ``kind``, see ``introspection.decide_kind``) as a
    LensHead, or None for a bare backbone. A head this cannot describe raises InvalidArgument."""
    arch = type(model).__name__
    base = model.base_model
    if base is model:
        return None  # a bare backbone: no head
    pooler: dict[str, Any] = {}
    out_emb = model.get_output_embeddings() if kind == "causal-lm" else None
    if isinstance(out_emb, nn.Linear):
        linear = out_emb
        position, task = "every", "lm"
    else:
        module = find_head_module(model)
        if module is None:
            raise InvalidArgument(f"the lens does not support the head of {arch}")
        if isinstance(module, nn.Linear):
            linear = module
            base_pooler = getattr(base, "pooler", None)
            if base_pooler is not None:
                dense = getattr(base_pooler, "dense", None)
                act = _activation_name(getattr(base_pooler, "activation", nn.Identity()))
                if not isinstance(dense, nn.Linear) or act is None:
                    raise InvalidArgument(f"the lens does not support the pooler of {arch}")
                pooler = {"pooler_weight": _np(dense.weight), "pooler_bias": _np(dense.bias),
                          "pooler_activation": act}
        elif isinstance(getattr(module, "dense", None), nn.Linear) and isinstance(
            getattr(module, "out_proj", None), nn.Linear
        ):
            # RoBERTa-style classification head: dense -> tanh -> out_proj on the first token
            pooler = {"pooler_weight": _np(module.dense.weight), "pooler_bias": _np(module.dense.bias),
                      "pooler_activation": "tanh"}
            linear = module.out_proj
        else:
            raise InvalidArgument(f"the lens does not support the head of {arch}")
        task = "classifier"
        if arch.endswith("ForTokenClassification"):
            position = "every"
        elif kind == "causal-lm":
            position = "last"
        else:
            position = "cls"
    width = int(pooler["pooler_weight"].shape[1]) if pooler else int(linear.weight.shape[1])
    return LensHead(
        **_norm_spec(find_final_norm(base), width),
        weight=_np(linear.weight),
        bias=_np(linear.bias),
        **pooler,
        position=position,
        task=task,
        arch=arch,
        digest=digest,
    )


class TorchLensHead:
    """A LensHead's parameters as float32 tensors on ``device``; calling it maps (..., d) -> (..., C)
    float32 logits: ``z = W . act(P . norm(h) + p) + b``, exactly ``LensHead.logits``'s terms."""

    def __init__(self, head: LensHead, device: torch.device | str) -> None:
        self.head = head
        self.device = torch.device(device)

        def tensor(value: np.ndarray | None) -> torch.Tensor | None:
            return None if value is None else torch.as_tensor(value, dtype=torch.float32, device=self.device)

        self.norm_weight = tensor(head.norm_weight)
        self.norm_bias = tensor(head.norm_bias)
        self.pooler_weight = tensor(head.pooler_weight)
        self.pooler_bias = tensor(head.pooler_bias)
        self.weight = tensor(head.weight)
        self.bias = tensor(head.bias)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        head = self.head
        x = h.to(device=self.device, dtype=torch.float32)
        if head.norm == "layernorm":
            x = F.layer_norm(x, (x.shape[-1],), self.norm_weight, self.norm_bias, head.eps)
        elif head.norm == "rmsnorm":
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + head.eps) * self.norm_weight
            if self.norm_bias is not None:
                x = x + self.norm_bias
        if self.pooler_weight is not None:
            x = _ACTIVATIONS[head.pooler_activation](F.linear(x, self.pooler_weight, self.pooler_bias))
        return F.linear(x, self.weight, self.bias)
