"""The local Ray cluster of `workers/cluster.ensure_ray`: its tasks run in the workers Ray prestarts
(no process starts inside a first job), those workers see `WORKER_ENV`, its daemons see
`QUIET_LOCAL_CLUSTER_ENV` (a value the user set kept), and it is a new cluster even where `ray start`
left the address of a cluster that is gone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from actstore.workers.cluster import QUIET_LOCAL_CLUSTER_ENV, WORKER_ENV

pytestmark = pytest.mark.ray  # it starts a local Ray cluster of its own

SCRIPT = textwrap.dedent("""
    import json, os, time

    import psutil
    import ray

    from actstore.workers.cluster import QUIET_LOCAL_CLUSTER_ENV, WORKER_ENV, ensure_ray

    ensure_ray()
    cpus = int(ray.cluster_resources()["CPU"])
    deadline = time.monotonic() + 120
    while True:  # Ray prestarts one idle worker per CPU
        idle = set()
        for process in psutil.Process().children(recursive=True):
            try:
                if (process.cmdline() or [""])[0].startswith("ray::IDLE"):
                    idle.add(process.pid)
            except psutil.Error:
                pass
        if len(idle) >= cpus or time.monotonic() > deadline:
            break
        time.sleep(0.2)

    @ray.remote(num_cpus=1)
    def where():
        time.sleep(0.05)
        return os.getpid(), {name: os.environ.get(name) for name in WORKER_ENV}

    seen = ray.get([where.remote() for _ in range(4 * cpus)])
    daemons = {}  # the environment of each Ray daemon this process started, by its program
    for process in psutil.Process().children(recursive=True):
        try:
            command = " ".join(process.cmdline())
            for program in ("log_monitor.py", "dashboard/agent.py", "gcs_server", "raylet/raylet"):
                if program in command:
                    daemons[program] = {name: process.environ().get(name) for name in QUIET_LOCAL_CLUSTER_ENV}
        except psutil.Error:
            pass
    print(json.dumps({"cpus": cpus, "prestarted": sorted(idle), "ran_in": sorted({pid for pid, _ in seen}),
                      "env": [env for _, env in seen], "daemons": daemons}))
    ray.shutdown()
""")


def test_tasks_run_in_the_prestarted_workers_with_the_worker_env():
    # a fresh cluster in its own process, with none of WORKER_ENV inherited from the tests, of
    # QUIET_LOCAL_CLUSTER_ENV only a value of the user's own (which must be kept), and a
    # Ray temp dir (short: Ray's socket paths must fit 107 bytes) whose current-cluster file names a
    # dead address, as `ray start` or ray.cluster_utils leave it: ray.init() alone would wait on it
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    (ray_tmp / "ray").mkdir()
    (ray_tmp / "ray" / "ray_current_cluster").write_text("127.0.0.1:1")
    env = {name: value for name, value in os.environ.items()
           if name not in WORKER_ENV and name not in QUIET_LOCAL_CLUSTER_ENV and name != "RAY_ADDRESS"}
    users = {"LOG_NAME_UPDATE_INTERVAL_S": "2"}
    try:
        done = subprocess.run([sys.executable, "-c", SCRIPT], env={**env, **users, "RAY_TMPDIR": str(ray_tmp)},
                              capture_output=True, text=True, timeout=300)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(found["prestarted"]) == found["cpus"]
    assert set(found["ran_in"]) <= set(found["prestarted"]), found  # no worker started for the tasks
    assert all(env == WORKER_ENV for env in found["env"])
    assert set(found["daemons"]) == {"log_monitor.py", "dashboard/agent.py", "gcs_server", "raylet/raylet"}
    assert all(env == {**QUIET_LOCAL_CLUSTER_ENV, **users} for env in found["daemons"].values()), found["daemons"]
