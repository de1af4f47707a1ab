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

__all__ = ["TOKEN_POOLING", "VECTOR_POOLINGS", "pool", "pool_tokens", "token_positions"]

TOKEN_POOLING = "tokens"
VECTOR_POOLINGS = tuple(p for p in POOLINGS if p != TOKEN_POOLING)  # one vector per sample


def _check_hidden(hidden: torch.Tensor) -> None:
    if hidden.dim() != 4:
        raise InvalidArgument(
            f"hidden must be (L+1, batch, seq, d), got shape {tuple(hidden.shape)}"
        )


def _full_mask(hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    _check_hidden(hidden)
    return _batch_mask(mask, hidden.shape[1], hidden.shape[2], hidden.device)


def _batch_mask(mask: torch.Tensor | None, b: int, s: int, device: torch.device) -> torch.Tensor:
    if mask is None:
        return torch.ones(b, s, dtype=torch.bool, device=device)
    if tuple(mask.shape) != (b, s):
        raise InvalidArgument(
            f"mask shape {tuple(mask.shape)} does not match hidden (batch={b}, seq={s})"
        )
    mask = mask.to(device=device).bool()
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
    _check_hidden(hidden)
    b_idx, s_idx, counts = token_positions(mask, hidden.shape[1], hidden.shape[2], hidden.device)
    return hidden[:, b_idx, s_idx, :], counts


def token_positions(mask: torch.Tensor | None, b: int, s: int, device: torch.device
                    ) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """The (sample, position) indices of the tokens `pool_tokens` keeps of a (b, s) batch, in its
    order, and each sample's count: for taking the tokens out of one (b, s, d) layer at a time."""
    m = _batch_mask(mask, b, s, device)
    counts = m.sum(dim=1).to("cpu").numpy().astype(np.int64)
    b_idx, s_idx = m.nonzero(as_tuple=True)  # row-major: sample order, then position order
    return b_idx, s_idx, counts
