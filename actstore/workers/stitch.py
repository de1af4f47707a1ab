"""Model stitching (Brown et al. 2023), run as a Ray task.

Model f's layer i (from a stored token-level run) feeds model g's layer j through an affine map
phi, fitted by least squares on stored activations of the training prompts: `phi = [A, 1]^+ B`.
On held-out prompts, g runs with its hidden state j replaced by phi(A); the penalty is g's task
loss through the stitch minus g's own loss. Task loss: next-token cross-entropy for causal LMs,
the classifier's cross-entropy (with the dataset labels) for sequence classifiers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from actstore.errors import InvalidArgument
from actstore.modeling.adapter import ModelAdapter
from actstore.store.datasets import load_dataset
from actstore.store.handle import StoreHandle
from actstore.workers.metric_tasks import task_device


@dataclass(frozen=True)
class StitchPlan:
    store: StoreHandle
    run_a: str
    layer_a: int
    run_b: str
    layer_b: int
    model_b_path: str
    dataset_path: str
    max_len: int
    test_fraction: float
    seed: int
    batch_size: int = 16


def _prompt_rows(offsets: np.ndarray, prompts: np.ndarray) -> np.ndarray:
    return np.concatenate([np.arange(offsets[p], offsets[p + 1]) for p in prompts])


def fit_affine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares `[A, 1]^+ B` in float64: a (d_a + 1) x d_b matrix, the last row the bias."""
    design = np.hstack([a.astype(np.float64), np.ones((len(a), 1))])
    solution, *_ = np.linalg.lstsq(design, b.astype(np.float64), rcond=None)
    return solution


def _task_loss(adapter: ModelAdapter, batch, labels: torch.Tensor | None) -> tuple[float, int]:
    """(summed loss, count) of g's task on one batch: next-token CE for LMs, else classifier CE."""
    inputs = {k: v.to(adapter.device) for k, v in batch.inputs.items()}
    logits = adapter.model(**inputs).logits.float()
    if adapter.kind == "causal-lm":
        mask = batch.mask.to(adapter.device).bool()
        targets = inputs["input_ids"][:, 1:]
        keep = mask[:, 1:] & mask[:, :-1]
        loss = F.cross_entropy(logits[:, :-1][keep], targets[keep], reduction="sum")
        return float(loss), int(keep.sum())
    loss = F.cross_entropy(logits, labels.to(adapter.device), reduction="sum")
    return float(loss), len(labels)


@torch.no_grad()
def stitch_penalty(plan: StitchPlan, device_policy: str = "cpu") -> dict:
    """Fit the stitch on the host (float64 least squares), then run model B with and without it
    on the held-out prompts, on this task's GPU when Ray gave it one (`task_device`)."""
    arrays = plan.store.open()
    offsets = arrays.offsets(plan.run_a)
    n = len(offsets) - 1
    order = np.random.default_rng(plan.seed).permutation(n)
    n_test = max(1, int(round(plan.test_fraction * n)))
    if n - n_test < 2:
        raise InvalidArgument(f"{n} prompts leave too few for fitting the stitch with test_fraction "
                              f"{plan.test_fraction}")
    test, train = np.sort(order[:n_test]), np.sort(order[n_test:])
    rows = int(offsets[-1])
    source = arrays.read_layers(plan.run_a, [plan.layer_a], 0, rows)[0]
    target = arrays.read_layers(plan.run_b, [plan.layer_b], 0, rows)[0]
    train_rows, test_rows = _prompt_rows(offsets, train), _prompt_rows(offsets, test)
    phi = fit_affine(source[train_rows], target[train_rows])
    mapped = np.hstack([source.astype(np.float64), np.ones((rows, 1))]) @ phi
    residual = mapped[test_rows] - target[test_rows]
    centred = target[test_rows] - target[test_rows].mean(0)
    r2 = 1.0 - float((residual**2).sum() / (centred.astype(np.float64) ** 2).sum())

    adapter = ModelAdapter.load(plan.store.local(plan.model_b_path), device=task_device(device_policy) or "cpu")
    data = load_dataset(plan.store.local(plan.dataset_path))
    if adapter.kind != "causal-lm" and data.labels is None:
        raise InvalidArgument("stitching into a classifier needs a labelled dataset")
    own = stitched = 0.0
    count = 0
    for lo in range(0, len(test), plan.batch_size):
        prompts = test[lo: lo + plan.batch_size]
        batch = adapter.encode([data.texts[p] for p in prompts], plan.max_len)
        labels = torch.as_tensor(data.labels[prompts]) if data.labels is not None else None
        own_loss, batch_count = _task_loss(adapter, batch, labels)
        replacement = torch.zeros(len(prompts), batch.mask.shape[1], adapter.hidden_size)
        for k, p in enumerate(prompts):
            length = int(offsets[p + 1] - offsets[p])
            if int(batch.mask[k].sum()) != length:
                raise InvalidArgument("the runs' tokenisation differs from model B's: capture both with the "
                                      "same tokenizer and max_len")
            replacement[k, :length] = torch.from_numpy(mapped[offsets[p]: offsets[p + 1]]).float()
        with adapter.replaced_layer(plan.layer_b, replacement):
            stitched_loss, _ = _task_loss(adapter, batch, labels)
        own += own_loss
        stitched += stitched_loss
        count += batch_count
    return {"own_loss": own / count, "stitched_loss": stitched / count, "penalty": (stitched - own) / count,
            "test_r2": r2, "train_prompts": float(len(train)), "test_prompts": float(len(test)),
            "test_targets": float(count)}
