"""Training on a multi-node cluster over an s3:// store, run as its own process by
test_multinode_training.py (as multinode_scenario.py, whose cluster helpers it shares).

Three one-CPU Ray nodes on this machine; the head's CPU is held by an actor while the training job
runs, so Ray puts the training task on a worker node. The job trains a smoke-size recipe, and the
server registers its checkpoints from the store. The facts written to --out: where the task ran
(Ray's state API), the models and aliases registered, the objects under training/ in the bucket,
and a capture of the trained model with its logit lens.

    python -m tests.server.multinode_training_scenario --store s3://b/p --server-dir D --out O
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

# before Ray is imported: it reads them then (with the first, its addresses stay on loopback)
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import ray  # noqa: E402

RECIPE, METHOD = "vit-fmnist", "standard"


@ray.remote(num_cpus=1)
class HoldCpu:
    """Holds a CPU of the node it is placed on, until killed."""

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--server-dir", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import obstore
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from actstore.client import Client
    from actstore.store.backends.s3 import s3_store
    from actstore.training import get_recipe
    from tests.server.multinode_scenario import _nodes_of, cluster_and_server

    cluster, _, server = cluster_and_server(args.store, args.server_dir)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    facts: dict = {}
    head = ray.get_runtime_context().get_node_id()
    facts["head"] = head
    try:
        with Client(f"127.0.0.1:{server.port}") as client:
            holder = HoldCpu.options(scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False)).remote()
            assert ray.get(holder.node.remote()) == head
            model = client.train(RECIPE, METHOD, smoke=True)
            ray.kill(holder)
            facts["train_nodes"] = _nodes_of(cluster.address, "task", "run_training")
            facts["model"] = {"digest": model.digest, "aliases": list(model.aliases), "lineage": dict(model.lineage),
                              "num_layers": model.num_layers}
            base, steps = client.training_steps(f"{RECIPE}-smoke-{METHOD}-s0")
            facts["steps"] = [[step, digest] for step, digest in steps]
            listing = s3_store(args.store)
            facts["objects"] = sorted(meta["path"] for batch in obstore.list(listing, prefix="training/")
                                      for meta in batch)
            source = get_recipe(RECIPE, smoke=True).eval_source()
            client.register_dataset(builtin=source["name"], limit=source["limit"], seed=source["seed"],
                                    split=source.get("split"), name="eval")
            for step, digest in steps:  # every registered checkpoint is a model to capture
                run = client.capture(digest, "eval").run_key
                lens = client.lens(run)
                facts.setdefault("captures", []).append(
                    {"step": step, "rows": client.describe(run).rows, "lens_n": lens.n,
                     "lens_layers": len(lens.accuracy)})
    finally:
        server.stop()
        ray.shutdown()
        cluster.shutdown()
    (out / "facts.json").write_text(json.dumps(facts))


if __name__ == "__main__":
    main()
