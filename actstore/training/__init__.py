"""Training: standard vs aligned transformers ("Tracing Representation Progression").

Public API:

- ``train(recipe, method, seed, steps, out_dir=..., progress=..., device=..., resume=...,
  alternating=..., weights=...) -> TrainResult`` (``loop``): one loop, atomic resumable
  Hugging Face checkpoints ``out_dir/step-<k>/`` with ``lineage.json``.
- ``Recipe``, ``RECIPES``, ``get_recipe(name, smoke=False)`` (``recipes``): ``vit-fmnist``,
  ``minilm-rt``, ``gpt2-austen``.
- ``METHODS``, ``layer_weights``, ``training_loss``, ``objective_for_step``, ... (``objectives``).
- ``exit_heads(model_dir)``, ``list_checkpoints(out_dir)`` (``checkpoints``): a multi-exit
  checkpoint's per-layer classifiers; the checkpoints of an output folder.
- ``multi_exit_params(config)`` (``params``): the paper's Table 1 for any config.

Heavy imports (torch, transformers) happen when these names are used, not on import of this
package, so the CLI can list recipes and methods cheaply.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "METHODS",
    "RECIPES",
    "WEIGHT_SCHEMES",
    "ParamCounts",
    "Recipe",
    "TrainResult",
    "exit_heads",
    "get_recipe",
    "layer_weights",
    "list_checkpoints",
    "multi_exit_params",
    "objective_for_step",
    "train",
    "training_loss",
]

METHODS = ("standard", "aligned", "multi-exit", "ce-reg")
WEIGHT_SCHEMES = ("linear", "uniform")

_LAZY = {
    "RECIPES": "recipes",
    "Recipe": "recipes",
    "get_recipe": "recipes",
    "TrainResult": "loop",
    "exit_heads": "checkpoints",
    "list_checkpoints": "checkpoints",
    "train": "loop",
    "layer_weights": "objectives",
    "objective_for_step": "objectives",
    "training_loss": "objectives",
    "ParamCounts": "params",
    "multi_exit_params": "params",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'actstore.training' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"actstore.training.{module}"), name)
    globals()[name] = value
    return value
