"""Pooling of the residual stream: (L+1, b, s, d) hidden states -> what a run stores.

The pooling names are ``actstore.store.keys.POOLINGS`` (they are part of the run key): every one
but "tokens" gives one vector per sample (``pool``); "tokens" keeps every non-pad token
(``pool_tokens``). Pure tensor functions, also exposed as ``ModelAdapter.pool`` / ``pool_tokens``.
"""

from __future__ import annotations

import numpy as np
import torch

from actstore.errors import InvalidArgument
from actstore.store.keys import POOLINGS

__all__ = ["TOKEN_POOLING", "VECTOR_POOLINGS", "pool", "pool_tokens"]

TOKEN_POOLING = "tokens"
VECTOR_POOLINGS = tuple(p for p in POOLINGS if p != TOKEN_POOLING)  # one vector per sample


def _full_mask(hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if hidden.dim() != 4:
        raise InvalidArgument(
            f"hidden must be (L+1, batch, seq, d), got shape {tuple(hidden.shape)}"
        )
    _, b, s, _ = hidden.shape
    if mask is None:
        return torch.ones(b, s, dtype=torch.bool, device=hidden.device)
    if tuple(mask.shape) != (b, s):
        raise InvalidArgument(
            f"mask shape {tuple(mask.shape)} does not match hidden (batch={b}, seq={s})"
        )
    mask = mask.to(device=hidden.device).bool()
    empty = (~mask.any(dim=1)).nonzero().flatten()
    if len(empty):
        raise InvalidArgument(f"samples {empty.tolist()} have no tokens in the mask")
    return mask


def pool(hidden: torch.Tensor, mask: torch.Tensor | None, pooling: str) -> torch.Tensor:
    """(L+1, b, s, d) -> (L+1, b, d).

    cls: position 0. last: the last position whose mask is 1, per sample (any padding side).
    mean: the masked mean over positions. ``mask=None`` means every position counts (vision).
    """
    m = _full_mask(hidden, mask)
    if pooling == TOKEN_POOLING:
        raise InvalidArgument("pooling 'tokens' keeps every token: use pool_tokens(hidden, mask)")
    if pooling not in VECTOR_POOLINGS:
        raise InvalidArgument(f"unknown pooling {pooling!r}; use one of {', '.join(POOLINGS)}")
    if pooling == "cls":
        return hidden[:, :, 0, :]
    if pooling == "last":
        s = hidden.shape[2]
        last = s - 1 - m.flip(dims=[1]).long().argmax(dim=1)  # (b,)
        idx = last.view(1, -1, 1, 1).expand(hidden.shape[0], -1, 1, hidden.shape[3])
        return hidden.gather(2, idx).squeeze(2)
    # mean
    w = m.to(hidden.dtype)  # (b, s)
    total = torch.einsum("lbsd,bs->lbd", hidden, w)
    return total / w.sum(dim=1).view(1, -1, 1)


def pool_tokens(hidden: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, np.ndarray]:
    """(L+1, b, s, d) -> ((L+1, T, d), counts (b,) int64): the non-pad tokens of every sample,
    concatenated in sample order then position order; T = counts.sum()."""
    m = _full_mask(hidden, mask)
    counts = m.sum(dim=1).to("cpu").numpy().astype(np.int64)
    b_idx, s_idx = m.nonzero(as_tuple=True)  # row-major: sample order, then position order
    return hidden[:, b_idx, s_idx, :], counts
