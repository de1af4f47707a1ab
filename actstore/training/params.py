"""Table 1 of "Tracing Representation Progression": parameters of a multi-exit model with one
classifier per layer versus one shared classifier.

    single   = the parameters of the model with its one head (tied weights counted once)
    multiple = single + (L - 1) * d * C

The multi-exit model adds a classifier at each of the L - 1 earlier exits. What the paper's
numbers assume (checked against its rows in ``tests/training/test_params.py``):

- the extra exits are counted as weight matrices only, ``d x C`` without a bias: DeiT-S gives
  22,050,664 + 11 * 384 * 1000 = 26,274,664 = "26.27M" (with biases it would be 26.29M), and
  DeiT-B 95.02M likewise;
- the "saving" is ``(multiple - single) / multiple``, printed truncated, not rounded, to two
  decimals (DeiT-S 16.076% is printed "16.07%", GPT-2 78.396% "78.39%");
- for GPT-2 (and GPT-3, LLaMA-2) the multiple-classifier column starts from the model's
  nominal size, not from the single-classifier column: 117M + 11 * 768 * 50,257 = 541.57M
  ("541.57M" in the paper), while the single-classifier column prints 117.35M. A Hugging Face
  ``GPT2LMHeadModel(GPT2Config())`` has 124,439,808 parameters (tied embeddings); the paper's
  117.35M matches neither that nor the nominal 117M (it equals an 11-block GPT-2: 117,350,400).
  ``single_params`` lets a caller pass the nominal count to reproduce such a row.

The model is instantiated on the ``meta`` device, so even a GPT-3-sized config costs no memory.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from actstore.errors import InvalidArgument

__all__ = ["ParamCounts", "count_parameters", "multi_exit_params", "truncate_percent"]


@dataclass(frozen=True)
class ParamCounts:
    hidden_size: int
    num_classes: int
    num_layers: int
    single: int  # one shared classifier
    multiple: int  # one classifier per layer
    extra_per_exit: int  # parameters of one extra exit classifier

    @property
    def saved(self) -> int:
        return self.multiple - self.single

    @property
    def saving(self) -> float:
        """Fraction of the multi-classifier model's parameters saved by one classifier."""
        return self.saved / self.multiple

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "saved": self.saved, "saving": self.saving}


def truncate_percent(fraction: float, decimals: int = 2) -> float:
    """A fraction as a percentage truncated to ``decimals`` (the paper's Table 1 printing)."""
    scale = 10**decimals
    return int(fraction * 100 * scale + 1e-9) / scale


def _model_class(config: Any, task: str | None) -> Any:
    import transformers
    from transformers.models.auto import modeling_auto as ma

    model_type = getattr(config, "model_type", None)
    tasks = {
        "causal-lm": ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        "image-classification": ma.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES,
        "sequence-classification": ma.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
    }
    if task is not None and task not in tasks:
        raise InvalidArgument(f"unknown task {task!r}; use one of {', '.join(tasks)}")
    order = [task] if task else list(tasks)
    for t in order:
        name = tasks[t].get(model_type)
        if name:
            return getattr(transformers, name)
    raise InvalidArgument(f"no {task or 'head'} model class for config type {model_type!r}")


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (a tied tensor counts once)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():  # parameters() already deduplicates shared Parameters
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def multi_exit_params(
    config: Any,
    *,
    task: str | None = None,
    extra_bias: bool = False,
    single_params: int | None = None,
) -> ParamCounts:
    """Parameter counts of a single-classifier vs a multi-classifier multi-exit model.

    ``config`` is any transformers config; the model class is the causal LM for the config type,
    else the image classifier, else the sequence classifier (or ``task``: "causal-lm",
    "image-classification", "sequence-classification"). d is ``hidden_size``, C the vocabulary
    for an LM and ``num_labels`` otherwise, L ``num_hidden_layers``. ``extra_bias`` counts a bias
    per extra exit (the paper does not). ``single_params`` overrides the counted model size (for
    rows the paper computes from a nominal size).
    """
    cls = _model_class(config, task)
    d = int(config.hidden_size)
    L = int(config.num_hidden_layers)
    if single_params is None:
        with torch.device("meta"):
            model = cls(config)
        single = count_parameters(model)
        head = model.get_output_embeddings()
        if head is None:
            head = getattr(model, "classifier", None) or getattr(model, "score", None)
        if not isinstance(head, torch.nn.Linear):
            raise InvalidArgument(f"cannot find the classifier of {cls.__name__}")
        C = int(head.weight.shape[0])
    else:
        single = int(single_params)
        is_lm = "CausalLM" in cls.__name__ or "LMHead" in cls.__name__
        C = int(config.vocab_size if is_lm else config.num_labels)
    extra = d * C + (C if extra_bias else 0)
    return ParamCounts(
        hidden_size=d,
        num_classes=C,
        num_layers=L,
        single=single,
        multiple=single + (L - 1) * extra,
        extra_per_exit=extra,
    )
