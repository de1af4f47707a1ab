"""A text dataset's token layout from the tokenizer alone: tokens per text and each token's
character span, as a token-level capture cuts its rows.

A token-level capture needs both before its first forward pass (the run's row count and
offsets, and the spans for cross-tokenizer alignment). They once came from two tasks that each
loaded the whole model (weights and digest, ~2.4 s CPU for MiniLM) and tokenised every text;
the tokenizer alone loads in a fraction of that, and one call with the offset mapping gives
both. The rows are `ModelAdapter.encode`'s: the same tokenizer, right truncation at ``max_len``,
special tokens included.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from actstore.errors import InvalidArgument

__all__ = ["LOAD_HINT", "TOKENIZER_FILES", "load_tokenizer", "token_layout"]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt")


# what to do about a model folder that cannot be loaded (here and in `modeling.loading`)
LOAD_HINT = (
    "pass a local Hugging Face model folder saved with save_pretrained (config.json with "
    "'architectures', complete model.safetensors, and a tokenizer for text models)"
)


def load_tokenizer(path: Path, hint: str) -> Any | None:
    """The tokenizer of the model folder ``path`` (None when it has none), truncating on the right;
    a broken one raises InvalidArgument ending with ``hint``."""
    from transformers import AutoTokenizer

    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        return None
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # a boundary: every reason becomes InvalidArgument
        raise InvalidArgument(f"cannot load the tokenizer in {path} ({type(exc).__name__}: {exc}); {hint}") from exc
    tokenizer.truncation_side = "right"
    return tokenizer


def token_layout(tokenizer: Any, texts: Sequence[str], max_len: int, spans: bool = True
                 ) -> tuple[np.ndarray, np.ndarray | None]:
    """(tokens per text (n,) int64, every token's character span [start, end) (tokens, 2) int32 in
    row order, (0, 0) for special tokens; None without ``spans`` or a fast tokenizer), from one
    tokenisation without padding."""
    offsets = spans and getattr(tokenizer, "is_fast", False)
    enc = tokenizer(list(texts), padding=False, truncation=True, max_length=max_len, return_offsets_mapping=offsets)
    counts = np.array([len(ids) for ids in enc["input_ids"]], dtype=np.int64)
    if not offsets:
        return counts, None
    flat = [span for per_text in enc["offset_mapping"] for span in per_text]
    return counts, np.asarray(flat, dtype=np.int32).reshape(-1, 2)
