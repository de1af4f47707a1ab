"""Metric queries over stored runs: validate, plan, map over chunks in Ray, reduce, cache.

Every answer is a `MetricResult` with its provenance. Results are stored under their result key
(metric, definition version, options, input run keys), so a repeated query is a catalog lookup.
"""

from __future__ import annotations

import copy
import io
import json
import time
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import ray

from actstore.config import Settings
from actstore.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from actstore.metrics import entropy as ent
from actstore.metrics import lens
from actstore.metrics import similarity as sim
from actstore.store.arrays import ArrayStore
from actstore.store.catalog import Catalog, ChunkHealth, RunRecord
from actstore.store.keys import result_key
from actstore.workers import cluster
from actstore.store.datasets import load_dataset
from actstore.workers.metric_tasks import (
    PerLayer,
    accumulate,
    accumulate_prompts,
    evaluate_layers,
    evaluate_pairs,
    split_prompts,
    split_ranges,
    strip_products,
)


def byte_size(n: int) -> str:
    """`12.5 KiB`, `3.20 GiB`: a size a person reads at a glance."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


@dataclass(frozen=True)
class Provenance:
    metric: str
    definition_version: int
    options: dict[str, Any]
    run_keys: list[str]
    cached: bool
    seconds: float
    result_key: str


@dataclass(frozen=True)
class MetricResult:
    arrays: dict[str, np.ndarray]
    scalars: dict[str, float]
    provenance: Provenance
    notes: list[str] = field(default_factory=list)

    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        meta = json.dumps({"scalars": self.scalars, "notes": self.notes}).encode()
        np.savez(buffer, **self.arrays, __meta__=np.frombuffer(meta, dtype=np.uint8))
        return buffer.getvalue()

    @staticmethod
    def from_bytes(payload: bytes, provenance: Provenance) -> MetricResult:
        with np.load(io.BytesIO(payload), allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files if k != "__meta__"}
            meta = json.loads(npz["__meta__"].tobytes())
        return MetricResult(arrays, meta["scalars"], provenance, meta["notes"])


class QueryEngine:
    """Committed runs are immutable, so their records, health and the pairs already checked for
    matching samples are remembered in memory (until a run is deleted); recent results too."""

    RESULT_CACHE_ENTRIES = 512

    def __init__(self, catalog: Catalog, arrays: ArrayStore, settings: Settings) -> None:
        self.catalog = catalog
        self.arrays = arrays
        self.settings = settings
        self._lock = threading.Lock()
        self._runs: dict[str, RunRecord] = {}
        self._health: dict[str, ChunkHealth] = {}
        self._same_samples: set[tuple[str, str]] = set()
        self._results: OrderedDict[str, MetricResult] = OrderedDict()

    def forget(self) -> None:
        """Drop what is remembered (a run was deleted)."""
        with self._lock:
            self._runs.clear()
            self._health.clear()
            self._same_samples.clear()
            self._results.clear()

    def committed_run(self, name: str) -> RunRecord:
        with self._lock:
            record = self._runs.get(name)
        if record is None:
            record = self.catalog.committed_run(name)
            with self._lock:
                self._runs[name] = record
        return record

    # ---- validation shared by every metric ----------------------------------------------------
    @staticmethod
    def check_layers(run: RunRecord, layers: list[int], what: str) -> list[int]:
        chosen = list(layers) if layers else list(range(run.num_layers + 1))
        bad = [layer for layer in chosen if not 0 <= layer <= run.num_layers]
        if bad:
            raise InvalidArgument(f"{what} {bad[0]} is out of range: run {run.run_key[:12]} has layers "
                                  f"0..{run.num_layers} (0 = embeddings, {run.num_layers} = last block)")
        return chosen

    def check_same_samples(self, a: RunRecord, b: RunRecord) -> None:
        if a.run_key == b.run_key or (a.run_key, b.run_key) in self._same_samples:
            return
        try:
            sim.check_same_samples(self.arrays.sample_ids(a.run_key), self.arrays.sample_ids(b.run_key))
        except ValueError as exc:
            raise InvalidArgument(f"runs {a.run_key[:12]} and {b.run_key[:12]} do not hold the same samples "
                                  f"in the same order: {exc}. Capture both models on the same dataset") from None
        if a.pooling == "tokens" or b.pooling == "tokens":
            if a.pooling != b.pooling or not np.array_equal(self.arrays.offsets(a.run_key),
                                                            self.arrays.offsets(b.run_key)):
                raise InvalidArgument("token-level comparison needs both runs tokenised identically "
                                      "(same offsets): compare pooled runs instead")
        with self._lock:
            self._same_samples.update({(a.run_key, b.run_key), (b.run_key, a.run_key)})

    def check_finite(self, run: RunRecord, layers: list[int]) -> None:
        health = self._health.get(run.run_key)
        if health is None:
            health = self._health[run.run_key] = self.catalog.chunk_health(run.run_key, run.num_layers)
        for layer in layers:
            if health.nan_count[layer] or health.inf_count[layer]:
                raise FailedPrecondition(
                    f"run {run.run_key[:12]} layer {layer} holds {health.nan_count[layer]} NaN and "
                    f"{health.inf_count[layer]} Inf values (see `actstore describe {run.run_key[:12]}`); "
                    "they are not averaged away. Exclude the layer, or capture with --dtype float32 "
                    "if float16 overflowed")

    def check_matrix(self, rows: int, cols: int) -> None:
        if rows * cols > self.settings.max_matrix_cells:
            raise ResourceExhausted(f"a {rows} x {cols} result exceeds the limit of "
                                    f"{self.settings.max_matrix_cells} cells (ACTSTORE_MAX_MATRIX_CELLS): "
                                    "ask for fewer layers")

    # ---- caching ------------------------------------------------------------------------------
    def cached_or_compute(self, metric: str, version: int, options: dict, run_keys: list[str],
                           refresh: bool, compute) -> MetricResult:
        key = result_key(metric, version, options, run_keys)
        if not refresh:
            with self._lock:
                if key in self._results:
                    self._results.move_to_end(key)
                    return self._results[key]
            stored = self.catalog.result(key)
            if stored is not None:
                payload, seconds = stored
                result = MetricResult.from_bytes(payload, Provenance(metric, version, options, run_keys, True,
                                                                     seconds, key))
                self._remember(key, result)
                return result
        started = time.perf_counter()
        arrays, scalars, notes = compute()
        seconds = time.perf_counter() - started
        result = MetricResult(arrays, scalars, Provenance(metric, version, options, run_keys, False, seconds, key),
                              notes)
        self.catalog.put_result(key, metric, version, options, run_keys, result.to_bytes(), seconds,
                                replace=refresh)
        self._remember(key, replace(result, provenance=replace(result.provenance, cached=True)))
        return result

    def _remember(self, key: str, result: MetricResult) -> None:
        with self._lock:
            self._results[key] = result
            while len(self._results) > self.RESULT_CACHE_ENTRIES:
                self._results.popitem(last=False)

    # ---- map-reduce ---------------------------------------------------------------------------
    @property
    def parts(self) -> int:
        return self.settings.metric_tasks or cluster.cluster_cpus()

    def device_task(self, function):
        """A submitter of `function` as a Ray task whose float64 products may run on a GPU: the
        task asks for `metric_gpus_per_task` of one when `metric_device` is auto or cuda and the
        cluster has GPUs, and gets `device_policy=metric_device` (`metric_tasks.task_device`
        decides in the task). Call it as `function` is called; it returns the task's ref."""
        policy = self.settings.metric_device
        gpus = cluster.cluster_gpus()
        if policy == "cuda" and not gpus:
            raise FailedPrecondition("metric_device is 'cuda' but the Ray cluster has no GPU: join a cluster "
                                     "with GPUs, or set ACTSTORE_METRIC_DEVICE=auto (GPUs when there are any)")
        share = {"num_gpus": self.settings.metric_gpus_per_task} if policy in ("auto", "cuda") and gpus else {}
        return partial(ray.remote(num_cpus=1, **share)(function).remote, device_policy=policy)

    def _map_reduce(self, rows: int, sources: list[tuple[str, list[int]]], accumulator, groups=None,
                    labels: np.ndarray | None = None):
        """Map `accumulate` over shard-aligned row groups (or the given range groups), merge."""
        groups = groups or split_ranges(rows, self.settings.shard_rows, self.parts)
        submit = self.device_task(accumulate)
        return self._reduce([submit(str(self.arrays.root), self.settings.compressor, sources, g, accumulator, labels)
                             for g in groups])

    @staticmethod
    def _reduce(refs: list):
        partials = ray.get(refs)
        total = copy.deepcopy(partials[0])  # objects from Ray's store are read-only
        for part in partials[1:]:
            total.merge(part)
        return total

    def check_memory(self, need: int, what: str) -> None:
        if need > self.settings.max_accumulator_bytes:
            raise ResourceExhausted(
                f"{what} would hold {byte_size(need)} in memory, over the "
                f"{byte_size(self.settings.max_accumulator_bytes)} limit (ACTSTORE_MAX_ACCUMULATOR_BYTES): "
                "use fewer samples")

    def _in_memory(self, run: RunRecord, layers: int, square: bool) -> None:
        """Refuse an in-memory metric whose rows (and n x n matrix) would exceed the limit."""
        self.check_memory(8 * run.rows * run.width * layers + (8 * run.rows**2 if square else 0),
                          f"this metric (whole layers{' and an n x n matrix' if square else ''}, n={run.rows})")

    # ---- similarity ---------------------------------------------------------------------------
    def similarity(self, metric: str, run_a: str, run_b: str, layers_a: list[int], layers_b: list[int],
                   center: str = "", refresh: bool = False, batch_size: int = 0, remainder: str = "",
                   k: int = 0) -> MetricResult:
        a = self.committed_run(run_a)
        b = self.committed_run(run_b) if run_b else a
        la = self.check_layers(a, layers_a, "layer")
        lb = self.check_layers(b, layers_b, "layer")
        self.check_matrix(len(la), len(lb))
        self.check_same_samples(a, b)
        self.check_finite(a, la)
        self.check_finite(b, lb)
        run_keys = [a.run_key, b.run_key]
        if metric == "cka":
            options = {"layers_a": la, "layers_b": lb}
            return self.cached_or_compute("linear_cka", sim.DEFINITION_VERSION, options, run_keys, refresh,
                                           lambda: self._cka(a, b, la, lb))
        if metric == "cos":
            center = center or "global-mean"
            if center not in ("global-mean", "none"):
                raise InvalidArgument(f"center {center!r} is not one of global-mean, none")
            if a.width != b.width:
                raise InvalidArgument(f"COS compares one sample's vectors directly, so the widths must match "
                                      f"({a.width} != {b.width}): COS is for layers of one model or of models "
                                      "of equal width; use CKA across widths")
            options = {"layers_a": la, "layers_b": lb, "center": center}
            return self.cached_or_compute("samplewise_cosine", sim.DEFINITION_VERSION, options, run_keys,
                                           refresh, lambda: self._cos(a, b, la, lb, center))
        if metric == "minibatch_cka":
            remainder = remainder or "drop"
            if batch_size < sim.MIN_HSIC_SAMPLES or batch_size > a.rows:
                raise InvalidArgument(f"batch_size {batch_size} must be between {sim.MIN_HSIC_SAMPLES} and "
                                      f"n={a.rows}")
            if remainder not in ("drop", "merge"):
                raise InvalidArgument(f"remainder {remainder!r} is not one of drop, merge")
            options = {"layers_a": la, "layers_b": lb, "batch_size": batch_size, "remainder": remainder}
            return self.cached_or_compute("minibatch_cka", sim.DEFINITION_VERSION, options, run_keys, refresh,
                                           lambda: self._minibatch(a, b, la, lb, batch_size, remainder))
        if metric == "mutual_knn":
            k = k or 10
            if not 1 <= k < a.rows:
                raise InvalidArgument(f"k={k} must be between 1 and n-1={a.rows - 1}")
            self._in_memory(a, 2, square=True)
            options = {"layers_a": la, "layers_b": lb, "k": k}

            def knn():
                task = ray.remote(num_cpus=1)(evaluate_pairs)
                values = ray.get(task.remote(str(self.arrays.root), self.settings.compressor, a.run_key, la,
                                             b.run_key, lb, partial(sim.mutual_knn, k=k)))
                return {"values": values}, {"n": float(a.rows), "k": float(k)}, []

            return self.cached_or_compute("mutual_knn", sim.DEFINITION_VERSION, options, run_keys, refresh, knn)
        raise InvalidArgument(f"similarity metric {metric!r} is not one of cka, cos, minibatch_cka, mutual_knn")

    def _minibatch(self, a: RunRecord, b: RunRecord, la: list[int], lb: list[int], batch_size: int,
                   remainder: str):
        full, short = divmod(a.rows, batch_size)
        stops = [batch_size * (i + 1) for i in range(full)]
        if short and remainder == "merge":
            stops[-1] = a.rows
        batches = list(zip([0, *stops[:-1]], stops))
        parts = max(1, min(self.parts, len(batches)))
        groups = [batches[i::parts] for i in range(parts)]
        sources, ia, ib = self._blocks(a, b, la, lb)
        widths = [a.width if run == a.run_key else b.width for run, layers in sources for _ in layers]
        pairs = [(i, j) for i in ia for j in ib]
        total = self._map_reduce(a.rows, sources, sim.MinibatchCKAAccumulator(pairs, widths), groups)
        outcome = "none" if not short else ("dropped" if remainder == "drop" else "merged")
        notes = [f"{len(batches)} batches of {batch_size} rows; the short final batch of {short} rows was "
                 f"{outcome}"] if short else [f"{len(batches)} batches of {batch_size} rows"]
        return ({"values": total.finalize().reshape(len(la), len(lb))},
                {"n": float(a.rows), "batches": float(len(batches)), "batch_size": float(batch_size)}, notes)

    def _blocks(self, a: RunRecord, b: RunRecord, la: list[int], lb: list[int]
                ) -> tuple[list[tuple[str, list[int]]], list[int], list[int]]:
        """The accumulator's blocks (as read sources) and where each requested layer sits in them."""
        if a.run_key == b.run_key:
            union = sorted(set(la) | set(lb))
            where = {layer: i for i, layer in enumerate(union)}
            return [(a.run_key, union)], [where[x] for x in la], [where[x] for x in lb]
        return ([(a.run_key, la), (b.run_key, lb)], list(range(len(la))),
                [len(la) + j for j in range(len(lb))])

    # ---- CKA: feature or Gram space --------------------------------------------------------------
    @staticmethod
    def row_itemsize(*runs: RunRecord) -> int:
        """Bytes per value of the rows a Gram-space accumulator keeps: float16 stays float16,
        float32 and bfloat16 (read back as float32) take 4."""
        return max(2 if run.dtype == "float16" else 4 for run in runs)

    def cka_mode(self, widths: list[int], rows: int, itemsize: int) -> str:
        """Feature or Gram space for a CKA accumulator over these blocks: the cheaper one whose
        memory fits `max_accumulator_bytes` (`similarity.choose_cka_mode`; the Gram strips run
        in `parts` Ray tasks, `gram_strip_map`)."""
        return sim.choose_cka_mode(widths, rows, self.settings.max_accumulator_bytes, itemsize=itemsize,
                                   strip_tasks=self.parts)

    def accumulator_nbytes(self, widths: list[int], mode: str, rows: int, itemsize: int) -> int:
        """What a CKA accumulator is held to against `max_accumulator_bytes`: the peak of its
        finalize. Feature space: the O(D^2) state plus finalize's 2 D^2 temporaries, whatever n.
        Gram space: the rows, their concatenation, the copy the strip tasks read and one Gram
        strip per task."""
        return sim.SimilarityAccumulator.estimate_peak_nbytes(widths, mode, rows, itemsize=itemsize,
                                                              strip_tasks=self.parts)

    def gram_strip_map(self, rows: np.ndarray, means: np.ndarray, widths, strips: list[tuple[int, int]]):
        """A Gram-space finalize's strips (`similarity.gram_strip_products`) in `parts` Ray tasks:
        single-threaded BLAS each, off the server process, the rows shared through Ray's object
        store. Strips are dealt largest first to the least loaded task (a strip's work grows with
        the columns right of its first row)."""
        groups: list[list[tuple[int, int]]] = [[] for _ in range(min(self.parts, len(strips)))]
        work = [0] * len(groups)
        for strip in sorted(strips, key=lambda s: -(s[1] - s[0]) * (len(rows) - s[0])):
            least = work.index(min(work))
            groups[least].append(strip)
            work[least] += (strip[1] - strip[0]) * (len(rows) - strip[0])
        rows_ref = ray.put(rows)
        submit = self.device_task(strip_products)
        return ray.get([submit(rows_ref, means, widths, group) for group in groups])

    def _tiles(self, a: RunRecord, b: RunRecord, la: list[int], lb: list[int], mode: str):
        """Split the layer lists so one tile's accumulator fits `max_accumulator_bytes`."""
        limit = self.settings.max_accumulator_bytes
        width = max(a.width, b.width)
        itemsize = self.row_itemsize(a, b)
        for group in range(max(len(la), len(lb)), 0, -1):
            if self.accumulator_nbytes([width] * (2 * group), mode, a.rows, itemsize) <= limit:
                return [(la[i:i + group], lb[j:j + group])
                        for i in range(0, len(la), group) for j in range(0, len(lb), group)]
        need = self.accumulator_nbytes([a.width, b.width], mode, a.rows, itemsize)
        raise ResourceExhausted(f"one layer pair needs {byte_size(need)} of accumulator, over the "
                                f"{byte_size(limit)} limit (ACTSTORE_MAX_ACCUMULATOR_BYTES)")

    def _cka(self, a: RunRecord, b: RunRecord, la: list[int], lb: list[int]):
        sources, _, _ = self._blocks(a, b, la, lb)
        mode = self.cka_mode([a.width if run == a.run_key else b.width for run, layers in sources for _ in layers],
                             a.rows, self.row_itemsize(a, b))
        biased = np.empty((len(la), len(lb)))
        debiased = np.empty((len(la), len(lb)))
        pos_a = {layer: i for i, layer in enumerate(la)}
        pos_b = {layer: j for j, layer in enumerate(lb)}
        tiles = self._tiles(a, b, la, lb, mode)
        for tile_a, tile_b in tiles:
            sources, ia, ib = self._blocks(a, b, tile_a, tile_b)
            widths = [a.width if run == a.run_key else b.width for run, layers in sources for _ in layers]
            total = self._map_reduce(a.rows, sources, sim.SimilarityAccumulator(widths, mode))
            matrices = total.finalize(strip_map=self.gram_strip_map)
            rows = [pos_a[x] for x in tile_a]
            cols = [pos_b[x] for x in tile_b]
            biased[np.ix_(rows, cols)] = matrices.biased[np.ix_(ia, ib)]
            debiased[np.ix_(rows, cols)] = matrices.debiased[np.ix_(ia, ib)]
        notes = [f"computed in {mode} space over {a.rows} rows in {len(tiles)} tile(s)"]
        if np.isnan(debiased).any():
            notes.append("debiased CKA is NaN where HSIC_u(K,K) or HSIC_u(L,L) is not positive")
        return {"biased": biased, "debiased": debiased}, {"n": float(a.rows)}, notes

    def _cos(self, a: RunRecord, b: RunRecord, la: list[int], lb: list[int], center: str):
        sources, ia, ib = self._blocks(a, b, la, lb)
        pairs = [(i, j) for i in ia for j in ib]
        centers = None
        if center == "global-mean":
            centers = [self.arrays.means(run)[layer] for run, layers in sources for layer in layers]
        widths = [a.width] * sum(len(layers) for _, layers in sources)
        total = self._map_reduce(a.rows, sources, sim.CosineAccumulator(pairs, widths, centers))
        stats = total.finalize()
        shape = (len(la), len(lb))
        arrays = {
            "mean": stats.mean.reshape(shape),
            "quantiles": stats.quantiles.reshape(*shape, -1),
            "quantile_levels": np.asarray(sim.QUANTILE_LEVELS),
        }
        notes = []
        if stats.zero_norm.any():
            notes.append(f"{int(stats.zero_norm.max())} samples had a zero vector; their cosine counts as 0")
        return arrays, {"n": float(stats.n)}, notes


    # ---- matrix-entropy family ----------------------------------------------------------------
    def entropy(self, metric: str, run: str, layers: list[int], *, alpha: float = 0.0, normalization: str = "",
                clamp: bool = False, convention: str = "", abs_cos: bool = False, permutations: int = 0,
                seed: int = 0, exp: bool = False, temperature: float = 0.0, refresh: bool = False) -> MetricResult:
        record = self.committed_run(run)
        chosen = self.check_layers(record, layers, "layer")
        self.check_finite(record, chosen)
        alpha = alpha or 1.0
        normalization = normalization or "raw"
        if normalization not in ("raw", "maxEntropy", "logN", "logD"):
            raise InvalidArgument(f"normalization {normalization!r} is not one of raw, maxEntropy, logN, logD")
        token_level = metric in ("prompt_entropy", "curvature")
        if token_level != (record.pooling == "tokens"):
            raise InvalidArgument(
                f"{metric} needs a {'token-level' if token_level else 'pooled'} run; run {record.run_key[:12]} is "
                f"pooled '{record.pooling}': capture with "
                f"{'--pooling tokens' if token_level else '--pooling mean (or cls/last)'}")
        options: dict[str, Any] = {"layers": chosen}
        if metric in ("dataset_entropy", "prompt_entropy", "dime", "lidar"):
            options["alpha"] = alpha
        if metric in ("dataset_entropy", "prompt_entropy"):
            options.update(normalization=normalization, clamp=clamp)
        if metric == "effective_rank":
            options["convention"] = convention or "diff-erank"
            if options["convention"] not in ("diff-erank", "roy-vetterli"):
                raise InvalidArgument(f"convention {convention!r} is not one of diff-erank, roy-vetterli")
        if metric == "curvature":
            options["abs_cos"] = abs_cos
        if metric == "dime":
            options.update(permutations=permutations or 10, seed=seed)
        if metric == "lidar":
            options["exp"] = exp
        if metric == "infonce":
            options["temperature"] = temperature or 0.1
        compute = {
            "dataset_entropy": self._dataset_entropy, "effective_rank": self._dataset_entropy,
            "prompt_entropy": self._prompt_metric, "curvature": self._prompt_metric,
            "infonce": self._invariance, "dime": self._invariance, "lidar": self._invariance,
        }.get(metric)
        if compute is None:
            raise InvalidArgument(f"entropy metric {metric!r} is unknown")
        return self.cached_or_compute(metric, ent.DEFINITION_VERSION, options, [record.run_key], refresh,
                                       lambda: compute(metric, record, chosen, options))

    def _dataset_entropy(self, metric: str, run: RunRecord, layers: list[int], options: dict):
        means = self.arrays.means(run.run_key)
        clamp_small = options.get("clamp") and run.rows <= run.width
        if clamp_small:
            self._in_memory(run, 1, square=True)
        else:
            self.check_memory(8 * run.width**2 * len(layers), f"{len(layers)} d x d scatter matrices (d={run.width})")
        if clamp_small:  # the clamped n x n Gram cannot be streamed: n <= d keeps it small
            task = ray.remote(num_cpus=1)(evaluate_layers)
            fn = partial(ent.dataset_entropy, alpha=options["alpha"], normalization=options["normalization"],
                         clamp=True)
            values = ray.get(task.remote(str(self.arrays.root), self.settings.compressor, run.run_key, layers, fn))
        else:
            accumulators = PerLayer([ent.DatasetEntropyAccumulator(means[layer]) for layer in layers])
            total = self._map_reduce(run.rows, [(run.run_key, layers)], accumulators)
            if metric == "effective_rank":
                values = [acc.effective_rank(options["convention"]) for acc in total.accumulators]
            else:
                values = [acc.finalize(options["alpha"], options["normalization"], options["clamp"])
                          for acc in total.accumulators]
        return {"values": np.asarray(values, dtype=np.float64)}, {"n": float(run.rows)}, []

    def _prompt_metric(self, metric: str, run: RunRecord, layers: list[int], options: dict):
        make = (lambda: ent.PromptEntropyAccumulator(options["alpha"], options["normalization"], options["clamp"])
                ) if metric == "prompt_entropy" else (lambda: ent.CurvatureAccumulator(options["abs_cos"]))
        offsets = self.arrays.offsets(run.run_key)
        groups = split_prompts(offsets, self.settings.shard_rows, self.parts)
        task = ray.remote(num_cpus=1)(accumulate_prompts)
        total = self._reduce([task.remote(str(self.arrays.root), self.settings.compressor, run.run_key, layers, g,
                                          PerLayer([make() for _ in layers])) for g in groups])
        first = total.accumulators[0]
        notes = [f"{first.skipped} prompts were too short and skipped"] if first.skipped else []
        return ({"values": np.asarray([acc.finalize() for acc in total.accumulators], dtype=np.float64)},
                {"prompts": float(first.count)}, notes)

    def _invariance(self, metric: str, run: RunRecord, layers: list[int], options: dict):
        data = load_dataset(Path(self.catalog.dataset(run.dataset_digest).path))
        if data.groups is None:
            raise FailedPrecondition(
                f"{metric} needs augmentation groups: register the dataset with --augment-views 2 (or a "
                "--group-column), then capture it")
        self._in_memory(run, 1, square=metric != "lidar")
        groups = np.asarray(data.groups)
        if metric == "lidar":
            fn = partial(_lidar_value, groups=groups, alpha=options["alpha"], exp=options["exp"])
            notes = []
        else:
            first, second = _first_two_views(groups)
            notes = [f"views 0 and 1 of {len(first)} groups"]
            fn = partial(_paired_value, metric=metric, first=first, second=second, options=options)
        task = ray.remote(num_cpus=1)(evaluate_layers)
        values = ray.get(task.remote(str(self.arrays.root), self.settings.compressor, run.run_key, layers, fn))
        if metric == "infonce":  # the score 1 - L/log n per layer, and the loss L itself
            return ({"values": np.asarray([v.score for v in values]), "loss": np.asarray([v.loss for v in values])},
                    {"n": float(run.rows)}, notes)
        return {"values": np.asarray(values, dtype=np.float64)}, {"n": float(run.rows)}, notes

    # ---- residual norm ratio ------------------------------------------------------------------
    def residual_norm(self, run: str, layers: list[int], refresh: bool = False) -> MetricResult:
        record = self.committed_run(run)
        chosen = list(layers) if layers else list(range(record.num_layers))
        bad = [layer for layer in chosen if not 0 <= layer < record.num_layers]
        if bad:
            raise InvalidArgument(f"layer {bad[0]} has no next layer: run {record.run_key[:12]} allows 0.."
                                  f"{record.num_layers - 1}")
        self.check_finite(record, sorted(set(chosen) | {x + 1 for x in chosen}))
        options = {"layers": chosen}

        def compute():
            read = [x for layer in chosen for x in (layer, layer + 1)]
            total = self._map_reduce(record.rows, [(record.run_key, read)], lens.ResidualNormAccumulator(len(chosen)))
            mean, quantiles = total.finalize()
            notes = ([f"{int(total.unchanged.sum())} samples had h_(l+1) == h_l (infinite ratio, excluded)"]
                     if total.unchanged.any() else [])
            return ({"mean": mean, "quantiles": quantiles, "quantile_levels": np.asarray(sim.QUANTILE_LEVELS)},
                    {"n": float(record.rows)}, notes)

        return self.cached_or_compute("residual_norm_ratio", lens.DEFINITION_VERSION, options, [record.run_key],
                                       refresh, compute)

    def result(self, result_key: str) -> MetricResult:
        stored = self.catalog.result_record(result_key)
        if stored is None:
            raise NotFound(f"no stored result {result_key[:16]}: it is still computing (watch its job) or "
                           "was never asked for")
        metric, version, options, run_keys, payload, seconds = stored
        return MetricResult.from_bytes(payload, Provenance(metric, version, options, run_keys, True, seconds,
                                                           result_key))


    # ---- logit lens and neural collapse -------------------------------------------------------
    def _labels(self, run: RunRecord) -> np.ndarray:
        labels = self.arrays.labels(run.run_key)
        if labels is None:
            raise FailedPrecondition(f"run {run.run_key[:12]}'s dataset has no labels: register it with a label "
                                     "column (or use a labelled builtin)")
        return labels

    def lens(self, run: str, epsilon: float = 0.0, taus: list[float] | None = None, heads: str = "",
             refresh: bool = False) -> MetricResult:
        record = self.committed_run(run)
        model = self.catalog.model(record.model_digest)
        if not model.has_head:
            raise FailedPrecondition(f"model {model.digest[:12]} ({model.arch}) has no head to apply: the lens "
                                     "needs a final norm + classifier or unembedding (a *ForCausalLM or "
                                     "*ForSequence/ImageClassification model)")
        heads = heads or "shared"
        if heads not in ("shared", "exits"):
            raise InvalidArgument(f"heads {heads!r} is not one of shared, exits")
        if heads == "exits" and not (Path(model.path) / "exit_heads.safetensors").exists():
            raise FailedPrecondition(f"model {model.digest[:12]} has no exit heads: heads='exits' is for models "
                                     "trained with --method multi-exit")
        self.check_finite(record, list(range(record.num_layers + 1)))
        next_token = model.kind == "causal-lm"
        if next_token and record.pooling != "tokens":
            raise InvalidArgument("the lens of a causal LM predicts each next token: capture with --pooling tokens")
        if not next_token and record.pooling not in ("cls", "last"):
            raise InvalidArgument(f"the classifier reads one position, but run {record.run_key[:12]} is pooled "
                                  f"'{record.pooling}': capture with the model's own pooling (cls for BERT/ViT)")
        labels = None if next_token else self._labels(record)
        epsilon = epsilon or 0.1
        taus = sorted(taus) if taus else [0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99]
        if not 0 < epsilon < 1 or any(not 0 <= t <= 1 for t in taus):
            raise InvalidArgument("epsilon must be in (0, 1) and every tau in [0, 1]")
        options = {"epsilon": epsilon, "taus": taus, "heads": heads}

        def compute():
            from actstore.workers.lens_tasks import LensPlan, lens_partial  # torch: only where it is needed

            plan = LensPlan(str(self.arrays.root), self.settings.compressor, record.run_key, record.num_layers + 1,
                            model.path, next_token, heads == "exits")
            groups = split_ranges(record.rows, self.settings.shard_rows, self.parts)
            submit = self.device_task(lens_partial)
            empty = lens.LensAccumulator(record.num_layers, np.asarray(taus))
            summary = self._reduce([submit(plan, g, labels, empty) for g in groups]).finalize()
            depth = {variant: float(lens.effective_depth(summary.accuracy, epsilon, variant))
                     for variant in ("absolute", "relative")}
            arrays = {
                "accuracy": summary.accuracy,
                "saturation_counts": summary.saturation_counts,
                "saturation_cumulative": summary.saturation_cumulative,
                "taus": np.asarray([row.tau for row in summary.exits]),
                "exits": np.stack([row.exits for row in summary.exits]),
                "exit_accuracy": np.asarray([row.accuracy for row in summary.exits]),
                "speedup": np.asarray([row.speedup for row in summary.exits]),
            }
            scalars = {"effective_depth": depth["absolute"], "effective_depth_relative": depth["relative"],
                       "n": float(summary.saturation_counts.sum())}
            notes = ["next-token labels; each prompt's last token has none and is left out"] if next_token else []
            return arrays, scalars, notes

        return self.cached_or_compute("logit_lens", lens.DEFINITION_VERSION, options, [record.run_key], refresh,
                                      compute)

    def neural_collapse(self, run: str, layers: list[int], rcond: float = 0.0, refresh: bool = False) -> MetricResult:
        record = self.committed_run(run)
        if record.pooling == "tokens":
            raise InvalidArgument("NC1 needs one labelled vector per sample: use a pooled run")
        chosen = self.check_layers(record, layers, "layer")
        self.check_finite(record, chosen)
        labels = self._labels(record)
        rcond = rcond or 1e-10
        options = {"layers": chosen, "rcond": rcond}

        def compute():
            empty = PerLayer([lens.NC1Accumulator() for _ in chosen])
            total = self._map_reduce(record.rows, [(record.run_key, chosen)], empty, labels=labels)
            values = np.asarray([acc.finalize(rcond) for acc in total.accumulators], dtype=np.float64)
            return {"values": values}, {"n": float(record.rows), "classes": float(len(np.unique(labels)))}, []

        return self.cached_or_compute("nc1", lens.DEFINITION_VERSION, options, [record.run_key], refresh, compute)


def _first_two_views(groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row indices of the first and second view of every group that has two."""
    first, second = {}, {}
    for row, group in enumerate(groups.tolist()):
        if group not in first:
            first[group] = row
        elif group not in second:
            second[group] = row
    paired = [g for g in first if g in second]
    if len(paired) < 2:
        raise FailedPrecondition("fewer than 2 groups have two views: augment with --augment-views 2 or more")
    return np.array([first[g] for g in paired]), np.array([second[g] for g in paired])


def _paired_value(z: np.ndarray, metric: str, first: np.ndarray, second: np.ndarray, options: dict):
    if metric == "infonce":
        return ent.infonce(z[first], z[second], options["temperature"])
    return ent.dime(z[first], z[second], options["alpha"], options["permutations"], options["seed"])


def _lidar_value(z: np.ndarray, groups: np.ndarray, alpha: float, exp: bool) -> float:
    return ent.lidar(z, groups, alpha=alpha, exp=exp)
