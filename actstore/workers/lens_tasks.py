"""The map side of lens queries: stored activations through the model's stored head.

Lens logits are computed in float32 with torch (the GEMM against a 49k-token unembedding is the
cost; argmax and max-softmax are robust to float32), on the task's GPU when Ray gave it one
(`task_device`). Labels:
pooled runs use the dataset labels; token-level runs of causal LMs use the next token of the same
prompt (a prompt's last token has none and is left out).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch

from actstore.metrics.lens import LensAccumulator
from actstore.metrics.lens_head import LensHead
from actstore.modeling.torch_lens import TorchLensHead
from actstore.store.format.damage import damaged
from actstore.store.handle import StoreHandle
from actstore.training import checkpoints
from actstore.workers.metric_tasks import task_device
from actstore.workers.registry import load_lens_head


@dataclass(frozen=True)
class LensPlan:
    store: StoreHandle
    run_key: str
    num_states: int
    model_path: str
    next_token: bool
    exit_heads: bool = False  # a multi-exit model's own classifier at each layer 1..L


def layer_heads(plan: LensPlan) -> list[LensHead]:
    """The head applied at each layer 0..L: the shared one, or (exit_heads) the model's per-layer
    classifiers on the shared final norm / pooler (layer 0 has no exit and keeps the shared head)."""
    model_path = plan.store.local(plan.model_path)
    head = load_lens_head(model_path)
    heads = [head] * plan.num_states
    if plan.exit_heads:
        for layer, (weight, bias) in (checkpoints.exit_heads(model_path) or {}).items():
            heads[layer] = head.with_classifier(weight, bias, digest=f"{head.digest}:exit{layer}")
    return heads


def next_token_labels(token_ids: np.ndarray, offsets: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Label of token row t in [start, stop): the id of row t+1 if it is in the same prompt, else -1.
    `token_ids` holds rows [start, stop + 1) (or to the end)."""
    rows = np.arange(start, stop)
    prompt_end = offsets[np.searchsorted(offsets, rows, side="right")]
    labels = np.full(stop - start, -1, dtype=np.int64)
    has_next = rows + 1 < prompt_end
    following = np.append(token_ids[1:], -1)[: stop - start]  # the run's last row has no next token
    labels[has_next] = following[has_next]
    return labels


@torch.no_grad()
def lens_partial(plan: LensPlan, ranges: list[tuple[int, int]], labels: np.ndarray | None,
                 accumulator: LensAccumulator, sub_rows: int = 256, device_policy: str = "cpu") -> LensAccumulator:
    arrays = plan.store.open()
    heads = layer_heads(plan)
    device = torch.device(task_device(device_policy) or "cpu")  # the lens is torch either way
    applied = {id(head): TorchLensHead(head, device) for head in heads}  # the shared head once
    accumulator = copy.deepcopy(accumulator)
    offsets = arrays.offsets(plan.run_key) if plan.next_token else None
    layers = list(range(plan.num_states))
    for range_start, range_stop in ranges:
        for start in range(range_start, range_stop, sub_rows):
            stop = min(start + sub_rows, range_stop)
            if plan.next_token:
                ids = arrays.token_ids(plan.run_key, start, min(stop + 1, int(offsets[-1])))
                if (ids < 0).any():  # never written (the fill value): a causal LM's run has an id for every row
                    shard = (start + int(np.argmax(ids < 0))) // arrays.layout(plan.run_key).shard_rows
                    raise damaged(plan.run_key, "token_ids", "is missing from the store", shard=shard)
                chunk_labels = next_token_labels(ids, offsets, start, stop)
            else:
                chunk_labels = labels[start:stop]
            keep = chunk_labels >= 0
            if not keep.any():
                continue
            hidden = torch.from_numpy(arrays.read_layers(plan.run_key, layers, start, stop)[:, keep]).to(device)
            logits = torch.stack([applied[id(heads[layer])](hidden[layer]) for layer in layers])
            confidence, predicted = torch.softmax(logits.double(), dim=-1).max(dim=-1)
            accumulator.update(predicted.cpu().numpy(), confidence.cpu().numpy(), chunk_labels[keep])
    return accumulator
