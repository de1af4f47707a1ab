"""What the client returns: numpy arrays in small dataclasses, never raw protos. The records the
server describes too (provenance, metric answers, scrub damage, garbage) come from
`actstore.records`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from actstore._proto.actstore.v1 import actstore_pb2 as pb
from actstore.client import plots
from actstore.client.display import Shown, Summary, Tabled, bounds_text, layer_span, metric_bounds, value_range
from actstore.client.frames import layer_frame, matrix_frame
from actstore.records import Damage, GarbageItem, MetricAnswer, Provenance, RunName, RunSummary
from actstore.wire import from_ndarray


def provenance(p: pb.Provenance) -> Provenance:
    """The provenance of an answer, from its proto."""
    names = [RunName(n.run_key, n.model, n.dataset, n.pooling, n.site) for n in p.run_names]
    return Provenance(p.metric, p.definition_version, json.loads(p.options_json or "{}"), list(p.run_keys),
                      p.cached, p.seconds, p.result_key, names,
                      p.error_bound if p.HasField("error_bound") else None)


@dataclass(frozen=True)
class ModelInfo(Tabled):
    digest: str
    aliases: list[str]
    kind: str
    arch: str
    num_layers: int
    hidden_size: int
    has_head: bool
    lineage: dict = field(default_factory=dict)  # source; for trained checkpoints recipe, method, seed, step, parent

    @staticmethod
    def from_proto(m: pb.Model) -> ModelInfo:
        return ModelInfo(m.digest, list(m.aliases), m.kind, m.arch, m.num_layers, m.hidden_size, m.has_head,
                         json.loads(m.lineage_json or "{}"))


@dataclass(frozen=True)
class DatasetInfo(Tabled):
    digest: str
    aliases: list[str]
    kind: str
    n: int
    num_labels: int
    has_groups: bool
    source: dict

    @staticmethod
    def from_proto(d: pb.Dataset) -> DatasetInfo:
        return DatasetInfo(d.digest, list(d.aliases), d.kind, d.n, d.num_labels, d.has_groups,
                           json.loads(d.source_json or "{}"))


@dataclass(frozen=True)
class LayerHealth:
    layer: int
    nan_count: int
    inf_count: int
    min: float
    max: float
    # running statistics of the stored numbers (None for runs captured before they existed)
    mean: float | None = None  # over rows and features
    std: float | None = None
    norm_mean: float | None = None  # of each row's L2 norm
    norm_std: float | None = None

    @staticmethod
    def from_proto(h: pb.LayerHealth) -> LayerHealth:
        stats = (h.mean, h.std, h.norm_mean, h.norm_std) if h.has_stats else (None,) * 4
        return LayerHealth(h.layer, h.nan_count, h.inf_count, h.min, h.max, *stats)


@dataclass(frozen=True)
class LayerRounding:
    """What a lossy storage dtype did to one layer, measured at capture from the exact values:
    `bound_biased` / `bound_debiased` bound every (biased / debiased) CKA answer with the layer, with
    probability >= 99.95% over the capture's stochastic rounding (`metrics.rounding.SIDE_CONFIDENCE`);
    `angle_biased` / `angle_debiased` are the sure bounds, never smaller."""

    layer: int
    stored: str
    rows: int
    rel_frobenius: float
    max_abs: float
    cka_biased: float
    cka_debiased: float
    angle_biased: float
    angle_debiased: float
    bound_biased: float
    bound_debiased: float

    @staticmethod
    def from_proto(r: pb.LayerRounding) -> LayerRounding:
        return LayerRounding(r.layer, r.stored, r.rows, r.rel_frobenius, r.max_abs, r.cka_biased, r.cka_debiased,
                             r.angle_biased, r.angle_debiased, r.bound_biased, r.bound_debiased)


@dataclass(frozen=True)
class RunInfo(RunSummary, Tabled):
    """A run as `runs` lists it and `describe` shows it: its summary, how many of its shards are
    recorded, its size on disk, per-layer health and rounding, and the aliases of its model and dataset."""

    recorded_shards: int
    stored_bytes: int = 0
    health: list[LayerHealth] = field(default_factory=list, repr=False)  # one per layer: long
    model_aliases: list[str] = field(default_factory=list)
    dataset_aliases: list[str] = field(default_factory=list)
    site: str = "resid_post"  # the capture site (see `actstore capture --help`)
    site_modules: str = ""  # the module pattern the site resolved to (empty for resid_post)
    # a lossy (int8) run's error figures, one per layer (`describe`; empty for exact dtypes)
    rounding: list[LayerRounding] = field(default_factory=list, repr=False)

    @staticmethod
    def from_proto(r: pb.Run) -> RunInfo:
        return RunInfo(r.run_key, r.model_digest, r.dataset_digest, r.pooling, r.dtype, r.max_len, r.n, r.rows,
                       r.num_layers, r.width, r.num_shards, r.status, r.recorded_shards, r.stored_bytes,
                       [LayerHealth.from_proto(h) for h in r.health],
                       list(r.model_aliases), list(r.dataset_aliases), r.site or "resid_post", r.site_modules,
                       [LayerRounding.from_proto(x) for x in r.rounding])


@dataclass(frozen=True)
class JobInfo(Tabled):
    job_id: str
    kind: str
    status: str
    target: str
    done: int
    total: int
    unit: str
    error: str
    error_code: str
    cache_hit: bool
    joined: bool
    message: str = ""
    run_keys: tuple[str, ...] = ()  # a capture: the run of each of its sites
    sites: tuple[str, ...] = ()

    @property
    def finished(self) -> bool:
        return self.status in ("done", "failed", "cancelled", "interrupted")

    @staticmethod
    def from_proto(j: pb.Job, message: str = "") -> JobInfo:
        return JobInfo(j.job_id, j.kind, j.status, j.target, j.done, j.total, j.unit, j.error, j.error_code,
                       j.cache_hit, j.joined, message, tuple(j.run_keys), tuple(j.sites))


@dataclass(frozen=True)
class CaptureResult:
    run_key: str  # the first site's run
    job: JobInfo

    @property
    def runs(self) -> dict[str, str]:
        """site -> run key, for every site of the capture."""
        return dict(zip(self.job.sites, self.job.run_keys)) or {"resid_post": self.run_key}

    @property
    def cache_hit(self) -> bool:
        return self.job.cache_hit


class QueryAnswer(MetricAnswer):
    """Any metric's answer (`records.MetricAnswer`), decoded from the wire."""

    @staticmethod
    def from_proto(r: pb.QueryResult) -> QueryAnswer:
        return QueryAnswer({k: from_ndarray(v) for k, v in r.arrays.items()}, dict(r.scalars),
                           provenance(r.provenance), list(r.notes))


@dataclass(frozen=True, repr=False)
class CKAResult(Shown):
    """Linear CKA between layers_a of run A (rows) and layers_b of run B (columns)."""

    matrix = True

    biased: np.ndarray
    debiased: np.ndarray
    layers_a: list[int]
    layers_b: list[int]
    n: int
    provenance: Provenance
    notes: list[str]
    # over a lossy (int8) run: each entry's bound on |CKA - the CKA of the exact values| (None: exact runs)
    bound_biased: np.ndarray | None = None
    bound_debiased: np.ndarray | None = None

    def to_pandas(self, *, debiased: bool = False):
        """Long format: layer_a, layer_b, value (biased CKA, or debiased)."""
        return matrix_frame(self.debiased if debiased else self.biased, self.layers_a, self.layers_b)

    def plot(self, ax=None, *, debiased: bool = False, show: str = "matrix", **style):
        """Draw linear CKA (biased, or `debiased`) on `ax` (a new figure's when None); returns the Axes.
        show="matrix": the heatmap, run A's layers as rows (bottom up) and run B's as columns, each
        named by its model, colour scale [0, 1] (debiased: its minimum to 1), values printed on a
        small matrix. show="to_last": a curve of each layer of A against the last layer of B given.
        `style` goes to imshow (cmap, vmin, vmax) or to the curve's plot (color, label, ...)."""
        values = self.debiased if debiased else self.biased
        if plots.choose(show, ("matrix", "to_last")) == "to_last":
            return plots.to_last(ax, values, self.provenance, self.layers_a, "CKA", **style)
        name = f"linear CKA ({'debiased' if debiased else 'biased'}), n={self.n}"
        return plots.layer_matrix(ax, values, self.provenance, self.layers_a, self.layers_b, name,
                                  vmin=None if debiased else 0.0, **style)

    def summary(self) -> Summary:
        return Summary(f"linear CKA, {len(self.layers_a)} x {len(self.layers_b)} layers", self.provenance,
                       [("n", str(self.n)), ("biased", value_range(self.biased)),
                        ("debiased", value_range(self.debiased))], self.notes)


@dataclass(frozen=True, repr=False)
class COSResult(Shown):
    """Sample-wise cosine similarity: the mean and quantiles over samples, per layer pair."""

    matrix = True

    mean: np.ndarray
    quantiles: np.ndarray  # (len(layers_a), len(layers_b), len(quantile_levels))
    quantile_levels: np.ndarray
    layers_a: list[int]
    layers_b: list[int]
    n: int
    provenance: Provenance
    notes: list[str]

    def to_pandas(self):
        """Long format: layer_a, layer_b, value (the mean cosine)."""
        return matrix_frame(self.mean, self.layers_a, self.layers_b)

    def plot(self, ax=None, *, show: str = "matrix", **style):
        """Draw the mean sample-wise cosine on `ax` (a new figure's when None); returns the Axes.
        show="matrix": the heatmap, run A's layers as rows and run B's as columns, colour scale
        from its minimum to 1. show="to_last": each layer of A against the last layer of B given,
        with the band between the 25% and 75% quantiles over samples."""
        if plots.choose(show, ("matrix", "to_last")) == "to_last":
            band = plots.quartiles(self.quantile_levels, self.quantiles[:, -1])
            return plots.to_last(ax, self.mean, self.provenance, self.layers_a, "COS", band=band, **style)
        return plots.layer_matrix(ax, self.mean, self.provenance, self.layers_a, self.layers_b,
                                  f"mean sample-wise cosine, n={self.n}", vmin=None, **style)

    def summary(self) -> Summary:
        return Summary(f"sample-wise cosine, {len(self.layers_a)} x {len(self.layers_b)} layers", self.provenance,
                       [("n", str(self.n)), ("mean", value_range(self.mean)),
                        ("quantiles", ", ".join(f"{q:g}" for q in self.quantile_levels))], self.notes)


@dataclass(frozen=True, repr=False)
class MatrixResult(Shown):
    """A layers_a x layers_b matrix of one metric (minibatch CKA, mutual kNN, any measure)."""

    matrix = True

    values: np.ndarray
    layers_a: list[int]
    layers_b: list[int]
    scalars: dict[str, float]
    provenance: Provenance
    notes: list[str]

    def to_pandas(self):
        """Long format: layer_a, layer_b, value."""
        return matrix_frame(self.values, self.layers_a, self.layers_b)

    def plot(self, ax=None, **style):
        """Draw the metric's layers_a x layers_b heatmap on `ax` (a new figure's when None), run A's
        layers as rows and run B's as columns, the colour scale the metric's registered bounds
        where it has them (else the values' range); returns the Axes."""
        low, high = metric_bounds(self.provenance.metric)
        n = f", n={int(self.scalars['n'])}" if "n" in self.scalars else ""
        return plots.layer_matrix(ax, self.values, self.provenance, self.layers_a, self.layers_b,
                                  f"{self.provenance.metric}{n}", vmin=low, vmax=high, **style)

    def summary(self) -> Summary:
        return Summary(f"{self.provenance.metric}, {len(self.layers_a)} x {len(self.layers_b)} layers",
                       self.provenance, [("values", value_range(self.values)),
                                         ("bounds", bounds_text(metric_bounds(self.provenance.metric)))],
                       self.notes)


@dataclass(frozen=True, repr=False)
class LayerValues(Shown):
    """One value per layer (the entropy family, NC1)."""

    values: np.ndarray
    layers: list[int]
    scalars: dict[str, float]
    provenance: Provenance
    notes: list[str]

    def to_pandas(self):
        """layer, value."""
        return layer_frame(self.values, self.layers)

    def plot(self, ax=None, *, label: str | None = None, relative: bool = False, **style):
        """Draw the metric's value per layer as a curve on `ax` (a new figure's when None), labelled
        `label` (default: the run's model); `relative` puts layer / last layer on the x axis (models
        of other depths on one Axes). Returns the Axes."""
        return plots.per_layer(ax, self.layers, self.values, self.provenance, self.provenance.metric,
                               label_text=label, relative=relative, **style)

    def summary(self) -> Summary:
        return Summary(f"{self.provenance.metric} over layers {layer_span(self.layers)}", self.provenance,
                       [("values", value_range(self.values))], self.notes)


@dataclass(frozen=True, repr=False)
class LayerDistribution(Shown):
    """Per layer: the mean and quantiles of a per-sample quantity (the residual norm ratio)."""

    mean: np.ndarray
    quantiles: np.ndarray  # (layers, len(quantile_levels))
    quantile_levels: np.ndarray
    layers: list[int]
    provenance: Provenance
    notes: list[str]

    def plot(self, ax=None, *, label: str | None = None, relative: bool = False, **style):
        """Draw the per-sample mean per layer as a curve with the band between the 25% and 75%
        quantiles over samples on `ax` (a new figure's when None), labelled `label` (default: the
        run's model); `relative`: layer / last layer on the x axis. Returns the Axes."""
        return plots.per_layer(ax, self.layers, self.mean, self.provenance, self.provenance.metric,
                               band=plots.quartiles(self.quantile_levels, self.quantiles), label_text=label,
                               relative=relative, **style)

    def summary(self) -> Summary:
        return Summary(f"{self.provenance.metric} over layers {layer_span(self.layers)}", self.provenance,
                       [("mean", value_range(self.mean)),
                        ("quantiles", ", ".join(f"{q:g}" for q in self.quantile_levels))], self.notes)


@dataclass(frozen=True, repr=False)
class CKAMatrixResult(Shown):
    """The cross-model CKA matrix: block i is layer block_layer[i] of run runs[block_run[i]]."""

    matrix = True

    biased: np.ndarray
    debiased: np.ndarray
    block_run: np.ndarray
    block_layer: np.ndarray
    runs: list[str]
    provenance: Provenance
    notes: list[str]
    bound_biased: np.ndarray | None = None  # as CKAResult's, block by block
    bound_debiased: np.ndarray | None = None

    def block(self, run_a: int, run_b: int, *, debiased: bool = False) -> np.ndarray:
        """The (L_a+1) x (L_b+1) sub-matrix between two of the runs (by position)."""
        matrix = self.debiased if debiased else self.biased
        return matrix[np.ix_(self.block_run == run_a, self.block_run == run_b)]

    def to_pandas(self, *, debiased: bool = False):
        """Long format: run_a, layer_a, run_b, layer_b, value, one row per pair of blocks."""
        runs = np.asarray(self.runs)[self.block_run]
        return matrix_frame(self.debiased if debiased else self.biased, self.block_layer, self.block_layer,
                            run_a=runs[:, None], run_b=runs[None, :])

    def plot(self, ax=None, *, debiased: bool = False, **style):
        """Draw the CKA (biased, or `debiased`) of every layer of every run against every other as
        one heatmap on `ax` (a new figure's when None): ticks model:layer, lines between the runs'
        blocks, colour scale [0, 1] (debiased: its minimum to 1). Returns the Axes."""
        values = self.debiased if debiased else self.biased
        return plots.block_matrix(ax, values, self.block_run, self.block_layer, self.provenance,
                                  f"linear CKA ({'debiased' if debiased else 'biased'})",
                                  vmin=None if debiased else 0.0, vmax=1.0, **style)

    def summary(self) -> Summary:
        return Summary(f"linear CKA matrix, {len(self.block_run)} layers of {len(self.runs)} runs", self.provenance,
                       [("biased", value_range(self.biased)), ("debiased", value_range(self.debiased))], self.notes,
                       pairwise=False)


@dataclass(frozen=True, repr=False)
class LensResult(Shown):
    """Logit lens over layers 0..L: accuracy, saturation layers, effective depth, exit sweep."""

    accuracy: np.ndarray
    saturation_counts: np.ndarray
    saturation_cumulative: np.ndarray
    effective_depth: int
    effective_depth_relative: int
    taus: np.ndarray
    exits: np.ndarray  # (taus, L): samples exiting at layers 1..L
    exit_accuracy: np.ndarray
    speedup: np.ndarray
    n: int
    provenance: Provenance
    notes: list[str]

    def plot(self, ax=None, *, show: str = "accuracy", label: str | None = None, relative: bool = False, **style):
        """Draw on `ax` (a new figure's when None) and return the Axes. show="accuracy": the lens
        accuracy per layer, a dotted line at the epsilon-effective depth (relative to the last
        layer); "saturation": a bar per layer of the predictions whose top-1 is fixed from that
        layer on; "exits": the multi-exit sweep, exit accuracy against speed-up, each point its
        threshold tau. `label` names the curve (default: the run's model); `relative`: layer /
        last layer on the accuracy's x axis."""
        return plots.lens(ax, self, plots.choose(show, ("accuracy", "saturation", "exits")), label, relative,
                          **style)

    def summary(self) -> Summary:
        return Summary(f"logit lens over layers 0..{len(self.accuracy) - 1}", self.provenance,
                       [("n", str(self.n)), ("accuracy at the last layer", f"{self.accuracy[-1]:.4f}"),
                        ("effective depth", f"{self.effective_depth} (absolute), {self.effective_depth_relative} "
                                            "(relative)")], self.notes)


@dataclass(frozen=True)
class BackupInfo:
    """A catalog backup the server made: its path on the server, its size, and every backup kept."""

    path: str
    bytes: int
    kept: list[str]


@dataclass(frozen=True)
class RunVerdict:
    run_key: str
    status: str  # ok | damaged | repaired | incomplete (not committed: its capture must finish)
    shards: int  # shards read
    damage: list[Damage]
    damaged_shards: list[int]
    recapture: bool  # submit the run's capture again (after a repair: only its damaged shards)
    run_status: str  # the catalog's status of the run after the job (deleted: capture it whole)


@dataclass(frozen=True)
class VerifyReport:
    """What `actstore verify` found: one verdict per run."""

    job_id: str
    repair: bool
    runs: list[RunVerdict]

    @property
    def damaged(self) -> list[RunVerdict]:
        return [r for r in self.runs if r.damage]

    @property
    def recapture(self) -> list[str]:
        """The run keys whose capture must be submitted again."""
        return [r.run_key for r in self.runs if r.recapture]

    @staticmethod
    def from_proto(p: pb.VerifyReport) -> VerifyReport:
        return VerifyReport(p.job_id, p.repair, [
            RunVerdict(r.run_key, r.status, r.shards, [Damage(d.array, d.shard, d.layer, d.reason) for d in r.damage],
                       list(r.damaged_shards), r.recapture, r.run_status) for r in p.runs])


@dataclass(frozen=True)
class GarbageReport:
    """What `gc` removed (`applied`) or would remove (a dry run), and what it kept on purpose."""

    items: list[GarbageItem]
    applied: bool
    total_bytes: int
    kept: list[str]

    @staticmethod
    def from_proto(r: pb.CollectGarbageResponse) -> GarbageReport:
        return GarbageReport([GarbageItem(g.kind, g.name, g.bytes, g.reason) for g in r.items], r.applied,
                             r.total_bytes, list(r.kept))
