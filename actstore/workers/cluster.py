"""The one place that calls `ray.init`.

A given address (argument, then RAY_ADDRESS) joins that cluster; otherwise a local cluster starts,
bound to loopback with auth disabled, which is what the embedded mode and the tests use.

The local cluster gets no runtime environment: its raylet inherits this process's environment
(`WORKER_ENV` included), and so do its workers. Ray prestarts one idle worker per CPU with an empty
runtime environment, and a task whose job has one (even env_vars alone) never runs in those: the
first job would start a fresh worker per CPU and Ray would kill the prestarted ones, so a job's
memory (and its first second) would include starting every worker process. A joined cluster's
nodes do not share our environment, so the env_vars travel as the job's runtime environment there.
A local cluster's daemons also get `QUIET_LOCAL_CLUSTER_ENV` (less polling for what nobody reads).
"""

from __future__ import annotations

import os

import ray

from actstore.errors import Unavailable

# Ray workers must never reach for a model hub: everything is loaded from local folders.
WORKER_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_DISABLE_TELEMETRY": "1",
}

# A local cluster has no dashboard and sends no worker output to the driver (`ensure_ray`), so
# nothing reads the logs its log monitor publishes or the metrics its processes record, yet by
# default the log monitor globs the log folder every 0.1 s (while it holds < 1000 files) and every
# process records metrics for the dashboard agent. Measured on 2 cores, a local cluster with 10
# idle workers: its daemons (log monitor, dashboard agent, GCS, raylet, ...) 3.6 CPU-s a minute
# by default, 2.4 with these (the log monitor 1.2 -> 0.5, the agent 0.8 -> 0.4). The daemons inherit
# them; defaults only, a value already in the environment wins.
QUIET_LOCAL_CLUSTER_ENV = {
    "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0",  # look for new log files every interval below...
    "LOG_NAME_UPDATE_INTERVAL_S": "5",  # ... (Ray's 0.5 s), not on every 0.1 s poll
    "RAY_enable_metrics_collection": "0",
}


def ensure_ray(address: str | None = None) -> None:
    if ray.is_initialized():
        return
    os.environ.update(WORKER_ENV)
    address = address or os.environ.get("RAY_ADDRESS") or None
    try:
        if address:
            ray.init(address=address, runtime_env={"env_vars": dict(WORKER_ENV)}, log_to_driver=False)
        else:
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            for name, value in QUIET_LOCAL_CLUSTER_ENV.items():
                os.environ.setdefault(name, value)
            # "local": always a new cluster. Without an address, ray.init attaches to whatever
            # `ray start` (or ray.cluster_utils) last recorded in /tmp/ray/ray_current_cluster,
            # and waits on it even after that cluster is gone.
            ray.init(
                address="local",
                _node_ip_address="127.0.0.1",
                include_dashboard=False,
                log_to_driver=False,
            )
    except (ConnectionError, RuntimeError) as exc:
        raise Unavailable(
            f"cannot reach the Ray cluster at {address or 'a new local cluster'}: {exc}. "
            "Check RAY_ADDRESS / --ray-address, or unset it to start a local cluster"
        ) from exc


def cluster_cpus() -> int:
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def largest_node_cpus() -> int:
    """The CPUs of the alive node that has the most: what one task can hold (``cluster_cpus`` is
    every node's together, which no task on a cluster of several nodes can get)."""
    return max((cpus for _, cpus in cpu_nodes()), default=1)


def cpu_nodes() -> list[tuple[str, int]]:
    """(node id, CPUs) of every alive node that has CPUs, the head's first."""
    here = ray.get_runtime_context().get_node_id()
    nodes = [(node["NodeID"], int(node["Resources"].get("CPU", 0))) for node in ray.nodes()
             if node["Alive"] and node["Resources"].get("CPU", 0) >= 1]
    return sorted(nodes, key=lambda node: node[0] != here)


def cluster_gpus() -> int:
    return int(ray.cluster_resources().get("GPU", 0))


def cpus_per_gpu() -> int:
    """The fewest CPUs a GPU has beside it on any alive node with GPUs (what the host work of one
    GPU's capture can count on; 0 on a cluster without GPUs)."""
    ratios = [node["Resources"].get("CPU", 0) / node["Resources"]["GPU"] for node in ray.nodes()
              if node["Alive"] and node["Resources"].get("GPU", 0) > 0]
    return int(min(ratios, default=0))


def unwrap(exc: BaseException) -> BaseException:
    """The user's error inside a RayTaskError (ours travel pickled), or the error itself."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc
