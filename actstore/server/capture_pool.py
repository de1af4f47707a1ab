"""Warm model replicas for capture jobs.

Starting a replica costs a process, the torch import and the model load (seconds), so replicas
outlive a job and serve the next capture of the same model. Idle replicas are released after
`actor_idle_seconds`; on a GPU cluster, idle replicas of other models are released first, so a
new model gets a GPU. CPU replicas reserve no logical CPU: metric tasks can always be scheduled
beside an idle replica.

On a GPU cluster each GPU holds `capture_replicas_per_gpu` replicas (default 1; each a share of
it): a replica is one Python thread launching the forward's kernels, and for a small model that
thread, not the GPU, can set the pace. Each replica works on `gpu_capture_tasks` tasks at once,
one of them on the GPU, the others tokenising or waiting for their shards' writes, which its
writer threads make (`gpu_writes`, `gpu_writer_threads`: by default its share of the CPUs beside
its GPU, less two).

A token-level capture's layout (its token count per prompt) is read from the store where a capture
of the same model, dataset and max_len laid it out before (`workers.layouts`), and else comes from
the one warm `TokenLayouts` process that every server of this process asks, which keeps the
tokenizers it loaded.

On a CPU cluster the replicas of a model are placed by one Ray placement group with a bundle per
replica and the SPREAD strategy: Ray's control store, which sees every node that has joined, places
the bundles (one per node when there are as many replicas as nodes; more: dealt evenly) before any
replica starts, and each replica starts in its bundle, so a replica is never started on a node it
was not meant for and never killed to be moved. A bundle holds a token amount of Ray's logical
"memory" resource (Ray refuses an empty bundle) and no CPU, so metric tasks keep every CPU.

Replicas also outlive their pool: a stopped server's idle CPU replicas are parked in its process
(`_Parked`) for `actor_idle_seconds`, and the next pool of that process on the same Ray cluster
with the same replica settings takes them for the same model (or, finding none parked, borrows
another live pool's idle ones: two servers of one process then pass one set between them)
instead of starting its own, once `ShardCapturer.serve_store` checked that its store's copy of the
model has the same files beside the weights. A server reopened in a notebook, or the next test's
server, saves the ~7 CPU-s a replica costs to start (a process, the torch import, the model load;
a capture on a warm replica of a tiny model costs ~0.3). GPU replicas are neither parked nor
lent: they hold their GPU, and end with their pool.

A warm pool never hands out a lost replica: one that died, or whose node left the cluster (Ray
restarts such a replica elsewhere, and while it restarts its tasks fail). An idle pool with a lost
replica is started afresh, by the same placement rule over the nodes alive now.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import threading
import time
import weakref
from dataclasses import dataclass, field

import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from actstore.config import Settings
from actstore.errors import Unavailable
from actstore.server.token_layouts import SharedLayouts
from actstore.store.handle import StoreHandle
from actstore.workers import cluster
from actstore.workers.layouts import model_layout_key, stored_layout

log = logging.getLogger(__name__)

# what each CPU replica's bundle holds: Ray needs some resource in a bundle, and no task of ours asks
# for logical "memory", so 1 MiB of it reserves nothing that anything here waits for
REPLICA_BUNDLE = {"memory": 2**20}
GPU_RELEASE_SECONDS = 10.0  # how long `release_idle_gpus` waits for Ray to count the released GPUs free


def gpus_free_within(wanted: float, seconds: float) -> float:
    """The GPUs Ray counts free, once `wanted` are or `seconds` have passed (it frees a killed
    actor's or a finished task's resources a moment after)."""
    deadline = time.monotonic() + seconds
    while (free := ray.available_resources().get("GPU", 0.0)) < wanted and time.monotonic() < deadline:
        time.sleep(0.05)
    return free


@dataclass
class _Replicas:
    actors: list
    names: list[str]  # their Ray names (one adopted from a stopped pool keeps the name it started with)
    placed: list  # each replica's node_id() ref, asked once it started: the node it was placed on
    gpus: float  # the GPUs they hold together (0 on a CPU cluster)
    group: PlacementGroup | None  # the bundles the CPU replicas are placed in (None on a GPU cluster)
    busy: int = 0
    pinned: bool = False  # a model of `warm_models`: never released for idling
    last_used: float = field(default_factory=time.monotonic)


def _lost(entry: _Replicas) -> list[bool]:
    """Which replicas are lost: dead (their name is free again), or placed on a node that is no
    longer alive. A replica still loading its model is not judged yet."""
    names = set(ray.util.list_named_actors())
    alive = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
    answered, _ = ray.wait(entry.placed, num_returns=len(entry.placed), timeout=0)
    lost = []
    for name, ref in zip(entry.names, entry.placed):
        try:
            gone = ref in answered and ray.get(ref) not in alive
        except ray.exceptions.RayError:  # it died before answering
            gone = True
        lost.append(gone or name not in names)
    return lost


def _end(entry: _Replicas) -> None:
    with _Parked.lock:
        _Parked.names_in_use.difference_update(entry.names)
    if not ray.is_initialized():  # the cluster went first, and its actors with it
        return
    for actor in entry.actors:
        ray.kill(actor)
    if entry.group is not None:
        remove_placement_group(entry.group)


class _Parked:
    """The idle CPU replicas that stopped pools of this process left, by (Ray job, model digest,
    replica settings), each ended after its idle time unless a pool takes it first. Also the names
    of every replica a pool of this process holds, so a pool never starts one under a name that an
    adopted replica still carries."""

    lock = threading.Lock()
    entries: dict[tuple, tuple[_Replicas, threading.Timer]] = {}
    names_in_use: set[str] = set()
    pools: weakref.WeakSet[CapturePool] = weakref.WeakSet()  # the live pools of this process

    @classmethod
    def borrow(cls, key: tuple, asking: CapturePool) -> _Replicas | None:
        """Idle replicas of ``key`` that another live pool of this process hands over."""
        with cls.lock:
            others = [pool for pool in cls.pools if pool is not asking]
        return next((entry for pool in others if (entry := pool.give(key)) is not None), None)

    @classmethod
    def park(cls, key: tuple, entry: _Replicas, seconds: float) -> None:
        timer = threading.Timer(seconds, cls._expire, (key, entry))
        timer.daemon = True
        with cls.lock:
            previous = cls.entries.pop(key, None)
            cls.entries[key] = (entry, timer)
        if previous is not None:  # two stopped pools of one model: one set of replicas is enough
            previous[1].cancel()
            _end(previous[0])
        timer.start()

    @classmethod
    def take(cls, key: tuple) -> _Replicas | None:
        with cls.lock:
            found = cls.entries.pop(key, None)
        if found is None:
            return None
        found[1].cancel()
        return found[0]

    @classmethod
    def _expire(cls, key: tuple, entry: _Replicas) -> None:
        with cls.lock:
            if cls.entries.get(key, (None,))[0] is not entry:
                return  # taken (or replaced) meanwhile
            del cls.entries[key]
        _end(entry)


class CapturePool:
    def __init__(self, store: StoreHandle, settings: Settings) -> None:
        self.store = store
        self.settings = settings  # replica_start_seconds, capture_actors, actor_idle_seconds, the gpu_* ...
        # actor names are global to the Ray cluster: another server (another store) has its own replicas
        tag = hashlib.sha256(store.root.encode()).hexdigest()[:8]
        self._prefix = f"capture-{tag}"
        self._lock = threading.Lock()
        self._pool: dict[str, _Replicas] = {}
        self._warm: set[str] = set()  # models whose replicas stay however long they idle
        self._stop = threading.Event()
        self.layouts_asked = 0  # layouts this pool asked the process's `TokenLayouts` for
        self._reaper = threading.Thread(target=self._reap_forever, name="capture-pool-reaper", daemon=True)
        self._reaper.start()
        with _Parked.lock:
            _Parked.pools.add(self)

    def acquire(self, digest: str, model_path: str) -> tuple[list, int]:
        """The model's replicas (started now if none are warm) and how many tasks each works on at once."""
        with self._lock:
            entry = self._pool.get(digest)
            lost = _lost(entry) if entry is not None else []
            if any(lost) and entry.busy == 0:
                log.info("capture replicas of model %s: %d of %d lost (died, or their node left); starting "
                         "them afresh", digest[:12], sum(lost), len(lost))
                self._kill(digest)
                entry = None
            if entry is None and (entry := self._adopt(digest, model_path)) is not None:
                lost = [False] * len(entry.actors)
            if entry is None:
                gpus = cluster.cluster_gpus()
                if gpus:
                    self._release_idle(keep=digest, older_than=0.0)
                    self._await_free_gpus(digest, gpus)
                # no logical CPU for a GPU replica either: its writer threads (or one-CPU write tasks)
                # use its node's CPUs while it works, and a warm replica holding them would keep
                # metric tasks off the node while it idles
                gpu = {"num_gpus": 1 / self.settings.capture_replicas_per_gpu, "num_cpus": 0}
                group, placements = (None, [(gpu, None)] * (gpus * self.settings.capture_replicas_per_gpu)) if gpus \
                    else self._cpu_placements(digest)
                started = [self._start(digest, i, model_path, resources, threads)
                           for i, (resources, threads) in enumerate(placements)]
                names, actors = [name for name, _ in started], [actor for _, actor in started]
                if gpus:
                    try:
                        self._await_gpu_replicas(digest, actors)
                    except Unavailable:  # killed there
                        with _Parked.lock:
                            _Parked.names_in_use.difference_update(names)
                        raise
                entry = self._pool[digest] = _Replicas(actors, names, [actor.node_id.remote() for actor in actors],
                                                       gpus, group, pinned=digest in self._warm)
                lost = [False] * len(actors)
            entry.busy += 1
            # in use by another job, the lost ones stay until it ends (its retries go around them)
            live = [actor for actor, gone in zip(entry.actors, lost) if not gone] or list(entry.actors)
            return live, self.tasks_per_replica(on_gpu=bool(entry.gpus))

    def warm(self, digest: str, model_path: str) -> None:
        """Start the model's replicas now and keep them however long they idle (`warm_models`);
        replicas started afresh later (lost ones) are kept too."""
        with self._lock:
            self._warm.add(digest)
        self.acquire(digest, model_path)
        self.release(digest)

    def _parking_key(self, digest: str) -> tuple:
        """What a parked replica must match to be taken: the Ray job (a new cluster's job has none of
        the old one's actors), the model and the settings its actor was started with."""
        settings = self.settings
        return (ray.get_runtime_context().get_job_id(), digest, settings.capture_actors,
                settings.capture_concurrent_shards)

    def _adopt(self, digest: str, model_path: str) -> _Replicas | None:
        """The replicas of ``digest`` a stopped pool of this process parked, now serving this store;
        None when there are none (or any is lost, or loaded another copy of the model: ended)."""
        key = self._parking_key(digest)
        entry = _Parked.take(key) or _Parked.borrow(key, self)
        if entry is None:
            return None
        try:
            served = not any(_lost(entry)) and all(ray.get(
                [actor.serve_store.remote(self.store, model_path) for actor in entry.actors],
                timeout=self.settings.replica_start_seconds))
        except ray.exceptions.RayError:  # died meanwhile, or answered too late: start afresh
            served = False
        if not served:
            _end(entry)
            return None
        log.info("capture replicas of model %s: %d taken warm from another server of this process",
                 digest[:12], len(entry.actors))
        entry.busy, entry.pinned, entry.last_used = 0, digest in self._warm, time.monotonic()
        self._pool[digest] = entry
        return entry

    def give(self, key: tuple) -> _Replicas | None:
        """This pool's idle CPU replicas of ``key``'s model, handed to another pool of this process
        that needs them now (`_Parked.borrow`); None when they are busy, warm (`warm_models`), on
        GPUs, of other settings, or this pool is busy itself (never waited for: two pools asking
        each other must not block)."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            digest = key[1]
            entry = self._pool.get(digest)
            if entry is None or entry.busy or entry.gpus or entry.pinned or self._parking_key(digest) != key:
                return None
            return self._pool.pop(digest)
        finally:
            self._lock.release()

    def _start(self, digest: str, replica: int, model_path: str, resources: dict, threads: int | None):
        from actstore.workers.capture import ShardCapturer

        # a CPU replica computes each of its tasks at once on its share of the cores (ShardCapturer);
        # a GPU replica one at a time, and writes its shards on its node's other CPUs
        forwards = min(self.settings.capture_concurrent_shards, threads) if threads else 1
        on_gpu = "num_gpus" in resources
        writes, writers = (self.settings.gpu_writes, self._writer_threads()) if on_gpu else ("inline", 1)
        # soft placement: a replica whose node dies restarts on another (max_restarts), and
        # Ray retries the shard it was writing (max_task_retries): whole shards, written once more
        base = self.actor_name(digest, replica)
        with _Parked.lock:
            # the name may be held by a replica another pool of this process took from a stopped
            # server of this store: this one is told apart
            names = itertools.chain([base], (f"{base}-{n}" for n in itertools.count(1)))
            name = next(name for name in names if name not in _Parked.names_in_use)
            _Parked.names_in_use.add(name)
        try:
            self._await_name_free(name)  # a replica killed just now (replaced, or of a failed job) has it still
            return name, ray.remote(ShardCapturer).options(
                name=name, max_restarts=2, max_task_retries=2,
                max_concurrency=self.tasks_per_replica(on_gpu=on_gpu), **resources,
            ).remote(model_path, self.store, threads, forwards, writes, writers)
        except BaseException:
            with _Parked.lock:
                _Parked.names_in_use.discard(name)
            raise

    def _writer_threads(self) -> int:
        """The threads a GPU replica writes with (`gpu_writer_threads`; 0: its share of the CPUs
        beside its GPU, less the thread launching the forward's kernels and one for the rest)."""
        settings = self.settings
        return settings.gpu_writer_threads or max(1, cluster.cpus_per_gpu() // settings.capture_replicas_per_gpu - 2)

    def tasks_per_replica(self, on_gpu: bool) -> int:
        """Capture tasks one replica works on at once (its actor's concurrency)."""
        return self.settings.gpu_capture_tasks if on_gpu else self.settings.capture_concurrent_shards

    def _await_free_gpus(self, digest: str, gpus: int) -> None:
        """Wait, at most `replica_start_seconds`, until Ray counts a GPU free for each replica to start;
        else fail saying so. Other work may hold them (a training job, another server's replicas on the
        same cluster), and a replica started then would wait in Ray's queue without a word."""
        seconds = self.settings.replica_start_seconds
        free = gpus_free_within(gpus, seconds)
        if free < gpus:
            raise Unavailable(
                f"capture replicas of model {digest[:12]} did not start within {seconds:g} s: no GPU "
                f"came free ({free:g} of the cluster's {gpus} free now): other work holds them (a training job, "
                "another actstore server on the same Ray cluster); let it finish or stop it, then submit the "
                "capture again")

    def _await_gpu_replicas(self, digest: str, actors: list) -> None:
        """Wait, at most `replica_start_seconds`, until every GPU replica has loaded its model; else
        kill them and fail saying so."""
        seconds = self.settings.replica_start_seconds
        try:
            ray.get([actor.node_id.remote() for actor in actors], timeout=seconds)
            return
        except ray.exceptions.GetTimeoutError:
            pass
        except ray.exceptions.RayError as exc:  # died while loading: the job reports it as a lost worker
            log.warning("a GPU capture replica of model %s failed to start: %s", digest[:12], exc)
            return
        for actor in actors:
            ray.kill(actor)
        raise Unavailable(f"capture replicas of model {digest[:12]} did not load it within {seconds:g} s "
                          "(or other work took their GPUs meanwhile): a larger ACTSTORE_REPLICA_START_SECONDS gives "
                          "them time; submit the capture again")

    @staticmethod
    def _await_name_free(name: str) -> None:
        """Wait (briefly) until a killed actor's name can be taken again."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                ray.get_actor(name)
            except ValueError:
                return
            time.sleep(0.1)

    def _cpu_placements(self, digest: str) -> tuple[PlacementGroup, list[tuple[dict, int]]]:
        """Replicas on a CPU cluster: at least one on every node with CPUs (more when
        `capture_actors` asks), each in its bundle of one SPREAD placement group and using its
        share of its node's CPUs. CPU replicas reserve no logical CPU, so metric tasks always find
        room beside them."""
        nodes = dict(cluster.cpu_nodes())
        count = max(self.settings.capture_actors, len(nodes))
        group = placement_group([REPLICA_BUNDLE] * count, strategy="SPREAD", name=f"{self._prefix}-{digest[:12]}")
        seconds = self.settings.replica_start_seconds
        try:
            ray.get(group.ready(), timeout=seconds)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(group)
            raise Unavailable(f"Ray could not place the {count} capture replicas of model {digest[:12]} within "
                              f"{seconds:g} s (ACTSTORE_REPLICA_START_SECONDS): check that the cluster's "
                              "nodes are alive (`ray status`), then submit the capture again") from None
        on_node = placement_group_table(group)["bundles_to_node_id"]  # bundle index -> node id
        placements = []
        for bundle in range(count):
            node = on_node[bundle]
            sharing = sum(1 for other in on_node.values() if other == node)
            strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=bundle)
            placements.append(({"num_cpus": 0, "scheduling_strategy": strategy},
                               max(1, nodes.get(node, 1) // sharing)))
        log.info("capture replicas of model %s: %d, placed on %d nodes", digest[:12], count, len(set(on_node.values())))
        return group, placements

    def actor_name(self, digest: str, replica: int) -> str:
        """The Ray name of the model's replica number ``replica`` in this pool (or that it will start
        it under: one taken from a stopped pool keeps the name it started with)."""
        entry = self._pool.get(digest)
        if entry is not None and replica < len(entry.names):
            return entry.names[replica]
        return f"{self._prefix}-{digest[:12]}-{replica}"

    @property
    def layouts_name(self) -> str:
        """The Ray name of the `TokenLayouts` process this pool asks (its process's, shared)."""
        return SharedLayouts.name()

    def token_rows(self, model_path: str, dataset_path: str, max_len: int, spans: bool = True) -> ray.ObjectRef:
        """The ref of a token-level run's layout (`TokenLayouts.rows`): the one the store keeps for
        this model, or else from this process's warm `TokenLayouts` (`server.token_layouts`)."""
        kept = stored_layout(self.store.files, model_layout_key(model_path, dataset_path, max_len, spans))
        if kept is not None:
            return ray.put(kept)
        self.layouts_asked += 1
        return SharedLayouts.rows(self.store, model_path, dataset_path, max_len, spans)

    def release(self, digest: str, broken: bool = False) -> None:
        """Hand the replicas back; `broken` ones (a failed job) are killed rather than kept."""
        with self._lock:
            entry = self._pool.get(digest)
            if entry is None:
                return
            entry.busy -= 1
            entry.last_used = time.monotonic()
            if broken and entry.busy == 0:
                self._kill(digest)

    def _kill(self, digest: str) -> None:
        _end(self._pool.pop(digest))

    def _release_idle(self, keep: str | None, older_than: float) -> float:
        """Kill the idle replicas (but those of model `keep`) unused for `older_than` seconds; the
        GPUs they held."""
        now = time.monotonic()
        # kept warm ones go only when a capture of another model needs their GPUs (older_than 0)
        idle = [d for d, e in self._pool.items() if d != keep and e.busy == 0 and now - e.last_used >= older_than
                and not (e.pinned and older_than > 0)]
        released = sum(self._pool[digest].gpus for digest in idle)
        for digest in idle:
            self._kill(digest)
        return released

    def release_idle_gpus(self) -> None:
        """Release every idle replica now, on a GPU cluster (where replicas hold the GPUs), for
        other work that asks for a GPU, and wait (at most `GPU_RELEASE_SECONDS`) until Ray counts
        their GPUs free: it frees a killed actor's resources a moment after the kill. Busy
        replicas keep theirs."""
        if not cluster.cluster_gpus():
            return
        with self._lock:
            released = self._release_idle(keep=None, older_than=0.0)
        if released:
            gpus_free_within(released, GPU_RELEASE_SECONDS)

    def _reap_forever(self) -> None:
        while not self._stop.wait(min(5.0, self.settings.actor_idle_seconds)):
            with self._lock:
                self._release_idle(keep=None, older_than=self.settings.actor_idle_seconds)
            SharedLayouts.end_if_idle(self.settings.actor_idle_seconds)

    def shutdown(self) -> None:
        self._stop.set()
        with _Parked.lock:
            _Parked.pools.discard(self)
            others = len(_Parked.pools)
        with self._lock:
            for digest, entry in list(self._pool.items()):
                if entry.gpus or entry.busy or any(_lost(entry)):
                    self._kill(digest)
                else:  # idle CPU replicas: kept a while for the next pool of this process
                    _Parked.park(self._parking_key(digest), self._pool.pop(digest), self.settings.actor_idle_seconds)
        if not others:  # the process's `TokenLayouts` ends when idle, as if this pool still lived
            SharedLayouts.end_when_idle(self.settings.actor_idle_seconds)
