"""Training objectives: standard, aligned, multi-exit and CE + cosine regulariser.

The paper ("Tracing Representation Progression", Jiang, Zhou, Zhu 2024) applies the model's own
last-layer classifier ``W`` to every layer's representation ``h^(l)`` and trains with

    L_aligned(x, y) = sum_{l=1..L} lambda_l * CE(W h^(l), y)                         (eq. 5)

with ``lambda_l = 2 l / (L (L + 1))`` (linear, the default; sums to 1) or ``1 / L`` (uniform).

Conventions (the same as ``actstore.modeling.ModelAdapter``, so what is trained here is
what the lens measures later):

- ``residual_states(model, inputs)`` returns the L + 1 residual-stream states, with gradients:
  index 0 is the input of the first block (the embedding output), index l >= 1 the raw output of
  block l. Layer L is *before* the final norm (Hugging Face puts GPT-2's ``ln_f`` on its last
  ``hidden_states``; we do not).
- "The head" is everything between the residual stream and the logits, taken from the model
  itself (``head_parts``): the final norm (ViT ``layernorm``, GPT-2 ``ln_f``; BERT has none),
  BERT's pooler (dense + tanh on the CLS position) and its classifier dropout, then the
  classifier / unembedding. Classifiers read position 0 (CLS); causal LMs read every position and
  predict the next token (pads are ignored). ``head(h_L)`` is exactly the model's own logits.

Methods (``METHODS``):

- ``standard``: CE of the head on layer L (the model's ordinary loss).
- ``aligned``: eq. 5 with the shared head.
- ``multi-exit``: eq. 5 with a separate classifier per layer l = 1..L-1 (``make_exit_heads``:
  an independent copy of the head's classifier ``nn.Linear``, taken at initialisation) and the
  model's own classifier at layer L. The norm and pooler stay shared: only the final linear map
  differs per exit (the parameter count of Table 1).
- ``ce-reg`` (Appendix B.3, "standard-Reg"): ``CE(W h^(L), y) + beta * L_sim`` with
  ``L_sim = sum_{l=1..L} lambda_l (1 - cos(h^(l), h^(L)))``. Implemented as written: the same
  ``lambda_l`` as the aligned loss, the term l = L included (it is 0), the plain cosine of the raw
  residual states at the head's position (CLS; every non-pad token for an LM, averaged), no
  centring and no stop-gradient, averaged over samples. The paper gives no value for beta;
  ``DEFAULT_BETA = 1.0`` (both terms are O(1) at initialisation).

Option ``alternating`` (the paper's ViT setup, after its ref. [30]): optimizer steps are numbered
1, 2, 3, ... (step t is the t-th parameter update of the run, counted across resumes). Odd steps
use the last-layer CE (``standard``); even steps use the method's own loss. For ``standard`` this
changes nothing. See ``objective_for_step``.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from actstore.errors import InvalidArgument
from actstore.modeling.introspection import find_final_norm, find_head_module
from actstore.training import METHODS, WEIGHT_SCHEMES

__all__ = [
    "DEFAULT_BETA",
    "IGNORE_INDEX",
    "METHODS",
    "WEIGHT_SCHEMES",
    "HeadParts",
    "LossOutput",
    "apply_head",
    "cosine_regulariser",
    "find_blocks",
    "head_parts",
    "head_position",
    "layer_logits",
    "layer_weights",
    "lm_targets",
    "make_exit_heads",
    "model_kind",
    "objective_for_step",
    "residual_states",
    "training_loss",
    "weighted_layer_ce",
]

DEFAULT_BETA = 1.0
IGNORE_INDEX = -100



# ---------------------------------------------------------------------------------------------
# Weights and the schedule
# ---------------------------------------------------------------------------------------------


def layer_weights(num_layers: int, scheme: str = "linear") -> torch.Tensor:
    """lambda_1..lambda_L as a float64 tensor of length L (index l-1 holds lambda_l).

    linear: ``lambda_l = 2 l / (L (L + 1))``; uniform: ``1 / L``. Both sum to 1.
    """
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise InvalidArgument(f"the number of layers must be a positive integer, got {num_layers!r}")
    L = num_layers
    if scheme == "linear":
        ls = torch.arange(1, L + 1, dtype=torch.float64)
        return 2.0 * ls / (L * (L + 1))
    if scheme == "uniform":
        return torch.full((L,), 1.0 / L, dtype=torch.float64)
    raise InvalidArgument(f"unknown layer weight scheme {scheme!r}; use one of {', '.join(WEIGHT_SCHEMES)}")


def check_method(method: str) -> str:
    if method not in METHODS:
        raise InvalidArgument(f"unknown training method {method!r}; use one of {', '.join(METHODS)}")
    return method


def objective_for_step(method: str, step: int, alternating: bool = False) -> str:
    """The objective used at optimizer step ``step`` (1-based: the first update is step 1).

    Without ``alternating`` it is ``method``. With it, odd steps (1, 3, 5, ...) use ``standard``
    (last-layer CE) and even steps (2, 4, ...) use ``method``.
    """
    check_method(method)
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise InvalidArgument(f"steps are numbered from 1, got {step!r}")
    if alternating and step % 2 == 1:
        return "standard"
    return method


# ---------------------------------------------------------------------------------------------
# The model: kind, blocks, head
# ---------------------------------------------------------------------------------------------


def model_kind(model: nn.Module) -> str:
    """"vision" | "encoder" | "causal-lm" (the ``ModelAdapter.kind`` vocabulary)."""
    if getattr(model, "main_input_name", "input_ids") == "pixel_values":
        return "vision"
    arch = type(model).__name__
    if arch.endswith(("LMHeadModel", "ForCausalLM")):
        return "causal-lm"
    return "encoder"


def find_blocks(model: nn.Module) -> nn.ModuleList:
    """The transformer blocks: the first ``nn.ModuleList`` of the base model with
    ``config.num_hidden_layers`` entries (the rule ``ModelAdapter`` uses)."""
    base = model.base_model
    n = int(model.config.num_hidden_layers)
    for _name, module in base.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) == n and n > 0:
            return module
    raise InvalidArgument(f"cannot find the {n} transformer blocks of {type(model).__name__}")


@dataclass
class HeadParts:
    """The model's own head, as live modules (so gradients flow into them)."""

    kind: str
    norm: nn.Module | None
    pooler_dense: nn.Linear | None
    pooler_activation: nn.Module | None
    dropout: nn.Module | None
    classifier: nn.Linear

    @property
    def position(self) -> str:
        return head_position(self.kind)


def head_position(kind: str) -> str:
    """"every" (causal LM: every token, next-token targets) or "cls" (position 0)."""
    return "every" if kind == "causal-lm" else "cls"


def head_parts(model: nn.Module) -> HeadParts:
    """Find the final norm, pooler, classifier dropout and classifier of a HF model."""
    kind = model_kind(model)
    base = model.base_model
    if base is model:
        raise InvalidArgument(f"{type(model).__name__} is a bare backbone: it has no head to train")
    norm = find_final_norm(base)
    pooler_dense = pooler_act = dropout = None
    if kind == "causal-lm":
        classifier = model.get_output_embeddings()
    else:
        classifier = find_head_module(model)
        pooler = getattr(base, "pooler", None)
        if pooler is not None:
            pooler_dense = getattr(pooler, "dense", None)
            pooler_act = getattr(pooler, "activation", None)
            if not isinstance(pooler_dense, nn.Linear) or not isinstance(pooler_act, nn.Module):
                raise InvalidArgument(f"the pooler of {type(model).__name__} is not supported")
        drop = getattr(model, "dropout", None)
        if isinstance(drop, nn.Dropout):
            dropout = drop
    if not isinstance(classifier, nn.Linear):
        raise InvalidArgument(f"the head of {type(model).__name__} is not supported for training")
    return HeadParts(
        kind=kind,
        norm=norm,
        pooler_dense=pooler_dense,
        pooler_activation=pooler_act,
        dropout=dropout,
        classifier=classifier,
    )


def apply_head(parts: HeadParts, h: torch.Tensor, classifier: nn.Module | None = None) -> torch.Tensor:
    """Logits of (..., d) residual vectors already taken at the head's position:
    ``classifier(dropout(act(P . norm(h) + p)))`` (pooler and dropout only where the model has
    them). ``classifier`` replaces the model's own one (a multi-exit head)."""
    x = parts.norm(h) if parts.norm is not None else h
    if parts.pooler_dense is not None:
        x = parts.pooler_activation(parts.pooler_dense(x))
    if parts.dropout is not None:
        x = parts.dropout(x)
    return (classifier if classifier is not None else parts.classifier)(x)


def make_exit_heads(model: nn.Module, parts: HeadParts | None = None) -> nn.ModuleDict:
    """Multi-exit classifiers for layers 1..L-1: independent copies of the model's classifier
    (same shape, same current values, their own parameters). Keys are ``str(l)``."""
    parts = parts if parts is not None else head_parts(model)
    L = int(model.config.num_hidden_layers)
    heads = nn.ModuleDict()
    for layer in range(1, L):
        head = copy.deepcopy(parts.classifier)
        head.requires_grad_(True)
        heads[str(layer)] = head
    return heads.to(parts.classifier.weight.device)


# ---------------------------------------------------------------------------------------------
# Forward: the residual stream with gradients
# ---------------------------------------------------------------------------------------------


def _forward_args(module: nn.Module) -> set[str]:
    params = inspect.signature(module.forward).parameters
    return {k for k, p in params.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


def residual_states(model: nn.Module, inputs: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
    """The L + 1 residual-stream states ``[(b, s, d)] * (L + 1)`` with autograd.

    Runs the base model (not the head) with hooks on the blocks: state 0 is the first block's
    input, state l the output of block l (layer L before the final norm). The model's mode
    (train / eval) decides dropout.
    """
    blocks = find_blocks(model)
    L = len(blocks)
    states: list[torch.Tensor | None] = [None] * (L + 1)

    def pre_hook(_m: nn.Module, args: tuple, kwargs: dict) -> None:
        x = args[0] if args else kwargs.get("hidden_states")
        states[0] = x

    def make_hook(i: int) -> Callable:
        def hook(_m: nn.Module, _args: tuple, output: Any) -> None:
            out = output[0] if isinstance(output, (tuple, list)) else output
            if hasattr(out, "last_hidden_state"):
                out = out.last_hidden_state
            states[i] = out

        return hook

    handles = [blocks[0].register_forward_pre_hook(pre_hook, with_kwargs=True)]
    handles += [blocks[i].register_forward_hook(make_hook(i + 1)) for i in range(L)]
    base = model.base_model
    kwargs = dict(inputs)
    if "use_cache" in _forward_args(base):
        kwargs["use_cache"] = False
    try:
        base(**kwargs)
    finally:
        for h in handles:
            h.remove()
    if any(not isinstance(s, torch.Tensor) for s in states):
        raise InvalidArgument(f"could not capture the residual stream of {type(model).__name__}")
    return states  # type: ignore[return-value]


def lm_targets(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Next-token targets (b, s-1): ``input_ids[:, 1:]``, with IGNORE_INDEX where the target
    token is padding."""
    targets = input_ids[:, 1:].clone()
    if attention_mask is not None:
        targets[attention_mask[:, 1:] == 0] = IGNORE_INDEX
    return targets


def _at_position(parts: HeadParts, state: torch.Tensor) -> torch.Tensor:
    # classifiers read the CLS position; an LM predicts token t+1 from every position t < s-1
    return state[:, :-1] if parts.kind == "causal-lm" else state[:, 0]


def layer_logits(
    parts: HeadParts, state: torch.Tensor, classifier: nn.Module | None = None
) -> torch.Tensor:
    """Head logits of one layer's state (b, s, d): (b, C) for classifiers, (b, s-1, V) for LMs
    (position t predicts token t+1)."""
    return apply_head(parts, _at_position(parts, state), classifier)


def _ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX
    )


def weighted_layer_ce(
    parts: HeadParts,
    states: Sequence[torch.Tensor],
    targets: torch.Tensor,
    weights: torch.Tensor,
    exit_heads: Mapping[str, nn.Module] | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``sum_{l=1..L} weights[l-1] * CE(head_l(h_l), y)`` and the per-layer CE values.
    ``head_l`` is the shared head, or ``exit_heads[str(l)]`` for l < L when given."""
    L = len(states) - 1
    total = states[-1].new_zeros(())
    per_layer = []
    for layer in range(1, L + 1):
        classifier = None
        if exit_heads is not None and layer < L:
            classifier = exit_heads[str(layer)]
        ce = _ce(layer_logits(parts, states[layer], classifier), targets)
        per_layer.append(ce)
        total = total + float(weights[layer - 1]) * ce
    return total, per_layer


def cosine_regulariser(
    parts: HeadParts,
    states: Sequence[torch.Tensor],
    weights: torch.Tensor,
    token_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """``L_sim = sum_{l=1..L} lambda_l (1 - cos(h_l, h_L))`` (Appendix B.3), averaged over the
    samples (CLS vectors) or, for an LM, over the non-pad tokens (``token_mask`` (b, s))."""
    L = len(states) - 1
    last = states[L]
    total = last.new_zeros(())
    for layer in range(1, L + 1):
        cos = F.cosine_similarity(states[layer], last, dim=-1)  # (b, s)
        if parts.kind == "causal-lm":
            if token_mask is None:
                mean_cos = cos.mean()
            else:
                m = token_mask.to(cos.dtype)
                mean_cos = (cos * m).sum() / m.sum()
        else:
            mean_cos = cos[:, 0].mean()
        total = total + float(weights[layer - 1]) * (1.0 - mean_cos)
    return total


# ---------------------------------------------------------------------------------------------
# The loss of one step
# ---------------------------------------------------------------------------------------------


@dataclass
class LossOutput:
    loss: torch.Tensor
    objective: str  # the objective actually used ("standard" on odd alternating steps)
    layer_ce: list[float] | None  # CE per layer 1..L when the objective computed them
    ce_last: float  # CE of the layer-L head
    regulariser: float | None = None  # L_sim for ce-reg


def training_loss(
    model: nn.Module,
    inputs: Mapping[str, torch.Tensor],
    labels: torch.Tensor | None,
    method: str,
    *,
    step: int = 1,
    alternating: bool = False,
    weights: str = "linear",
    exit_heads: Mapping[str, nn.Module] | None = None,
    beta: float = DEFAULT_BETA,
    parts: HeadParts | None = None,
) -> LossOutput:
    """The loss of one optimizer step (see the module docstring).

    ``inputs`` are the base model's keyword arguments; ``labels`` are class indices (b,) for a
    classifier and ignored for a causal LM (targets are the next tokens of ``input_ids``).
    ``exit_heads`` is required for ``multi-exit`` (``make_exit_heads``).
    """
    objective = objective_for_step(method, step, alternating)
    parts = parts if parts is not None else head_parts(model)
    if method == "multi-exit" and exit_heads is None:
        raise InvalidArgument("multi-exit training needs its exit heads (make_exit_heads)")
    if parts.kind == "causal-lm":
        targets = lm_targets(inputs["input_ids"], inputs.get("attention_mask"))
    else:
        if labels is None:
            raise InvalidArgument("a classifier needs labels")
        targets = labels
    states = residual_states(model, inputs)
    L = len(states) - 1
    lam = layer_weights(L, weights)
    if objective == "standard":
        ce = _ce(layer_logits(parts, states[L]), targets)
        return LossOutput(loss=ce, objective=objective, layer_ce=None, ce_last=float(ce.detach()))
    if objective in ("aligned", "multi-exit"):
        heads = exit_heads if objective == "multi-exit" else None
        loss, per_layer = weighted_layer_ce(parts, states, targets, lam, heads)
        return LossOutput(
            loss=loss,
            objective=objective,
            layer_ce=[float(x.detach()) for x in per_layer],
            ce_last=float(per_layer[-1].detach()),
        )
    # ce-reg
    ce = _ce(layer_logits(parts, states[L]), targets)
    reg = cosine_regulariser(parts, states, lam, inputs.get("attention_mask"))
    return LossOutput(
        loss=ce + beta * reg,
        objective=objective,
        layer_ce=None,
        ce_last=float(ce.detach()),
        regulariser=float(reg.detach()),
    )
