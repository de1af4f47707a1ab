"""Token-level run layouts: how many token rows each prompt of a dataset owns, and where each token
lies in its text, from the model's tokenizer alone.

The texts come from `store.datasets`, the tokenizer from `modeling.tokens` (transformers'
AutoTokenizer, which imports torch: a `TokenLayouts` process's first layout takes ~2 s here).
"""

from __future__ import annotations

import numpy as np
from cachetools import LRUCache

from actstore.errors import InvalidArgument
from actstore.modeling.tokens import LOAD_HINT, load_tokenizer, token_layout
from actstore.store.datasets import load_dataset
from actstore.store.handle import StoreHandle

TOKENIZERS_KEPT = 8  # models whose tokenizer a `TokenLayouts` keeps loaded


class TokenLayouts:
    """Token-level run layouts, from one warm process per server (an actor of no logical CPU, that
    `server.capture_pool` starts): the tokenizers it loaded stay loaded, so a layout costs its
    tokenisation alone. As a one-CPU Ray task, a layout ran on whichever worker was free, and
    right after a capture that was a shard writer that had never tokenised: it paid the
    tokenizer's imports first (0.8 s on this 2-core machine; 7.5 s, and once over 50 s, on a
    16-core GPU node), and it needed a free CPU, which the writers may all hold."""

    def __init__(self, store: StoreHandle) -> None:
        self.store = store
        self._tokenizers: LRUCache = LRUCache(maxsize=TOKENIZERS_KEPT)

    def rows(self, model_path: str, dataset_path: str, max_len: int, spans: bool = True
             ) -> tuple[np.ndarray, np.ndarray | None]:
        """A token-level run's offsets (prompt i owns token rows offsets[i]:offsets[i+1]) and every
        row's character span in its text (`modeling.tokens`; None without ``spans`` or a fast
        tokenizer), from the model's tokenizer alone."""
        tokenizer = self._tokenizers.get(model_path)
        if tokenizer is None:
            tokenizer = load_tokenizer(self.store.local(model_path), LOAD_HINT)
            if tokenizer is None:
                raise InvalidArgument("a token-level capture needs a text model with a tokenizer; this model has none")
            self._tokenizers[model_path] = tokenizer
        data = load_dataset(self.store.local(dataset_path))
        if data.kind != "text":
            raise InvalidArgument("a token-level capture needs a text dataset")
        counts, char_spans = token_layout(tokenizer, data.texts, max_len, spans)
        return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), char_spans
