"""One-byte coding where the forward ran: the int8 codes of `store.format.quantised`, in torch, on the
tensor's own device (a GPU replica codes on the GPU, so only one byte a value and the small
per-channel state cross to the host; a CPU replica codes on the CPU with the same calls).

The same operations in the same order as numpy's `store.format.quantised.encode` (float32 min/max,
step, offset, `(x - offset) / step`, the stochastic rounding against the draws, clamp), so both
give the same bits for the same draws; the draws come from torch's generator on the tensor's
device, seeded per (run, shard) (`quantised.rounding_seed`): the same bits again for the same
seed on the same device. The decode is a float32 multiply then add, two kernels, never a fused
multiply-add.
"""

from __future__ import annotations

import torch

from actstore.store.format.quantised import CODE_LEVELS, CODE_MAX, CODE_MIN, CODE_SHIFT


def rounding_draws(shape: tuple[int, ...], seed: int, device: torch.device) -> torch.Tensor:
    """float32 uniforms in [0, 1) of ``shape`` on ``device``, from a generator seeded with ``seed``."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return torch.rand(shape, generator=generator, device=device, dtype=torch.float32)


def quantise(part: torch.Tensor, draws: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes int8 (L+1, rows, d), state float32 (2, L+1, d)) of one shard's exact values ``part``
    (L+1, rows, d; float32 or wider, any device), rounded stochastically by ``draws`` (uniforms of
    its shape, on its device: `rounding_draws`). Non-finite values must be refused before."""
    values = part.to(torch.float32)
    lo, hi = values.amin(dim=1), values.amax(dim=1)
    step = (hi - lo) / CODE_LEVELS
    offset = torch.where(step > 0, lo + CODE_SHIFT * step, lo)
    safe = torch.where(step > 0, step, torch.ones_like(step))
    scaled = (values - offset[:, None]) / safe[:, None]
    below = torch.floor(scaled)
    codes = (below + (draws < scaled - below)).clamp_(CODE_MIN, CODE_MAX)
    codes = torch.where(step[:, None] > 0, codes, 0.0)
    return codes.to(torch.int8), torch.stack([step, offset])


def dequantise(codes: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """float32 values (L+1, rows, d) of ``codes`` (L+1, rows, d) with ``state`` (2, L+1, d)."""
    out = codes.to(torch.float32) * state[0][:, None]
    return out + state[1][:, None]
