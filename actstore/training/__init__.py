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

import lazy_loader

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

# lazy_loader: each name imports its module on first use
__getattr__, _, _ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "recipes": ["RECIPES", "Recipe", "get_recipe"],
        "loop": ["TrainResult", "train"],
        "checkpoints": ["exit_heads", "list_checkpoints"],
        "objectives": ["layer_weights", "objective_for_step", "training_loss"],
        "params": ["ParamCounts", "multi_exit_params"],
    },
)
