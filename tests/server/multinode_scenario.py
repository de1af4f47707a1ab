"""A multi-node scenario, run as its own process by test_multinode.py (a Ray driver can join one
cluster only, and the test session already runs a single-node one).

It starts a real Ray cluster of several nodes on this machine (`ray.cluster_utils.Cluster`, as
Ray's own multi-node tests do), serves actstore on it with an s3:// store (the AWS variables point
at the test's S3 server), captures a run and runs a CKA matrix job. With --remove-nodes it
removes a worker node while the capture is in flight and another while the matrix job is. It
writes what happened to --out (JSON facts, and the captured activations as .npy files): where
Ray placed the capture replicas and the metric tasks (Ray's own state API), the run's shard and
row counts, the matrix.

    python -m tests.server.multinode_scenario --store s3://b/p --server-dir D --model M --out O
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import threading
import time
from pathlib import Path

import numpy as np
import ray

TEXTS = 96  # 12 shards of 8


def _nodes_of(address: str, kind: str, name: str) -> list[str]:
    """The nodes Ray's state API says the actors or tasks called `name` ran on."""
    return sorted({row[-1] for row in _rows_of(address, kind, name)})


def _rows_of(address: str, kind: str, name: str) -> frozenset:
    """(id, node) of every actor called `name` Ray ever started, live or dead, or (id, attempt,
    node) of every such task. The state API is eventually consistent (workers report task events
    about once a second, and an actor is listed before its node is known), so it is read until
    three reads a second apart agree."""
    from ray.util import state

    def read() -> frozenset:
        if kind == "actor":
            rows = state.list_actors(address=address, filters=[("class_name", "=", name)], limit=1000)
            return frozenset((row.actor_id, row.node_id) for row in rows)
        rows = state.list_tasks(address=address, filters=[("func_or_class_name", "=", name)], limit=10000)
        return frozenset((row.task_id, row.attempt_number, row.node_id) for row in rows)

    deadline = time.monotonic() + 30
    seen = [read()]
    while not (len(seen) >= 3 and seen[-1] == seen[-2] == seen[-3] and all(row[-1] for row in seen[-1])):
        if time.monotonic() > deadline:
            break
        time.sleep(1)
        seen.append(read())
    return frozenset(row for row in seen[-1] if row[-1])


def _until_tasks_reach_every_node(timeout: float = 120) -> None:
    """Wait until tasks submitted from here run on every alive node. Ray's raylets learn of new
    nodes with a lag (seconds to minutes on a busy 2-core machine, with all nodes on 127.0.0.1);
    until the local raylet sees them, it spills no task to them, whatever the caller asks."""

    @ray.remote(num_cpus=1)
    def where() -> str:
        time.sleep(0.2)
        return ray.get_runtime_context().get_node_id()

    alive = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
    deadline = time.monotonic() + timeout
    while set(ray.get([where.remote() for _ in range(3 * len(alive))])) != alive:
        if time.monotonic() > deadline:
            raise RuntimeError(f"tasks did not reach all {len(alive)} nodes in {timeout:.0f} s")
        time.sleep(1)


def _remove_when(cluster, node, ready) -> threading.Thread:
    """Remove `node` (not gracefully: as a crash) as soon as `ready()` is true."""

    def watch():
        while not ready():
            time.sleep(0.05)
        cluster.remove_node(node, allow_graceful=False)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def cluster_and_server(store: str, server_dir: str):
    """A Ray cluster of three one-CPU nodes on loopback (its worker nodes), and an actstore server on
    it whose tasks reach every node."""
    from ray.cluster_utils import Cluster

    from actstore.config import Settings
    from actstore.server.app import start_server

    # the state API this scenario reads needs the head's dashboard: on a port of its own, since Ray's
    # default (8265) may be held by another Ray on the machine (test processes side by side)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dashboard_port = probe.getsockname()[1]
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1",
                                                            "dashboard_port": dashboard_port})
    workers = [cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1") for _ in range(2)]
    cluster.wait_for_nodes()
    server = start_server(Settings(store=store, server_dir=server_dir, ray_address=cluster.address, port=0,
                                   shard_rows=8, capture_batch_size=8, resume_on_start=False))
    _until_tasks_reach_every_node()
    return cluster, workers, server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--server-dir", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--remove-nodes", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")

    from actstore.client import Client
    from tests.factories import sentences

    cluster, workers, server = cluster_and_server(args.store, args.server_dir)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    facts: dict = {}
    try:
        with Client(f"127.0.0.1:{server.port}") as client:
            client.register_model(args.model, name="bert")
            client.register_dataset(texts=sentences(TEXTS), labels=[i % 3 for i in range(TEXTS)], name="toy")
            job = client.submit_capture("bert", "toy", pooling="mean")
            if args.remove_nodes:  # a worker node crashes while shards are in flight
                remover = _remove_when(cluster, workers[0], lambda: 2 <= client.job(job.job_id).done < TEXTS // 8)
            capture = client.wait(job.job_id)
            if args.remove_nodes:
                remover.join(timeout=60)
                facts["capture_done_before_removal"] = not remover.is_alive()
            facts["capture_status"] = capture.status
            facts["capture_error"] = capture.error
            run = client.describe(capture.target)
            facts["run"] = {"key": run.run_key, "status": run.status, "num_shards": run.num_shards,
                            "recorded_shards": run.recorded_shards, "rows": run.rows}
            facts["rows_recorded"] = int(server.service.catalog.chunks.rows_total(run.run_key))
            replicas = _rows_of(cluster.address, "actor", "ShardCapturer")
            facts["capture_nodes"] = sorted({node for _, node in replicas})
            facts["replica_processes"] = len(replicas)  # every replica process started, killed ones too
            for layer in range(run.num_layers + 1):
                np.save(out / f"layer{layer}.npy", client.read_activations(run.run_key, layer)[0])
            second = client.capture("bert", "toy", pooling="cls").run_key
            if args.remove_nodes:  # one more node comes and one goes while the matrix job runs
                cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
                matrix_job = client.submit_cka_matrix([run.run_key, second])
                remover = _remove_when(cluster, workers[1], lambda: client.job(matrix_job.job_id).done >= 1)
                finished = client.wait(matrix_job.job_id)
                facts["matrix_status"] = finished.status
                facts["matrix_error"] = finished.error
            matrix = client.cka_matrix([run.run_key, second])
            np.save(out / "matrix.npy", matrix.biased)
            np.save(out / "pairwise.npy", client.cka(run.run_key, second).biased)
            facts["metric_nodes"] = _nodes_of(cluster.address, "task", "accumulate")
            facts["nodes"] = len({n["NodeID"] for n in ray.nodes() if n["Alive"]})
    finally:
        server.stop()
        ray.shutdown()  # the driver leaves before its cluster goes
        cluster.shutdown()
    (out / "facts.json").write_text(json.dumps(facts))


if __name__ == "__main__":
    main()
