"""Data out of the store, for the client (`Client.readers`): a layer's rows, batches for training
(numpy, or a torch `IterableDataset`), a run as a lazy xarray, and read-only SQL over the catalog.

Torch, xarray, zarr and pandas are imported only by the methods that need them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from actstore._proto.actstore.v1 import actstore_pb2
from actstore._proto.actstore.v1 import readers_pb2 as pb
from actstore.client.arguments import checking_arguments, options
from actstore.client.frames import pandas
from actstore.client.transport import Connection
from actstore.errors import InvalidArgument
from actstore.options import BATCHES, SQL
from actstore.wire import from_ndarray


@dataclass(frozen=True)
class Batch:
    """`values[i, j]` is layer `layers[j]` of row `rows[i]` of the run (a sample for pooled runs, a
    token for token-level runs, whose `sample_ids[i]` names the token's sample)."""

    values: np.ndarray  # (rows, len(layers), d), the stored dtype (bfloat16 and int8 decoded to float32)
    layers: list[int]
    rows: np.ndarray  # the run's row index of each row
    sample_ids: list[str]
    labels: np.ndarray | None  # the sample's label of each row; None if the dataset has none

    def __len__(self) -> int:
        return len(self.rows)

    def layer(self, layer: int) -> np.ndarray:
        """(rows, d): one layer of the batch."""
        return self.values[:, self.layers.index(layer)]


@dataclass(frozen=True)
class RunLocation:
    run_key: str
    store: str
    group: str
    array: str
    dtype: str
    pooling: str
    n: int
    rows: int
    num_layers: int
    width: int


@dataclass(frozen=True)
class SqlResult:
    columns: list[str]
    types: list[str]
    rows: list[tuple[Any, ...]]
    truncated: bool  # more rows matched than the limit let through

    def to_pandas(self):
        return pandas().DataFrame(self.rows, columns=self.columns)


def _cell(value: pb.SqlValue) -> Any:
    kind = value.WhichOneof("value")
    return None if kind in (None, "is_null") else getattr(value, kind)


def _decoded(part: pb.BatchPart, states: dict[int, tuple[int, np.ndarray]]) -> np.ndarray:
    """A part's values: as sent, or an int8 run's codes decoded with their shards' states (each
    state arrives once a stream, in the first part whose rows need it): value = code * step +
    offset, float32, the multiply first, as the store decodes them."""
    for d in part.decodings:
        states[d.start] = (d.stop, from_ndarray(d.state))
    values = from_ndarray(part.values)
    if values.dtype != np.int8:
        return values
    starts = np.array(sorted(states))
    rows = np.asarray(part.rows, dtype=np.int64)
    shard = np.searchsorted(starts, rows, side="right") - 1  # each row's shard, by its place in `starts`
    used, where = np.unique(shard, return_inverse=True)
    ends = np.cumsum(np.bincount(where, minlength=len(used)))[:-1]
    out = np.empty(values.shape, np.float32)
    # the rows grouped by shard, each shard's state broadcast: a block stays in cache for the add and the scatter
    for i, rows_of in enumerate(np.split(np.argsort(where, kind="stable"), ends)):
        step, offset = states[int(starts[used[i]])][1]
        block = np.multiply(values[rows_of], step)
        block += offset
        out[rows_of] = block
    return out


def _batch(parts: list[pb.BatchPart], layers: Sequence[int] | None, values: list[np.ndarray]) -> Batch:
    values = values[0] if len(values) == 1 else np.concatenate(values)
    labels = [label for p in parts for label in p.labels]
    return Batch(values=values, layers=list(layers) if layers else list(range(values.shape[1])),
                 rows=np.array([r for p in parts for r in p.rows], dtype=np.int64),
                 sample_ids=[s for p in parts for s in p.sample_ids],
                 labels=np.array(labels, dtype=np.int64) if labels else None)


@checking_arguments
@dataclass(eq=False)
class Readers:
    """A run's values out of the store: rows of a layer, training batches (numpy or torch), a lazy
    xarray, where its arrays are, and read-only SQL over the catalog (the Readers service, and the
    Query service's ReadActivations)."""

    connection: Connection

    def read_activations(self, run: str, layer: int, start: int = 0, stop: int | None = None
                         ) -> tuple[np.ndarray, list[str]]:
        """Rows [start, stop) of one layer, streamed in bounded messages; returns (values, sample ids).
        `stop` None reads to the end."""
        if stop is not None and stop <= start:  # the request's stop 0 means "to the end"
            raise InvalidArgument(f"rows {start}..{stop} are an empty range: give stop > start, or leave stop out "
                                  "to read to the end")
        request = actstore_pb2.ReadActivationsRequest(run=run, layer=layer, start=start, stop=stop or 0)
        parts, ids = [], []
        for chunk in self.connection.query.ReadActivations(request):
            parts.append(from_ndarray(chunk.values))
            ids.extend(chunk.sample_ids)
        return np.concatenate(parts), ids

    @options(BATCHES)
    def batches(self, run: str, *, batch_size: int, layers: Sequence[int] | None = None, shuffle: bool = True,
                seed: int = BATCHES.seed.default, epoch: int = BATCHES.epoch.default, rank: int = BATCHES.rank.default,
                world_size: int = BATCHES.world_size.default, buffer_shards: int = BATCHES.buffer_shards.default,
                drop_last: bool = BATCHES.drop_last.default) -> Iterator[Batch]:
        """One epoch of rank `rank`'s share of a committed run, as batches streamed from the server.

        The run's shards are dealt to the `world_size` ranks round-robin in an order shuffled per
        (seed, epoch): over all ranks every row comes exactly once per epoch; ranks' row counts
        differ by at most one shard's rows (ACTSTORE_SHARD_ROWS; a rank may get none when there
        are more ranks than shards). With `shuffle`, rows are drawn at random from a server-side
        buffer of `buffer_shards` shards (bounded memory, not a full load); the same seed and epoch
        give the same batches. Without, rows come in store order. Each batch holds `batch_size`
        rows but a rank's last; `drop_last` drops that one (then not every row is read).
        Token-level runs: a row is a token, with its sample's id and label."""
        request = pb.BatchesRequest(run=run, layers=list(layers or []), shuffle=shuffle, batch_size=batch_size,
                                    seed=seed, epoch=epoch, rank=rank, world_size=world_size,
                                    buffer_shards=buffer_shards, drop_last=drop_last)
        parts: list[pb.BatchPart] = []
        values: list[np.ndarray] = []
        states: dict[int, tuple[int, np.ndarray]] = {}  # an int8 run's shards' states, by first row
        for part in self.connection.readers.ReadBatches(request):
            parts.append(part)
            values.append(_decoded(part, states))
            if part.offset + len(part.rows) == part.batch_rows:
                yield _batch(parts, layers, values)
                parts, values = [], []

    @options(BATCHES)
    def torch_dataset(self, run: str, *, batch_size: int, layers: Sequence[int] | None = None, shuffle: bool = True,
                      seed: int = BATCHES.seed.default, rank: int = BATCHES.rank.default,
                      world_size: int = BATCHES.world_size.default,
                      buffer_shards: int = BATCHES.buffer_shards.default,
                      drop_last: bool = BATCHES.drop_last.default):
        """A `torch.utils.data.IterableDataset` over `batches` (needs torch): each DataLoader worker
        opens its own connection and reads its own share (ranks x workers readers in all). Use
        `DataLoader(dataset, batch_size=None, num_workers=N)` and `dataset.set_epoch(e)` per epoch."""
        from actstore.client.torch_data import ActivationBatches

        connection = self.connection
        return ActivationBatches(connection.address, run, token=connection.token,
                                 root_certificates=connection.root_certificates,
                                 batch_size=batch_size, layers=layers, shuffle=shuffle, seed=seed, rank=rank,
                                 world_size=world_size, buffer_shards=buffer_shards, drop_last=drop_last)

    def locate_run(self, run: str) -> RunLocation:
        """Where a committed run's Zarr arrays are (the server's store root and the run's group)."""
        r = self.connection.readers.LocateRun(pb.LocateRunRequest(run=run))
        return RunLocation(r.run_key, r.store, r.group, r.array, r.dtype, r.pooling, r.n, r.rows, r.num_layers,
                           r.width)

    def to_xarray(self, run: str):
        """The run as a lazy `xarray.DataArray` read straight from its Zarr arrays (needs xarray and
        zarr: pip install 'actstore[readers]'; and a store this process can reach: the server's
        local path, or its s3:// bucket with the AWS_* variables set). Pooled runs: dims
        (sample, layer, feature); token-level runs: (token, layer, feature). Coordinates: layer,
        sample_id and label (per token for token-level runs, plus `sample`, the sample index).
        Nothing is read until values are asked for; a selection reads only its chunks."""
        from actstore.client.xarray_view import open_run

        return open_run(self.locate_run(run))

    @options(SQL)
    def sql(self, query: str, *, limit: int | None = SQL.limit.default) -> SqlResult:
        """One read-only SELECT over the catalog tables (docs/sql.md), at most `limit` rows (default:
        the server's ACTSTORE_SQL_MAX_ROWS); `truncated` says whether more matched. Writes, ATTACH,
        COPY, file reads and table functions are refused (PermissionDenied)."""
        answer = self.connection.readers.Sql(pb.SqlRequest(query=query, limit=limit))
        return SqlResult(list(answer.columns), list(answer.types),
                         [tuple(_cell(v) for v in row.values) for row in answer.rows], answer.truncated)
