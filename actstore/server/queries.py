"""Metric queries over stored runs: validate, plan, map over chunks in Ray, reduce, cache.

Every answer is a `MetricResult` with its provenance. Results are stored under their result key
(metric, definition version, options, input run keys), so a repeated query is a catalog lookup.
"""

from __future__ import annotations

import copy
import io
import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray

from actstore.config import Settings
from actstore.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from actstore.metrics import similarity as sim
from actstore.store.arrays import ArrayStore
from actstore.store.catalog import Catalog, RunRecord
from actstore.store.keys import result_key
from actstore.workers import cluster
from actstore.workers.metric_tasks import accumulate, split_ranges


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
    def __init__(self, catalog: Catalog, arrays: ArrayStore, settings: Settings) -> None:
        self.catalog = catalog
        self.arrays = arrays
        self.settings = settings

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
        if a.run_key == b.run_key:
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

    def check_finite(self, run: RunRecord, layers: list[int]) -> None:
        health = self.catalog.chunk_health(run.run_key, run.num_layers)
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
    def _cached_or_compute(self, metric: str, version: int, options: dict, run_keys: list[str],
                           refresh: bool, compute) -> MetricResult:
        key = result_key(metric, version, options, run_keys)
        stored = None if refresh else self.catalog.result(key)
        if stored is not None:
            payload, seconds = stored
            return MetricResult.from_bytes(payload, Provenance(metric, version, options, run_keys, True, seconds, key))
        started = time.perf_counter()
        arrays, scalars, notes = compute()
        seconds = time.perf_counter() - started
        result = MetricResult(arrays, scalars, Provenance(metric, version, options, run_keys, False, seconds, key),
                              notes)
        self.catalog.put_result(key, metric, version, options, run_keys, result.to_bytes(), seconds)
        return result

    # ---- map-reduce ---------------------------------------------------------------------------
    def _map_reduce(self, rows: int, sources: list[tuple[str, list[int]]], accumulator):
        parts = self.settings.metric_tasks or cluster.cluster_cpus()
        groups = split_ranges(rows, self.settings.shard_rows, parts)
        task = ray.remote(num_cpus=1)(accumulate)
        refs = [task.remote(str(self.arrays.root), self.settings.compressor, sources, g, accumulator)
                for g in groups]
        partials = ray.get(refs)
        total = copy.deepcopy(partials[0])  # objects from Ray's store are read-only
        for partial in partials[1:]:
            total.merge(partial)
        return total

    # ---- similarity ---------------------------------------------------------------------------
    def similarity(self, metric: str, run_a: str, run_b: str, layers_a: list[int], layers_b: list[int],
                   center: str = "", refresh: bool = False) -> MetricResult:
        a = self.catalog.committed_run(run_a)
        b = self.catalog.committed_run(run_b) if run_b else a
        la = self.check_layers(a, layers_a, "layer")
        lb = self.check_layers(b, layers_b, "layer")
        self.check_matrix(len(la), len(lb))
        self.check_same_samples(a, b)
        self.check_finite(a, la)
        self.check_finite(b, lb)
        run_keys = [a.run_key, b.run_key]
        if metric == "cka":
            options = {"layers_a": la, "layers_b": lb}
            return self._cached_or_compute("linear_cka", sim.DEFINITION_VERSION, options, run_keys, refresh,
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
            return self._cached_or_compute("samplewise_cosine", sim.DEFINITION_VERSION, options, run_keys,
                                           refresh, lambda: self._cos(a, b, la, lb, center))
        raise InvalidArgument(f"similarity metric {metric!r} is not one of cka, cos")

    def _blocks(self, a: RunRecord, b: RunRecord, la: list[int], lb: list[int]
                ) -> tuple[list[tuple[str, list[int]]], list[int], list[int]]:
        """The accumulator's blocks (as read sources) and where each requested layer sits in them."""
        if a.run_key == b.run_key:
            union = sorted(set(la) | set(lb))
            where = {layer: i for i, layer in enumerate(union)}
            return [(a.run_key, union)], [where[x] for x in la], [where[x] for x in lb]
        return ([(a.run_key, la), (b.run_key, lb)], list(range(len(la))),
                [len(la) + j for j in range(len(lb))])

    def _tiles(self, a: RunRecord, b: RunRecord, la: list[int], lb: list[int], mode: str):
        """Split the layer lists so one tile's accumulator fits `max_accumulator_bytes`."""
        limit = self.settings.max_accumulator_bytes
        width = max(a.width, b.width)
        for group in range(max(len(la), len(lb)), 0, -1):
            if sim.SimilarityAccumulator.estimate_nbytes([width] * (2 * group), mode, a.rows) <= limit:
                return [(la[i:i + group], lb[j:j + group])
                        for i in range(0, len(la), group) for j in range(0, len(lb), group)]
        need = sim.SimilarityAccumulator.estimate_nbytes([a.width, b.width], mode, a.rows)
        raise ResourceExhausted(f"one layer pair needs {need / 2**30:.2f} GiB of accumulator, over the "
                                f"{limit / 2**30:.2f} GiB limit (ACTSTORE_MAX_ACCUMULATOR_BYTES)")

    def _cka(self, a: RunRecord, b: RunRecord, la: list[int], lb: list[int]):
        mode = "gram" if a.rows <= max(a.width, b.width) else "feature"
        biased = np.empty((len(la), len(lb)))
        debiased = np.empty((len(la), len(lb)))
        pos_a = {layer: i for i, layer in enumerate(la)}
        pos_b = {layer: j for j, layer in enumerate(lb)}
        tiles = self._tiles(a, b, la, lb, mode)
        for tile_a, tile_b in tiles:
            sources, ia, ib = self._blocks(a, b, tile_a, tile_b)
            widths = [a.width if run == a.run_key else b.width for run, layers in sources for _ in layers]
            total = self._map_reduce(a.rows, sources, sim.SimilarityAccumulator(widths, mode))
            matrices = total.finalize()
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

