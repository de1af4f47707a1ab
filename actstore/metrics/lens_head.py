"""The lens head: a model's final norm, optional pooler and classifier or unembedding, as plain
arrays (the one typed head the metric, the workers and storage share).

    logits = head(norm(h)),  norm = LayerNorm (with bias) or RMSNorm (scale, and bias if the model
    has one) or none; a pooler (dense + tanh/relu/gelu) first where the classifier reads one.

Source: "Tracing Representation Progression" sec. 2.2 (the logit lens applies the final norm and
the shared head to every layer); METRICS.md, "Logit lens, saturation and depth".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from ._numerics import as_float64_matrix

NORMS = ("layernorm", "rmsnorm", "none")
POOLER_ACTIVATIONS = ("tanh", "relu", "gelu")
POSITIONS = ("every", "cls", "last")
TASKS = ("lm", "classifier")


def _gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU `x * Phi(x)` (torch's default, approximate='none'), elementwise in float64."""
    erf = np.frompyfunc(math.erf, 1, 1)
    return x * 0.5 * (1.0 + erf(x / math.sqrt(2.0)).astype(np.float64))


_POOLER_FUNCTIONS = {"tanh": np.tanh, "relu": lambda x: np.maximum(x, 0.0), "gelu": _gelu}


@dataclass(frozen=True, eq=False)
class LensHead:
    """The model's head applied to any layer: `z = W · act(P · norm(h) + p) + b` (METRICS.md,
    "Lens logits"); without the pooler term `act(P · + p)` when `pooler_weight` is None.

    norm:
      - "layernorm" (GPT-2, BERT, ViT): `(h - mean(h)) / sqrt(var(h) + eps) * norm_weight
        + norm_bias`, with the biased variance over the d features
        (torch.nn.functional.layer_norm).
      - "rmsnorm" (Llama): `h / sqrt(mean(h^2) + eps) * norm_weight (+ norm_bias)`. No Hugging
        Face RMSNorm has a bias today (nor has torch.nn.RMSNorm); one that has adds it after the
        scale, as a LayerNorm does. Models whose RMSNorm scales by (1 + w) (Gemma) pass
        `norm_weight = 1 + w`.
      - "none": `h` as is (norm_weight and norm_bias are None).
    A norm without a learned scale passes `norm_weight = ones(d)`.

    pooler_weight P (d', d), pooler_bias p (d',) or None, pooler_activation ("tanh" | "relu" |
    "gelu"): a dense layer + activation between the stream and the classifier (BERT's pooler,
    RoBERTa's classification head); all None otherwise.
    weight W is (C, d) (or (C, d') after a pooler), bias b is (C,) or None.

    Which activations the head reads (the caller pools them, this class does not): position
    "every" (each token, as in LMs and token classifiers), "cls" (position 0) or "last" (the last
    non-pad token, as in decoder classifiers). task: "lm" (next-token unembedding) or
    "classifier". arch and digest name the model the head was taken from (provenance only).

    Arrays keep their floating dtype (a float32 model's 49k x d unembedding stays float32, half
    the memory); `logits` computes in float64.

    HF trap: for GPT-2 and Llama-style models `hidden_states[L]` already has the final norm
    applied, so lens layer L must be fed the pre-norm block output (or use a head with
    norm="none" for that layer) to reproduce the model's own logits.
    """

    norm: Literal["layernorm", "rmsnorm", "none"]
    norm_weight: np.ndarray | None
    norm_bias: np.ndarray | None
    eps: float
    weight: np.ndarray
    bias: np.ndarray | None = None
    pooler_weight: np.ndarray | None = None
    pooler_bias: np.ndarray | None = None
    pooler_activation: Literal["tanh", "relu", "gelu"] | None = None
    position: Literal["every", "cls", "last"] = "every"
    task: Literal["lm", "classifier"] = "lm"
    arch: str = ""
    digest: str = ""

    def __post_init__(self) -> None:
        if self.norm not in NORMS:
            raise ValueError(f"norm must be 'layernorm', 'rmsnorm' or 'none', got {self.norm!r}")
        if (self.norm == "none") != (self.norm_weight is None):
            raise ValueError(
                "norm_weight is required for layernorm/rmsnorm, and None for norm='none'"
            )
        if self.norm_bias is not None and self.norm == "none":
            raise ValueError("norm_bias must be None for norm='none'")
        if (self.pooler_weight is None) != (self.pooler_activation is None):
            raise ValueError("pooler_weight and pooler_activation go together")
        if self.pooler_activation is not None and self.pooler_activation not in POOLER_ACTIVATIONS:
            raise ValueError(
                f"pooler_activation must be one of {', '.join(POOLER_ACTIVATIONS)}, "
                f"got {self.pooler_activation!r}"
            )
        if self.pooler_bias is not None and self.pooler_weight is None:
            raise ValueError("pooler_bias needs a pooler_weight")
        if self.position not in POSITIONS:
            raise ValueError(f"position must be one of {', '.join(POSITIONS)}, got {self.position!r}")
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, got {self.task!r}")
        object.__setattr__(self, "eps", float(self.eps))
        weight = _float_array(self.weight, "weight", 2)
        object.__setattr__(self, "weight", weight)
        num_classes, width = weight.shape
        if self.pooler_weight is not None:
            pooler = _float_array(self.pooler_weight, "pooler_weight", 2)
            if pooler.shape[0] != width:
                raise ValueError(
                    f"pooler_weight must have {width} rows (the classifier's input), "
                    f"got shape {pooler.shape}"
                )
            object.__setattr__(self, "pooler_weight", pooler)
            width = pooler.shape[1]
        for name, shape in (
            ("norm_weight", (width,)),
            ("norm_bias", (width,)),
            ("pooler_bias", (weight.shape[1],)),
            ("bias", (num_classes,)),
        ):
            value = getattr(self, name)
            if value is not None:
                value = _float_array(value, name, 1)
                if value.shape != shape:
                    raise ValueError(f"{name} must have shape {shape}, got {value.shape}")
                object.__setattr__(self, name, value)

    @property
    def num_classes(self) -> int:
        """C: the number of logits (the vocabulary for an LM)."""
        return int(self.weight.shape[0])

    @property
    def width(self) -> int:
        """d: the width of the activations the head reads."""
        pooler = self.pooler_weight
        return int((pooler if pooler is not None else self.weight).shape[1])

    def with_classifier(self, weight: np.ndarray, bias: np.ndarray | None, digest: str = "") -> LensHead:
        """The same norm and pooler with another final linear map (a multi-exit model's exit)."""
        return replace(self, weight=weight, bias=bias, digest=digest or self.digest)

    def logits(self, h: np.ndarray) -> np.ndarray:
        """(n, C) float64 lens logits of the (n, d) activations `h`."""
        x = as_float64_matrix(h, "h")
        if x.shape[1] != self.width:
            raise ValueError(f"h has {x.shape[1]} features, the head expects {self.width}")
        if self.norm == "layernorm":
            x = x - x.mean(axis=1, keepdims=True)
        if self.norm != "none":
            x = x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + self.eps) * self.norm_weight
        if self.norm_bias is not None:
            x = x + self.norm_bias
        if self.pooler_weight is not None:
            x = x @ self.pooler_weight.T.astype(np.float64, copy=False)
            if self.pooler_bias is not None:
                x = x + self.pooler_bias
            x = _POOLER_FUNCTIONS[self.pooler_activation](x)
        z = x @ self.weight.T.astype(np.float64, copy=False)
        return z if self.bias is None else z + self.bias


def _float_array(value: np.ndarray, name: str, ndim: int) -> np.ndarray:
    """`value` as a float32 or float64 array (other dtypes become float64), checked for ndim."""
    array = np.asarray(value)
    if array.dtype.kind not in "fiu":
        raise TypeError(f"{name} must hold real numbers, got dtype {array.dtype}")
    if array.dtype not in (np.float32, np.float64):
        array = array.astype(np.float64)
    if array.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {array.shape}")
    return array
