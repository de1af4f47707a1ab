"""Model stitching (Brown et al. 2023), run as a Ray task.

Model f's layer i (from a stored token-level run) feeds model g's layer j through an affine map
phi, fitted by least squares on stored activations of the training prompts: `phi = [A, 1]^+ B`.
Optionally (tune_steps > 0) phi is then tuned by a few Adam steps on g's task loss over the
training prompts, g frozen (METRICS.md, "Model stitching"). On held-out prompts, g runs with its
hidden state j replaced by phi(A); the penalty is g's task loss through the stitch minus g's own
loss, reported for the least-squares map and, when tuned, for the tuned one. Task loss:
next-token cross-entropy for causal LMs, the classifier's cross-entropy (with the dataset labels)
for sequence classifiers.
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
    tune_steps: int = 0  # Adam steps of phi on g's task loss after the least-squares fit
    tune_lr: float = 1e-3


def _prompt_rows(offsets: np.ndarray, prompts: np.ndarray) -> np.ndarray:
    return np.concatenate([np.arange(offsets[p], offsets[p + 1]) for p in prompts])


def fit_affine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares `[A, 1]^+ B` in float64: a (d_a + 1) x d_b matrix, the last row the bias."""
    design = np.hstack([a.astype(np.float64), np.ones((len(a), 1))])
    solution, *_ = np.linalg.lstsq(design, b.astype(np.float64), rcond=None)
    return solution


def _task_loss(adapter: ModelAdapter, batch, labels: torch.Tensor | None) -> tuple[torch.Tensor, int]:
    """(summed loss, count) of g's task on one batch: next-token CE for LMs, else classifier CE."""
    inputs = {k: v.to(adapter.device) for k, v in batch.inputs.items()}
    logits = adapter.model(**inputs).logits.float()
    if adapter.kind == "causal-lm":
        mask = batch.mask.to(adapter.device).bool()
        targets = inputs["input_ids"][:, 1:]
        keep = mask[:, 1:] & mask[:, :-1]
        return F.cross_entropy(logits[:, :-1][keep], targets[keep], reduction="sum"), int(keep.sum())
    return F.cross_entropy(logits, labels.to(adapter.device), reduction="sum"), len(labels)


class _Stitch:
    """Model B, the stored rows of A (with a ones column) and the dataset: g's task loss on some
    prompts, on its own or with hidden state `layer_b` replaced by `[A, 1] phi`."""

    def __init__(self, plan: StitchPlan, adapter: ModelAdapter, source: np.ndarray, offsets: np.ndarray) -> None:
        self.plan, self.adapter, self.offsets = plan, adapter, offsets
        self.source = torch.from_numpy(np.hstack([source.astype(np.float64), np.ones((len(source), 1))]))
        self.data = load_dataset(plan.store.local(plan.dataset_path))
        if adapter.kind != "causal-lm" and self.data.labels is None:
            raise InvalidArgument("stitching into a classifier needs a labelled dataset")

    def batch(self, prompts: np.ndarray):
        batch = self.adapter.encode([self.data.texts[p] for p in prompts], self.plan.max_len)
        labels = torch.as_tensor(self.data.labels[prompts]) if self.data.labels is not None else None
        for k, p in enumerate(prompts):
            if int(batch.mask[k].sum()) != int(self.offsets[p + 1] - self.offsets[p]):
                raise InvalidArgument("the runs' tokenisation differs from model B's: capture both with the "
                                      "same tokenizer and max_len")
        return batch, labels

    def loss(self, prompts: np.ndarray, batch, labels, phi: torch.Tensor | None) -> tuple[torch.Tensor, int]:
        if phi is None:
            return _task_loss(self.adapter, batch, labels)
        replacement = torch.zeros(len(prompts), batch.mask.shape[1], phi.shape[1], device=phi.device)
        for k, p in enumerate(prompts):  # the product in float64 (phi is float64), the model in float32
            start, stop = int(self.offsets[p]), int(self.offsets[p + 1])
            replacement[k, : stop - start] = (self.source[start:stop].to(phi.device) @ phi).float()
        with self.adapter.replaced_layer(self.plan.layer_b, replacement):
            return _task_loss(self.adapter, batch, labels)

    @torch.no_grad()
    def mean_losses(self, prompts: np.ndarray, phis: list[torch.Tensor | None]) -> tuple[list[float], int]:
        """g's mean task loss over `prompts` for each map in `phis` (None: g on its own)."""
        totals, count = [0.0] * len(phis), 0
        for lo in range(0, len(prompts), self.plan.batch_size):
            chunk = prompts[lo: lo + self.plan.batch_size]
            batch, labels = self.batch(chunk)
            for i, phi in enumerate(phis):
                loss, batch_count = self.loss(chunk, batch, labels, phi)
                totals[i] += float(loss)
            count += batch_count
        return [t / count for t in totals], count

    def tune(self, phi: torch.Tensor, train: np.ndarray) -> torch.Tensor:
        """`tune_steps` Adam steps (lr `tune_lr`) of phi on g's mean task loss, g frozen; each step
        takes the next `batch_size` training prompts of a seeded shuffle (seed `seed`, reshuffled
        when used up)."""
        phi = phi.clone().requires_grad_(True)
        optimiser = torch.optim.Adam([phi], lr=self.plan.tune_lr)
        self.adapter.model.requires_grad_(False)
        rng = np.random.default_rng(self.plan.seed)
        queue: list[int] = []
        for _ in range(self.plan.tune_steps):
            if len(queue) < self.plan.batch_size:
                queue.extend(rng.permutation(train).tolist())
            prompts, queue = np.array(queue[: self.plan.batch_size]), queue[self.plan.batch_size:]
            batch, labels = self.batch(prompts)
            with torch.enable_grad():
                loss, count = self.loss(prompts, batch, labels, phi)
                optimiser.zero_grad()
                (loss / count).backward()
            optimiser.step()
        return phi.detach()


@torch.no_grad()
def stitch_penalty(plan: StitchPlan, device_policy: str = "cpu") -> dict:
    """Fit the stitch on the host (float64 least squares), optionally tune it on g's task loss over
    the training prompts, then run model B with and without it on the held-out prompts, on this
    task's GPU when Ray gave it one (`task_device`)."""
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
    fitted = fit_affine(source[train_rows], target[train_rows])
    mapped = np.hstack([source.astype(np.float64), np.ones((rows, 1))]) @ fitted
    residual = mapped[test_rows] - target[test_rows]
    centred = target[test_rows] - target[test_rows].mean(0)
    r2 = 1.0 - float((residual**2).sum() / (centred.astype(np.float64) ** 2).sum())

    adapter = ModelAdapter.load(plan.store.local(plan.model_b_path), device=task_device(device_policy) or "cpu")
    stitch = _Stitch(plan, adapter, source, offsets)
    phi = torch.from_numpy(fitted).to(adapter.device)
    phis: list[torch.Tensor | None] = [None, phi]
    scalars: dict[str, float] = {}
    if plan.tune_steps:
        tuned = stitch.tune(phi, train)
        (before, after), _ = stitch.mean_losses(train, [phi, tuned])
        scalars.update(tune_steps=float(plan.tune_steps), train_stitched_loss=before, tuned_train_stitched_loss=after)
        phis.append(tuned)
    losses, count = stitch.mean_losses(test, phis)
    own, stitched = losses[0], losses[1]
    scalars.update(own_loss=own, stitched_loss=stitched, penalty=stitched - own, test_r2=r2,
                   train_prompts=float(len(train)), test_prompts=float(len(test)), test_targets=float(count))
    if plan.tune_steps:
        scalars.update(tuned_stitched_loss=losses[2], tuned_penalty=losses[2] - own)
    return scalars
