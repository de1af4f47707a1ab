"""The one configuration object.

Every field can be set with an ``ACTSTORE_<FIELD>`` environment variable (``ACTSTORE_PORT=6000``)
or passed to ``Settings(...)``. The defaults run the embedded mode with no configuration: a store
under ``./actstore-data``, a server on 127.0.0.1 and a local Ray cluster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from actstore.errors import InvalidArgument
from actstore.options import CAPTURE

GiB = 1 << 30
MiB = 1 << 20


class Settings(BaseSettings):
    """A bad value, given or from the environment, is InvalidArgument naming its variable (`refused`)."""

    model_config = SettingsConfigDict(env_prefix="ACTSTORE_", extra="forbid")

    def __init__(self, **values) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise InvalidArgument(refused(exc)) from None

    store: str = Field("./actstore-data", description="store root: a local path (or file:// URL), or "
                       "s3://bucket/prefix for an S3-compatible object store configured by the AWS_* variables")
    server_dir: str = Field("./actstore-data", description="with an s3:// store: the server's own local directory, "
                            "for the catalog, training checkpoints and matrix-job partials (a local store keeps "
                            "them beside its arrays); models, datasets and activations live in the object store")
    catalog: str | None = Field(None, description="the DuckDB catalog file (one writer: this server); default "
                                "catalog.duckdb in the local store, or in server_dir for an s3:// store")
    host: str = Field("127.0.0.1", description="address the gRPC server binds")
    port: int = Field(50151, ge=0, le=65535, description="gRPC port; 0 picks a free one")
    ray_address: str | None = Field(
        None, description="Ray cluster to join; RAY_ADDRESS is used when unset, else a local one"
    )

    read_cache: str | None = Field(None, description="with an s3:// store: a local directory on every node (its "
                                   "NVMe) where the chunks that node reads are kept, so repeated metric jobs read "
                                   "them from disk instead of the object store; each read still asks the object "
                                   "store for the chunk's version (a HEAD), so a rewritten chunk is never served "
                                   "stale")
    read_cache_gb: float = Field(50.0, gt=0, description="the most a node's read cache holds; the least recently "
                                 "read chunks go first")

    # S3 answers SlowDown for seconds to minutes while a prefix scales up, and drops connections now
    # and then: a call rides that out rather than failing a long capture (`store.backends.retries`)
    store_retry_attempts: int = Field(10, ge=1, description="with an s3:// store: tries of one object-store call "
                                      "that fails transiently (5xx, throttling, a timeout, a reset connection), "
                                      "the first included; then it fails UNAVAILABLE naming the store")
    store_retry_seconds: float = Field(120.0, gt=0, description="with an s3:// store: no object-store call is tried "
                                       "again once this long has passed since its first try (or would have, with "
                                       "the next backoff)")
    store_backoff_seconds: float = Field(0.2, gt=0, description="with an s3:// store: the backoff before the first "
                                         "retry of an object-store call, doubling with each retry (each wait drawn "
                                         "at random up to it: full jitter)")
    store_backoff_max_seconds: float = Field(10.0, gt=0, description="with an s3:// store: the longest backoff "
                                             "between two tries of an object-store call")
    store_request_seconds: float = Field(60.0, gt=0, description="with an s3:// store: one object-store request "
                                         "taking longer (connecting, sending and reading the answer) fails as a "
                                         "timeout and is retried")

    shard_rows: int = Field(256, ge=4, description="samples per Zarr shard of a pooled run, and the least "
                            "token rows a shard of a token-level run holds")
    shard_mb: float = Field(16.0, ge=0, description="a token-level run's shards hold a multiple of shard_rows "
                            "tokens, as many as make an object of at most this many MB and leave at least 16 "
                            "shards a run, where that object reaches a quarter of this size (a small run keeps "
                            "shard_rows tokens a shard); 0: shard_rows tokens always")
    capture_batch_size: int = Field(32, ge=1, description="samples per forward pass")
    # the CAPTURE table leaves max_len's default to this setting; its minimum is the table's
    default_max_len: int = Field(128, ge=CAPTURE.max_len.minimum, description="token limit for text captures")
    compressor: Literal["lz4", "zstd"] = "lz4"
    compress_min_saving: float = Field(0.10, ge=0, lt=1, description="a new run's activations are compressed "
                                       "only where the model's committed runs of that dtype (else any model's) "
                                       "saved at least this share of their bytes, or none is stored yet; 0: always")
    capture_actors: int = Field(1, ge=1, description="model replicas on a CPU-only cluster")
    capture_concurrent_shards: int = Field(2, ge=1, le=8, description="capture tasks a model replica works on at "
                                           "once on a CPU-only cluster, each writing its shards while the others "
                                           "compute on their share of the replica's cores (1: one after the other)")
    gpu_capture_tasks: int = Field(6, ge=1, le=32, description="capture tasks a GPU replica works on at once: one "
                                   "computes on the GPU while the others tokenise or wait for their shards' writes, "
                                   "so the GPU does not wait on the store (and the bytes in flight are at most "
                                   "this many tasks' shards)")
    gpu_writes: Literal["threads", "ray-tasks"] = Field("threads", description="how a GPU replica writes its "
                                                        "shards: 'threads' of its own process, straight from the "
                                                        "host copies of its forward passes (the write path runs "
                                                        "in C, free of the GIL); 'ray-tasks': one-CPU Ray tasks on "
                                                        "its node, each shard copied into Ray's object store")
    gpu_writer_threads: int = Field(0, ge=0, le=256, description="threads a GPU replica writes with (gpu_writes "
                                    "'threads'); 0: the CPUs its node has per GPU, shared among the replicas on a "
                                    "GPU, less two (the thread launching the forward's kernels, and the rest), at "
                                    "least 1")
    capture_replicas_per_gpu: int = Field(1, ge=1, le=8, description="model replicas that share one GPU, each "
                                          "its own process with its own copy of the model: a small model's forward "
                                          "passes can be bound by the one Python thread launching their kernels, "
                                          "not by the GPU; more than 1 only for a model that fits that many times")
    actor_idle_seconds: float = Field(120.0, gt=0, description="release a warm model replica after this idle time")
    warm_models: list[str] = Field(default_factory=list, description="models (names or digests) whose capture "
                                   "replicas start with the server and stay warm however long they idle (they "
                                   "still give up a GPU that a capture of another model needs); JSON list in "
                                   "ACTSTORE_WARM_MODELS")
    replica_start_seconds: float = Field(300.0, gt=0, description="a capture fails (UNAVAILABLE) when its model "
                                         "replicas have not started in this time: no GPU came free, or the model "
                                         "loads slower")

    metric_tasks: int | None = Field(
        None, ge=1, description="parallel map tasks per metric job; default: the cluster's CPUs"
    )
    metric_groups: int = Field(
        32, ge=1, le=4096, description="a streamed metric's rows are cut into at most this many groups of whole "
        "shards, one map task each, fixed by the run and this setting and never by the cluster's size, and the "
        "groups' results merged in group order: the same stored bytes give the same float64 answer on any server "
        "and cluster (metric_tasks of them run at once); more groups spread one query over more CPUs, at the "
        "cost of a result moved per group")
    metric_device: Literal["auto", "cpu", "cuda", "torch-cpu"] = Field(
        "auto",
        description="where metric tasks form their float64 products: auto = CUDA in tasks given a GPU "
        "share (on a cluster with GPUs), numpy/BLAS otherwise; cpu = numpy/BLAS always; cuda = always "
        "a GPU (refused on a cluster without one); torch-cpu = the GPU code path on the CPU, to check "
        "that it agrees where there is no GPU",
    )
    metric_gpus_per_task: float = Field(
        0.25, gt=0, le=1, description="share of one GPU a metric task asks for when it runs on CUDA"
    )
    max_accumulator_bytes: int = Field(
        1 * GiB, description="memory one metric accumulator may hold before the job is tiled"
    )
    metric_worker_bytes: int = Field(
        96 * MiB, ge=0, description="what a Ray worker grows by when it first runs a metric task, beside the "
        "task's arrays (its imports, Ray's task state, BLAS buffers); the matrix job counts it per running "
        "task within max_accumulator_bytes"
    )
    max_matrix_cells: int = Field(4_000_000, description="largest result matrix a query may ask")
    max_dime_permutations: int = Field(10_000, ge=1, description="most DiME permutations one query may ask")
    max_augment_views: int = Field(64, ge=2, description="most augmented views of each text a dataset may ask")
    max_bootstrap_replicates: int = Field(2_000, ge=1, description="most bootstrap replicates one similarity "
                                          "query may ask")
    max_null_permutations: int = Field(2_000, ge=1, description="most permutations of a similarity query's null")
    max_stitch_tune_steps: int = Field(10_000, ge=1, description="most tuning steps one stitching query may ask")
    max_running_jobs: int = Field(16, ge=1, description="jobs running at once")
    max_message_bytes: int = Field(64 * MiB, description="largest gRPC message either way")
    read_chunk_bytes: int = Field(2 * MiB, description="payload of one ReadActivations or ReadBatches message")
    batch_buffer_bytes: int = Field(512 * MiB, ge=1, description="memory one ReadBatches stream's shuffle buffer "
                                    "may hold (buffer shards x shard rows x layers x width x item size)")
    sql_max_rows: int = Field(10_000, ge=1, description="rows one read-only SQL query may return")
    sql_timeout_seconds: float = Field(30.0, gt=0, description="a read-only SQL query running longer is interrupted")
    sql_memory_bytes: int = Field(512 * MiB, ge=16 * MiB, description="memory the sandbox of one read-only SQL "
                                  "query may hold: the copies of the tables it names and its own work")

    result_cache_bytes: int = Field(256 * MiB, ge=0, description="memory the server's cache of recent results may "
                                    "hold (every result also stays in the catalog)")
    catalog_memory_bytes: int = Field(256 * MiB, ge=16 * MiB, description="memory the catalog's DuckDB buffer pool "
                                      "may hold (DuckDB's own default is 80% of the machine's)")
    result_messages_kept: int = Field(1024, ge=0, description="replies to recent cached queries (at most 64 kB of "
                                      "arrays each) kept built, so a repeated request is answered without planning "
                                      "it again (0: none kept)")
    run_cache_entries: int = Field(4096, ge=1, description="runs whose records, chunk health and sample checks "
                                   "the server remembers")
    finished_jobs_kept: int = Field(1000, ge=1, description="finished jobs kept in memory with their full status "
                                    "(older ones are read back from the catalog)")

    auth: bool = Field(False, description="require a token (see `actstore token create`)")
    register_paths_role: Literal["writer", "admin"] = Field(
        "admin", description="with auth: the least role that may register a model or dataset from a path on the "
        "server's disk (builtins and uploaded texts need only writer)")
    # per-principal limits apply to token holders (auth on); the embedded single-user mode has none
    principal_max_running_jobs: int = Field(8, ge=1, description="with auth: jobs one principal may run at once")
    principal_requests_per_second: float = Field(
        500.0, gt=0, description="with auth: sustained requests per second one principal may send")
    principal_request_burst: int = Field(1000, ge=1, description="with auth: requests one principal may send at "
                                         "once above the sustained rate")
    tls_cert: Path | None = Field(None, description="PEM certificate chain: serve over TLS (with tls_key)")
    tls_key: Path | None = Field(None, description="PEM private key of tls_cert")

    resume_on_start: bool = Field(True, description="finish interrupted captures at server start")
    job_progress_seconds: float = Field(
        1.0, ge=0, description="how often a running job's progress (done/total) is written to the catalog, so a "
        "restarted server shows how far it got; 0 = at every step")

    job_stall_seconds: float = Field(
        1800.0, ge=0, description="a running job that reports no progress for this long is ended, failed with "
        "DEADLINE_EXCEEDED (a lost worker, a store that stopped answering), so its slot is free and a resubmission "
        "starts afresh; longer than any one step of a job (a model's load, a tile's finalize); 0 = never")

    catalog_backup_seconds: float = Field(
        3600.0, ge=0, description="back the catalog up this often, and when the server stops cleanly (a "
        "checkpointed copy in backups/ beside the catalog; `actstore catalog restore` brings one back); 0 = off")
    catalog_backups_kept: int = Field(24, ge=1, description="how many catalog backups to keep (the newest)")

    @property
    def _store_is_url(self) -> bool:
        """Whether the store is a URL (any scheme but file://: `store.backends` knows which it
        takes); this layer below the store only tells a URL from a local directory."""
        return "://" in self.store and not self.store.startswith("file://")

    @property
    def store_root(self) -> str:
        """The store's root: a URL (an object store's) as given, a local path made absolute."""
        if self._store_is_url:
            return self.store
        return str(Path(self.store.removeprefix("file://")).expanduser().resolve())

    @property
    def catalog_path(self) -> Path:
        return Path(self.catalog).expanduser().resolve() if self.catalog else self.server_path / "catalog.duckdb"

    @property
    def server_path(self) -> Path:
        """The server's own directory: the store itself when local, else `server_dir`."""
        local = self.server_dir if self._store_is_url else self.store_root
        return Path(local.removeprefix("file://")).expanduser().resolve()


def refused(exc: ValidationError) -> str:
    """What a refused `Settings` says: each bad setting by its environment variable (a command's
    option of the same name sets it too), what it must be, and the value given."""
    problems = []
    for error in exc.errors(include_url=False):
        name = ".".join(str(part) for part in error["loc"])
        given = "" if error["type"] == "extra_forbidden" else f" (given: {error['input']!r})"
        problems.append(f"setting {name} ({Settings.model_config['env_prefix']}{name.upper()}): {error['msg']}{given}")
    return "; ".join(problems) + ". Fix the environment variable or option and run the command again"
