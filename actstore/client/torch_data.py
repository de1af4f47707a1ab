"""`client.batches` as a `torch.utils.data.IterableDataset` (imported only when asked for: the
client itself never needs torch).

Each DataLoader worker opens its own connection (a gRPC channel must not cross a fork) and reads
the share of reader `rank * num_workers + worker` among `world_size * num_workers` readers, so
ranks and workers together still read every row exactly once per epoch.

    dataset = client.torch_dataset(run, batch_size=256, seed=0, rank=rank, world_size=world)
    loader = DataLoader(dataset, batch_size=None, num_workers=2)
    for epoch in range(epochs):
        dataset.set_epoch(epoch)
        for batch in loader:   # {"values": (B, layers, d) float32, "rows", "labels", "sample_ids"}
            ...
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from actstore.options import BATCHES


class ActivationBatches(IterableDataset):
    def __init__(self, address: str, run: str, *, batch_size: int, token: str | None = None,
                 root_certificates: bytes | None = None, layers: Sequence[int] | None = None, shuffle: bool = True,
                 seed: int = BATCHES.seed.default, rank: int = BATCHES.rank.default,
                 world_size: int = BATCHES.world_size.default, buffer_shards: int = BATCHES.buffer_shards.default,
                 drop_last: bool = BATCHES.drop_last.default, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.address, self.run, self.token, self.root_certificates = address, run, token, root_certificates
        self.options = dict(batch_size=batch_size, layers=layers, shuffle=shuffle, seed=seed,
                            buffer_shards=buffer_shards, drop_last=drop_last)
        self.rank, self.world_size, self.dtype = rank, world_size, dtype
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """The next iteration reads this epoch's order (call it before each epoch, as with
        DistributedSampler)."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[dict]:
        from actstore.client import Client

        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        with Client(self.address, token=self.token, root_certificates=self.root_certificates) as client:
            for batch in client.batches(self.run, epoch=self.epoch, rank=self.rank * workers + worker,
                                        world_size=self.world_size * workers, **self.options):
                yield {"values": torch.from_numpy(np.asarray(batch.values)).to(self.dtype),
                       "rows": torch.from_numpy(batch.rows),
                       "labels": None if batch.labels is None else torch.from_numpy(batch.labels),
                       "sample_ids": batch.sample_ids, "layers": batch.layers}
