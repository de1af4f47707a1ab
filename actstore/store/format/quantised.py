"""One-byte storage (`--dtype int8`): what the stored codes mean, and their numpy coding.

Each shard of an int8 run stores, per layer and channel, an affine code of the exact value:

    value = code * step + offset          code: int8 in [-128, 127]; step, offset: float32

with `step` and `offset` fixed per (shard, layer, channel) from that shard's own rows, by the
writer, where the forward ran: `step = (hi - lo) / 255`, `offset = lo + 128 * step` (lo, hi the
least and largest exact value of the channel in the shard), so the 256 codes span the shard's
range of the channel; a channel constant in the shard has step 0 and offset its value, exactly.

The rounding is stochastic (Gupta et al. 2015, "Deep learning with limited numerical precision"):
a value between two codes takes the upper one with probability its distance from the lower one,
in steps, drawn from uniforms seeded per (run, shard) (`rounding_seed`), so every value is off by
less than one step, its error has mean zero, and the errors of all values are independent of
each other given the exact values. That error model is what the statistical bound of
`metrics.rounding` rests on (Hoeffding's inequality for the sum of independent variables each in
an interval one step wide); round to nearest would halve the error of each value but make it a
function of the value, for which only the deterministic bound holds. The draws are 24-bit
uniforms, so a rounding probability is off by at most 2^-24 (and the float32 coding by an ulp):
`metrics.rounding` counts both as a bias. Scaling per channel puts a massive outlier dimension on
its own grid, and per shard a streaming writer needs no pass over the run before it writes
(measured on real activations, docs/one-byte-storage.md: a step per channel and shard rounds
MiniLM-L6 and SmolLM2-135M less than one step per channel for the whole run, affine codes less
than symmetric ones, and both far less than float8 e4m3).

The run's arrays (`store.format.arrays`): the activation array (`acts` or `tokens`) holds the codes,
int8, chunked and checksummed as every dtype; beside it `scales`, float32 of shape
(num_shards, 2, L+1, d), one chunk per shard with its crc32c: `scales[s, 0]` the steps and
`scales[s, 1]` the offsets of shard s (rows [s * S, (s + 1) * S), S the activation array's shard
rows). Plain zarr reads both; the values are

    x = g["acts"][:] * np.repeat(g["scales"][:, 0], S, 0)[:n] + np.repeat(g["scales"][:, 1], S, 0)[:n]

(`decode` below, for any rows). The multiply and the add are two float32 operations, in that
order, never fused: every reader (numpy, torch on any device) gets the same bits, the ones the
capture measured its error figures on. A reader needs no draws: they choose the codes, not what
a code means.
"""

from __future__ import annotations

import hashlib

import numpy as np

ONE_BYTE_DTYPES = ("int8",)
SCALES = "scales"  # the run's array of steps and offsets
CODE_LEVELS = 255  # the steps across one shard's range of a channel
CODE_MIN, CODE_MAX = -128, 127
CODE_SHIFT = 128  # lo's code is -CODE_SHIFT


def is_one_byte(dtype: str) -> bool:
    return dtype in ONE_BYTE_DTYPES


def decoding_state(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The (2, ...) float32 steps and offsets of channels whose exact values span [lo, hi]."""
    lo, hi = np.asarray(lo, np.float32), np.asarray(hi, np.float32)
    step = ((hi - lo) / np.float32(CODE_LEVELS)).astype(np.float32)
    offset = np.where(step > 0, lo + np.float32(CODE_SHIFT) * step, lo).astype(np.float32)
    return np.stack([step, offset])


def rounding_seed(run_key: str, shard: int) -> int:
    """The seed of a shard's rounding draws: 63 bits of blake2b of the run key and the shard, so
    runs and shards draw independently, and a shard written again (a retried task) gets the same
    bits as before."""
    digest = hashlib.blake2b(f"{run_key}/{shard}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def encode(layers: np.ndarray, state: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """int8 codes of the exact float32 ``layers`` (L+1, rows, d) with ``state`` (2, L+1, d),
    rounded stochastically by ``draws`` (float32 uniforms in [0, 1), the shape of ``layers``)."""
    step, offset = state[0][:, None], state[1][:, None]
    safe = np.where(step > 0, step, np.float32(1))
    scaled = (layers.astype(np.float32) - offset) / safe
    below = np.floor(scaled)
    codes = below + (draws < scaled - below)  # the fraction is exact in float32 (Sterbenz)
    codes = np.clip(codes, CODE_MIN, CODE_MAX)
    return np.where(step > 0, codes, 0).astype(np.int8)


def quantise(layers: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(codes int8 (L+1, rows, d), state (2, L+1, d) float32) of one shard's exact values
    (L+1, rows, d), numpy's version of the capture's torch coding (`workers.quantise`): the same
    bits for the same float32 values and draws; numpy draws its own (from ``seed``)."""
    values = np.asarray(layers, np.float32)
    state = decoding_state(values.min(axis=1), values.max(axis=1))
    draws = np.random.default_rng(seed).random(values.shape, dtype=np.float32)
    return encode(values, state, draws), state


def decode(codes: np.ndarray, state: np.ndarray, layer_axis: int = 0, out: np.ndarray | None = None) -> np.ndarray:
    """float32 values of one shard's codes: ``codes`` (L', rows, d) with ``state`` (2, L', d) of the
    same layers (``layer_axis`` 1: codes (rows, L', d)); into ``out`` (float32, codes' shape) if given."""
    out = np.empty(codes.shape, np.float32) if out is None else out
    if layer_axis == 1:
        np.multiply(codes, state[0], out=out)  # the int8 codes widen inside the multiply: one pass, then the add
        out += state[1]
        return out
    for layer, (step, offset) in enumerate(zip(state[0], state[1])):  # a layer at a time: in cache for the add
        np.multiply(codes[layer], step, out=out[layer])
        out[layer] += offset
    return out
