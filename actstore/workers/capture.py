"""Capture: run a model over a dataset and write every layer's hidden states, a few shards a task.

A `ShardCapturer` holds one model replica. `capture(shards)` computes the rows of one or more
consecutive shards in full batches (`capture_job.shards_per_task`), writes each shard whole
(writers own whole shards) and returns the chunk metadata that the job manager records in the
catalog after the write: write-then-commit. Rewriting a shard with the same content is harmless,
so a retried or resumed task may recompute a shard.

Several capture sites (`CapturePlan.sites`) come from one forward pass: each site is its own run,
laid out alike, and a task writes its shards of every site's run that still needs them.

Pooled runs: shard k holds samples [k*S, (k+1)*S). Token-level runs: shard k holds token rows
[k*S, (k+1)*S) of the concatenation of every prompt's non-pad tokens; the prompts that straddle a
task's ends are computed by both neighbouring tasks, and each writes only its own rows.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actstore.errors import FailedPrecondition
from actstore.metrics.rounding import ErrorFigures
from actstore.modeling.adapter import Batch, ModelAdapter
from actstore.modeling.loading import files_beside_weights_digest
from actstore.modeling.pooling import token_positions
from actstore.store.array_store import ArrayStore, RunLayout
from actstore.store.datasets import DatasetData, load_dataset
from actstore.store.format.quantised import is_one_byte, rounding_seed
from actstore.store.handle import StoreHandle
from actstore.workers.cluster import unwrap
from actstore.workers.quantise import dequantise, quantise, rounding_draws
from actstore.workers.reductions import reduce_shard, reduced_values
from actstore.workers.shard_writes import PreparedShard, reduced_on_host, write_prepared, write_remotely

# the dtype a shard's numbers are cast to before they are stored: an int8 run's exact float32
# values are coded per shard afterwards (`workers.quantise`)
_TORCH_STORAGE = {"float16": torch.float16, "float32": torch.float32, "bfloat16": torch.bfloat16,
                  "int8": torch.float32}


@dataclass(frozen=True)
class CapturePlan:
    run_key: str
    dataset_path: str
    max_len: int
    batch_size: int
    layout: RunLayout
    sites: tuple[tuple[str, str], ...] = ()  # (site, run key) of every run; empty: resid_post into run_key
    # (run key, layers): write only these layers of these runs, float32, into their `exact` arrays (an int8
    # run's layers whose bound was over its max_cka_error; their codes are stored already)
    exact: tuple[tuple[str, tuple[int, ...]], ...] = ()
    # (run key, rounding key) of a lossy run whose draws are seeded from another key than its own
    # (`store.keys.rounding_key`: a run with a max_cka_error draws as the run without it)
    rounding_keys: tuple[tuple[str, str], ...] = ()
    # the store its runs live in; None: the replica's own. A replica taken by another server's pool,
    # then restarted by Ray after a crash, is started again with the store it was first started with
    store: StoreHandle | None = None

    @property
    def runs(self) -> tuple[tuple[str, str], ...]:
        return self.sites or (("resid_post", self.run_key),)


def model_inputs(data: DatasetData, start: int, stop: int):
    return data.texts[start:stop] if data.kind == "text" else data.images[start:stop]


def storage_array(cast: torch.Tensor) -> np.ndarray:
    """The array to store of numbers already in the storage dtype, on the host: bfloat16 is stored
    as its uint16 bits."""
    if cast.dtype == torch.bfloat16:
        return cast.view(torch.int16).numpy().view(np.uint16)
    return cast.numpy()


def prepare_shards(values: torch.Tensor, bounds: list[tuple[int, int]], dtype: str,
                   figures: ErrorFigures | None = None, seeds: list[int] | None = None) -> list[PreparedShard]:
    """The part of storing shards that runs where their forward pass ran: the cast and every
    reduction of the shards at rows [lo, hi) of ``values`` (rows, L+1, d), for each of ``bounds``.
    The rest of a shard's write (checksums and the PUT) is `shard_writes.write_prepared`.

    The values are laid out layer by layer here, as the store keeps them (an inner chunk and a
    checksum per layer): the checksums, statistics and compression after it then read each layer
    in one piece instead of copying it out of interleaved rows. On a GPU the reductions run there
    (`workers.reductions`) and only the storage dtype's bytes and a few numbers a layer come to
    the host (`_to_host`); a CPU replica reduces them with numpy (`reduced_on_host`). An int8
    run's shards are coded here too (`prepare_one_byte`, each shard's rounding drawn from its one of
    ``seeds``: `quantised.rounding_seed`), and what the coding did measured into ``figures``."""
    by_layer = values.transpose(0, 1).to(_TORCH_STORAGE[dtype]).contiguous()  # (L+1, rows, d)
    if is_one_byte(dtype):
        if seeds is None or len(seeds) != len(bounds):
            raise ValueError("an int8 shard's rounding needs its seed: one for each of bounds")
        return prepare_one_byte(by_layer, bounds, seeds, figures)
    if by_layer.device.type != "cpu":
        return _to_host(by_layer, bounds)
    parts = [by_layer[:, lo:hi] for lo, hi in bounds]
    lows = torch.stack([torch.amin(part, dim=(1, 2)) for part in parts]).tolist()
    highs = torch.stack([torch.amax(part, dim=(1, 2)) for part in parts]).tolist()
    on_host = storage_array(by_layer)
    if dtype == "bfloat16":  # (numpy has no bfloat16: its bits are uint16)
        sums = torch.stack([part.sum(dim=1, dtype=torch.float64) for part in parts]).numpy()
    else:  # numpy sums float16 into float64 2.5x faster than torch here; float16 values are k * 2^-24
        # with |k| < 2^40, so the sums of up to 8,192 rows are exact, the same whatever the order
        sums = [on_host[:, lo:hi].sum(axis=1, dtype=np.float64) for lo, hi in bounds]
    return [reduced_on_host(on_host[:, lo:hi], shard_sums, (low, high))
            for (lo, hi), shard_sums, low, high in zip(bounds, sums, lows, highs)]


def prepare_one_byte(exact: torch.Tensor, bounds: list[tuple[int, int]], seeds: list[int],
                     figures: ErrorFigures | None = None) -> list[PreparedShard]:
    """`prepare_shards` of an int8 run: each shard of the exact float32 values ``exact``
    (L+1, rows, d) coded on its device (`workers.quantise`), rounded stochastically by draws from
    its one of ``seeds`` (`quantised.rounding_seed`), and reduced from its decoded values,
    the numbers a reader gets; only the codes, the steps and offsets and the reductions come to
    the host. ``figures`` measures each shard's exact values against its decoded ones, on the same
    device, in the same pass (`metrics.rounding`). FailedPrecondition for NaN or Inf, which no
    code holds."""
    bad = (~torch.isfinite(exact)).any(dim=2).any(dim=1)
    if bool(bad.any()):
        layers = torch.nonzero(bad).flatten().tolist()
        raise FailedPrecondition(f"layer{'s' if len(layers) > 1 else ''} {', '.join(map(str, layers))} of this "
                                 "model's activations hold NaN or Inf, which int8 codes cannot store: capture "
                                 "with --dtype float32 (or float16, where they fit)")
    coded = [quantise(exact[:, lo:hi], rounding_draws(exact[:, lo:hi].shape, seed, exact.device))
             for (lo, hi), seed in zip(bounds, seeds)]
    codes = torch.cat([c for c, _ in coded], dim=1)
    numbers = torch.cat([dequantise(c, state) for c, state in coded], dim=1)
    states = torch.stack([state for _, state in coded])
    on_host = exact.device.type == "cpu"
    if figures is not None:  # on the host through BLAS (numpy's arrays share the tensors' memory)
        for (lo, hi), (_, state) in zip(bounds, coded):
            part, stored = exact[:, lo:hi], numbers[:, lo:hi]
            figures.update(*((part.numpy(), stored.numpy(), state.numpy()) if on_host else (part, stored, state)))
    if not on_host:
        prepared = _to_host(codes, bounds, numbers)
        states = states.cpu().numpy()
        return [replace(p, decoding=state) for p, state in zip(prepared, states)]
    codes, numbers, states = codes.numpy(), numbers.numpy(), states.numpy()
    return [reduced_on_host(codes[:, lo:hi], numbers[:, lo:hi].sum(axis=1, dtype=np.float64), decoding=state,
                            numbers=numbers[:, lo:hi]) for (lo, hi), state in zip(bounds, states)]


def _to_host(by_layer: torch.Tensor, bounds: list[tuple[int, int]], numbers: torch.Tensor | None = None
             ) -> list[PreparedShard]:
    """A GPU task's shards on the host: each shard reduced on the device (`reduce_shard`) while the
    stored bytes copy to pinned host memory on a side stream, then the reductions, all in one
    copy; the host waits once for the task, not once a shard. Pinned buffers come from torch's
    caching host allocator: a task's buffer is reused by a later one once every array viewing it
    (the shards handed to the writers) is gone. ``numbers``: what the reductions read where the
    stored values are codes (an int8 run's decoded values)."""
    device = by_layer.device
    copies = _copy_stream(device)
    host = torch.empty(by_layer.shape, dtype=by_layer.dtype, pin_memory=True)
    copies.wait_stream(torch.cuda.current_stream(device))  # the cast is done before its bytes move
    with torch.cuda.stream(copies):
        host.copy_(by_layer, non_blocking=True)
    numbers = by_layer if numbers is None else numbers
    reduced = [reduce_shard(numbers[:, lo:hi]) for lo, hi in bounds]  # beside the copy, on the compute stream
    tables = torch.stack([table for table, _ in reduced])
    sums = torch.stack([shard_sums for _, shard_sums in reduced])
    tables_host = torch.empty(tables.shape, dtype=tables.dtype, pin_memory=True)
    sums_host = torch.empty(sums.shape, dtype=sums.dtype, pin_memory=True)
    copies.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(copies):
        tables_host.copy_(tables, non_blocking=True)
        sums_host.copy_(sums, non_blocking=True)
    for tensor in (by_layer, numbers, tables, sums):  # not freed for reuse before the side stream has read them
        tensor.record_stream(copies)
    copies.synchronize()
    on_host = storage_array(host)
    return [PreparedShard(on_host[:, lo:hi], shard_sums, *reduced_values(table))
            for (lo, hi), table, shard_sums in zip(bounds, tables_host.numpy(), sums_host.numpy())]


_COPY_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _copy_stream(device: torch.device) -> torch.cuda.Stream:
    """The side stream of a device that takes its shards' bytes to the host (one a process)."""
    if device not in _COPY_STREAMS:
        _COPY_STREAMS[device] = torch.cuda.Stream(device)
    return _COPY_STREAMS[device]


def layer_tokens(layers: list[torch.Tensor], mask: torch.Tensor | None, dtype: torch.dtype
                 ) -> tuple[torch.Tensor, np.ndarray]:
    """(L+1, T, d) in ``dtype``: the tokens `pool_tokens` keeps of one batch whose layers are the
    (b, s, d) tensors ``layers``, and each sample's count. Each layer is cast whole, then its
    tokens are picked straight into their place in the result: stacking the layers, gathering,
    then casting copied every token three times (the first time with its padding), and a gather
    before the cast twice; this is 2x faster than either (`bench/capture_steps.py`'s gather step)."""
    b, s, width = layers[0].shape
    b_idx, s_idx, counts = token_positions(mask, b, s, layers[0].device)
    positions = b_idx * s + s_idx  # in the (b * s, d) view of a layer
    tokens = torch.empty((len(layers), len(positions), width), dtype=dtype, device=layers[0].device)
    for layer, states in enumerate(layers):
        torch.index_select(states.reshape(b * s, width).to(dtype), 0, positions, out=tokens[layer])
    return tokens, counts


def task_samples(offsets: np.ndarray, start: int, stop: int) -> tuple[int, int, int]:
    """The samples [first, last) whose tokens cover token rows [start, stop) of a token-level run
    (sample i owns rows offsets[i]:offsets[i+1]), and where row `start` lies in sample first's."""
    first = int(np.searchsorted(offsets, start, side="right")) - 1
    last = int(np.searchsorted(offsets, stop, side="left"))
    return first, last, start - int(offsets[first])


def length_batches(lengths: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """A task's samples (indices into ``lengths``, their token counts) in batches of equal size, at
    most ``batch_size``, sorted by length. A batch pads to its longest sample, so sorting within
    the task cuts what a forward pass computes: 7,500 reviews in tasks of ~134 prompts padded to
    384k positions for 202k tokens in arrival order, to 246k sorted. Equal sizes: a task's ~137
    prompts ran as 4 x 32 and one of ~9, and a batch that small runs at about half the rate per
    token on a multi-threaded forward. A sample's numbers do not depend on its batch (the
    attention mask hides the padding) beyond float rounding."""
    order = np.argsort(lengths, kind="stable")
    count = -(-len(order) // batch_size)
    edges = [len(order) * i // count for i in range(count + 1)]
    return [order[lo:hi] for lo, hi in zip(edges[:-1], edges[1:])]


def token_order(members: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Where each token row of a task's samples, in sample order, lies among the rows its
    batches gave (batch after batch, each sample's tokens in turn): ``members`` are the samples in
    that order, ``counts`` their token counts."""
    starts = np.cumsum(counts) - counts  # each sample's first row among the batches' rows
    by_sample = np.argsort(members)
    sizes = counts[by_sample]
    within = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    return np.repeat(starts[by_sample], sizes) + within


class ShardCapturer:
    """One model replica. It outlives a job (the service keeps a pool), so it loads its model once
    and each dataset and run layout the first time a shard of it arrives.

    Run as an actor with several calls at once (Settings.capture_concurrent_shards). A task first
    tokenises its batches, then computes them (at most ``forwards`` tasks at once: `_compute`,
    which also covers the cast and reductions of their shards, `prepare_shards`), then writes its
    shards (`shard_writes.write_prepared`: checksums, statistics, compression and I/O) while the
    others tokenise and compute, so the model does not wait on the store.

    A CPU replica (the pool's choice) runs as many forwards at once as it runs tasks, each on its
    share of the replica's ``num_threads`` cores: a write that takes a core from a two-thread
    forward stalls both its threads at the next barrier, one that takes it from a one-thread
    forward delays only that one. On 2 cores a token-level capture went from 0.70 to 0.76-0.87 of
    a bare forward (bench/README.md, capture_throughput). The stored bytes did not change (a
    row's numbers did not depend on the thread count here; compared byte for byte).

    A GPU replica computes one task at a time (``forwards`` = 1) and its forward passes outrun one
    thread's writes, so its shards are written in parallel (``writes``):

      * ``"threads"``: by ``writers`` threads of this process, each shard straight from the host
        copy of its forward pass (`_to_host`'s pinned buffer), with no copy on the way. The write
        path after the reductions (`shard_writes.write_prepared`: crc32c, Blosc, the file write or
        the S3 PUT) runs in C calls that release the GIL: two threads of one process wrote 1.6-2.2x
        one thread's bytes on this project's 2-core machine, so they hold the GIL little beside
        the thread that launches the forward's kernels;
      * ``"ray-tasks"``: by one-CPU Ray tasks on the replica's node, each shard copied into Ray's
        object store on the way (`shard_writes.write_remotely`).

    Either way a task waits for its own shards only, while the replica's other tasks compute: the
    bytes in flight are at most the shards of the tasks a replica works on at once. A CPU replica
    (``writes`` = ``"inline"``) writes a task's shards in the task's own thread."""

    def __init__(self, model_path: str, store: StoreHandle, num_threads: int | None = None,
                 forwards: int = 1, writes: str = "inline", writers: int = 1) -> None:
        if num_threads:
            torch.set_num_threads(max(1, num_threads // forwards))
        folder = store.local(model_path)
        self.adapter = ModelAdapter.load(folder)
        self._beside_weights = files_beside_weights_digest(folder)
        self.store = store
        self.arrays = store.open()
        self.writes = writes
        self._writers = ThreadPoolExecutor(writers, thread_name_prefix="shard-writer") if writes == "threads" else None
        self._datasets: dict[str, DatasetData] = {}
        self._offsets: dict[str, np.ndarray] = {}
        self._compute = threading.BoundedSemaphore(forwards)
        self._spent = {"tasks": 0, "tokenising": 0.0, "waiting": 0.0, "computing": 0.0, "writing": 0.0}
        self._counting = threading.Lock()
        # a fast tokenizer is one Rust object: a call that changes its truncation (another max_len)
        # while another call encodes fails with "Already borrowed"
        self._tokenizing = threading.Lock()
        self._switching = threading.Lock()  # to another store (`serve_store`, a plan's store)

    def serve_store(self, store: StoreHandle, model_path: str) -> bool:
        """Write to ``store`` from now on: an idle replica a stopped server left behind, taken by
        the next server of its process (`server.capture_pool`). Its model stays loaded; the
        datasets and run layouts of the store it served are dropped. False, changing nothing,
        when ``store``'s copy of the model differs from the loaded one in a file the model's
        digest does not cover (its tokenizer, say): the caller starts a replica of that copy."""
        if files_beside_weights_digest(store.local(model_path)) != self._beside_weights:
            return False
        self._serve(store)
        return True

    def _serve(self, store: StoreHandle) -> None:
        """Serve ``store`` (a no-op when it is the one served: every task of a plan asks)."""
        with self._switching:
            if store.root != self.store.root:
                self.store, self.arrays = store, store.open()
                self._datasets.clear()
                self._offsets.clear()

    def node_id(self) -> str:
        """The Ray node this replica runs on (answered once its model is loaded)."""
        return ray.get_runtime_context().get_node_id()

    def spent(self) -> dict[str, float]:
        """The tasks this replica finished and the seconds they spent, summed over its concurrent
        tasks: tokenising, waiting for the compute slot, computing (forward passes, cast and
        reductions, the copy to the host) and writing (their shards' writes, remote or inline)."""
        with self._counting:
            return dict(self._spent)

    def _count(self, **seconds: float) -> None:
        with self._counting:
            self._spent["tasks"] += 1
            for phase, value in seconds.items():
                self._spent[phase] += value

    def _data(self, plan: CapturePlan) -> DatasetData:
        if plan.dataset_path not in self._datasets:
            self._datasets[plan.dataset_path] = load_dataset(self.store.local(plan.dataset_path))
        return self._datasets[plan.dataset_path]

    def _batches(self, plan: CapturePlan, start: int, stop: int) -> tuple[list[tuple[Batch, np.ndarray]], int]:
        """The encoded batches that cover rows [start, stop), each with its samples' indices among
        the task's samples (`length_batches`), and where row `start` lies in the first sample's
        rows (token-level runs; 0 for pooled runs)."""
        data = self._data(plan)
        if plan.layout.pooling == "tokens":
            if plan.run_key not in self._offsets:
                self._offsets[plan.run_key] = self.arrays.offsets(plan.run_key)
            first, last, begin = task_samples(self._offsets[plan.run_key], start, stop)
        else:
            first, last, begin = start, stop, 0
        if data.kind != "text":  # images: the same size each, encoded a batch at a time (a task's are ~150 MB)
            groups = length_batches(np.zeros(last - first, dtype=np.int64), plan.batch_size)
            return [(self._encode(model_inputs(data, first + g[0], first + g[-1] + 1), plan.max_len), g)
                    for g in groups], begin
        # every text of the task tokenised at once, then batched by length
        whole = self._encode(model_inputs(data, first, last), plan.max_len)
        groups = length_batches(whole.mask.sum(dim=1).numpy(), plan.batch_size)
        return [(whole.select(g), g) for g in groups], begin

    def _encode(self, inputs, max_len: int) -> Batch:
        with self._tokenizing:
            return self.adapter.encode(inputs, max_len)

    def _pooled(self, batches: list[tuple[Batch, np.ndarray]], sites: list[str], pooling: str
                ) -> dict[str, torch.Tensor]:
        """{site: (rows, L+1, d) float32} of the batches' samples, in the task's sample order (a
        view of (L+1, rows, d), as `prepare_shards` lays a shard out)."""
        parts: dict[str, list] = {site: [] for site in sites}
        for batch, _ in batches:
            for site, hidden in self.adapter.site_states(batch, sites).items():
                parts[site].append(self.adapter.pool(hidden, batch.mask, pooling))
        order = torch.from_numpy(np.argsort(np.concatenate([members for _, members in batches])))
        return {site: torch.cat(p, dim=1)[:, order].transpose(0, 1) for site, p in parts.items()}

    def _tokens(self, batches: list[tuple[Batch, np.ndarray]], sites: list[str], dtype: str, begin: int,
                rows: int) -> tuple[dict[str, torch.Tensor], np.ndarray | None]:
        """{site: (rows, L+1, d) in the storage dtype} for token rows [begin, begin + rows) of the
        task's samples' tokens (in sample order; a view of (L+1, rows, d), as `prepare_shards` lays
        a shard out), and their token ids (text models)."""
        parts: dict[str, list] = {site: [] for site in sites}
        ids, counts = [], []
        storage = _TORCH_STORAGE[dtype]
        for batch, _ in batches:
            for site, layers in self.adapter.site_layers(batch, sites).items():
                tokens, batch_counts = layer_tokens(layers, batch.mask, storage)
                parts[site].append(tokens)
            counts.append(batch_counts)
            if batch.mask is not None and "input_ids" in batch.inputs:
                ids.append(batch.inputs["input_ids"][batch.mask.bool()].numpy())
        wanted = token_order(np.concatenate([members for _, members in batches]), np.concatenate(counts))
        wanted = wanted[begin: begin + rows]
        token_ids = np.concatenate(ids)[wanted] if ids else None
        index = torch.from_numpy(wanted)
        return {site: torch.cat(p, dim=1)[:, index].transpose(0, 1) for site, p in parts.items()}, token_ids

    def capture(self, plan: CapturePlan, shards: tuple[int, ...], run_keys: tuple[str, ...] | None = None
                ) -> ShardsWritten:
        """Compute the consecutive `shards` of every site's run (of those in `run_keys`, when given)
        in one pass of full batches, and write each shard whole; returns the chunk rows, one table
        per shard and run, and a lossy run's rounding of these shards."""
        if plan.store is not None:
            self._serve(plan.store)
        wanted = [(site, key) for site, key in plan.runs if run_keys is None or key in run_keys]
        layout = plan.layout
        start, stop = layout.shard_range(shards[0])[0], layout.shard_range(shards[-1])[1]
        token_ids = None
        sites = [site for site, _ in wanted]
        bounds = [tuple(bound - start for bound in layout.shard_range(shard)) for shard in shards]
        started = time.perf_counter()
        batches, begin = self._batches(plan, start, stop)  # before the compute slot: beside another's forward
        tokenised = time.perf_counter()
        with self._compute:
            computing = time.perf_counter()
            if layout.pooling == "tokens":
                values, token_ids = self._tokens(batches, sites, layout.dtype, begin, stop - start)
            else:
                values = self._pooled(batches, sites, layout.pooling)
            if plan.exact:
                return self._write_exact(plan, wanted, values, shards, bounds)
            figures = {site: ErrorFigures(layout.num_states, layout.width) for site in sites
                       if is_one_byte(layout.dtype)}
            drawn_as = dict(plan.rounding_keys)
            prepared = {site: prepare_shards(values[site], bounds, layout.dtype, figures.get(site),
                                             [rounding_seed(drawn_as.get(key, key), shard) for shard in shards])
                        for site, key in wanted}
        computed = time.perf_counter()
        del values, batches
        writes = [(key, shard, prepared[site][i], None if token_ids is None else token_ids[lo:hi])
                  for i, (shard, (lo, hi)) in enumerate(zip(shards, bounds)) for site, key in wanted]
        tables = self._write(writes)
        self._count(tokenising=tokenised - started, waiting=computing - tokenised, computing=computed - computing,
                    writing=time.perf_counter() - computed)
        return ShardsWritten(tables, {key: figures[site] for site, key in wanted} if figures else None)

    def _write_exact(self, plan: CapturePlan, wanted: list[tuple[str, str]], values: dict[str, torch.Tensor],
                     shards: tuple[int, ...], bounds: list[tuple[int, int]]) -> ShardsWritten:
        """A task of a capture's second pass (`CapturePlan.exact`): the layers kept exact of each
        run, float32 as computed, written whole shard by shard into its `exact` array; their sums
        (for the layer means) go back to the job."""
        exact, sums = dict(plan.exact), {}
        for site, key in wanted:
            if key not in exact:
                continue
            part = values[site][:, list(exact[key])].float().cpu()  # (rows, k, d)
            for shard, (lo, hi) in zip(shards, bounds):
                block = part[lo:hi].contiguous().numpy()
                self.arrays.write_exact_shard(key, shard, block)
                sums.setdefault(key, {})[shard] = block.sum(axis=0, dtype=np.float64)
        return ShardsWritten([], exact_sums=sums)

    def _write(self, writes: list[tuple]) -> list[dict[str, list]]:
        if self.writes == "inline":
            return [write_prepared(self.arrays, *write) for write in writes]
        if self.writes == "threads":
            written = [self._writers.submit(write_prepared, self.arrays, *write) for write in writes]
            return [future.result() for future in written]
        here = NodeAffinitySchedulingStrategy(self.node_id(), soft=True)
        refs = [write_remotely.options(scheduling_strategy=here).remote(self.store, *write) for write in writes]
        try:
            return ray.get(refs)
        except ray.exceptions.RayTaskError as exc:  # the writer's own error, as an inline write raises it
            raise unwrap(exc) from None


def store_shard(arrays: ArrayStore, run_key: str, shard: int, dtype: str, values: torch.Tensor,
                token_ids: np.ndarray | None = None, figures: ErrorFigures | None = None) -> dict[str, list]:
    """Write float32 ``values`` (rows, L+1, d) as one whole shard in the storage ``dtype``, with its
    layer sums and running layer statistics, token ids and kept chunk rows; returns the rows the
    catalog records (a capture's and an import's shards take this one path). A lossy dtype's
    rounding is measured into ``figures``."""
    prepared = prepare_shards(values, [(0, len(values))], dtype, figures, [rounding_seed(run_key, shard)])[0]
    return write_prepared(arrays, run_key, shard, prepared, token_ids)


@dataclass
class ShardsWritten:
    """What a capture or import task returns: the catalog rows of every shard it wrote (one table
    per shard and run), and for a lossy run the rounding of its shards, per run key (the job merges
    them into the run's error figures)."""

    tables: list[dict[str, list]]
    figures: dict[str, ErrorFigures] | None = None
    exact_sums: dict[str, dict[int, np.ndarray]] | None = None  # run key -> shard -> (k, d) sums of its exact layers
