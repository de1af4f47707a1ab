"""A training's progress tells the truth (issue 38): `actstore experiment` showed each training's
bar stop at 249/1000 for minutes while its progress.json moved on. The training task holds every
CPU of its node, and the job registered the checkpoint of step 250 through a Ray task asking for
one CPU, which waited for the training to end, and the job (its progress included) with it. A
stored checkpoint's registration now reserves no CPU, and runs in a thread of its own beside the
job's progress."""

from __future__ import annotations

import shutil
import time

import pytest
import ray

from actstore.workers.cluster import largest_node_cpus


@ray.remote
def _hold(seconds: float) -> None:
    time.sleep(seconds)


def test_a_checkpoint_registers_while_a_task_holds_every_cpu(server, tiny_models):
    service = server.service
    key = "training/held/step-2"
    shutil.copytree(tiny_models["bert"], service.store.path / key)
    blocker = _hold.options(num_cpus=largest_node_cpus()).remote(300)
    try:
        deadline = time.monotonic() + 60
        while ray.available_resources().get("CPU", 0) > 0:  # until the blocker runs and holds them
            if time.monotonic() > deadline:
                pytest.fail("the blocking task did not start within 60 s")
            time.sleep(0.2)
        started = time.monotonic()
        record = service.registrar.register_stored_model(key, "held@step2", {"step": 2})
        assert time.monotonic() - started < 120  # it waited 300 s for the CPUs before
        assert "held@step2" in record.aliases and record.lineage["step"] == 2
    finally:
        ray.cancel(blocker, force=True)


def test_a_trainings_bar_follows_its_steps_to_the_end(client, capsys):
    client.train("vit-fmnist", "standard", smoke=True, progress=True)
    err = capsys.readouterr().err
    assert "train vit-fmnist standard" in err and "4/4" in err and "loss" in err
