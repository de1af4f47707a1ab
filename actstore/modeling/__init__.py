"""Models: where they come from, what they are made of, and one uniform view of them.

Modules (each importable on its own):

- ``sources``: ``BUILTIN_MODELS``, ``resolve_model_source`` (builtin name or local folder -> a
  Hugging Face folder; the GGUF dequantisation cache). No torch on import.
- ``loading``: ``load_folder``, a strict float32 / eval-mode load of a Hugging Face folder.
- ``introspection``: ``model_digest``, ``decide_kind``, ``find_blocks``, ``find_final_norm``,
  ``find_head_module``, ``replaced_layer``.
- ``pooling``: ``pool``, ``pool_tokens`` (the poolings of ``actstore.store.keys.POOLINGS``),
  ``token_positions`` (which tokens ``pool_tokens`` keeps).
- ``torch_lens``: ``describe_lens_head`` (a torch model's head as a ``metrics.lens.LensHead``) and
  ``TorchLensHead`` (that head applied in torch).
- ``adapter``: ``ModelAdapter`` and ``Batch``.

Layering: this package sits above ``actstore.store`` and ``actstore.metrics`` and below
``actstore.training`` and ``actstore.workers``; it never imports either of those.

The names below are re-exported lazily, so ``import actstore.modeling`` costs nothing and
``actstore.modeling.sources`` can be used without importing torch.
"""

from __future__ import annotations

import lazy_loader

__all__ = [
    "BUILTIN_MODELS",
    "Batch",
    "BuiltinModel",
    "ModelAdapter",
    "TorchLensHead",
    "describe_lens_head",
    "find_final_norm",
    "find_head_module",
    "model_digest",
    "pool",
    "pool_tokens",
    "resolve_model_source",
]

# lazy_loader: each name imports its module on first use
__getattr__, _, _ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "sources": ["BUILTIN_MODELS", "BuiltinModel", "resolve_model_source"],
        "introspection": ["find_final_norm", "find_head_module", "model_digest"],
        "pooling": ["pool", "pool_tokens"],
        "torch_lens": ["TorchLensHead", "describe_lens_head"],
        "adapter": ["Batch", "ModelAdapter"],
    },
)
