"""A server whose store and catalog live on a small real filesystem (a tmpfs, tests/small_disk.py)
filled to its last byte while a capture runs, then asked for a catalog backup: each fails
RESOURCE_EXHAUSTED naming the path and the space (no job hangs, no traceback), the stored runs keep
answering reads, and once space is freed the same capture submitted again completes, byte for byte
what a server on a roomy disk stores. Before, a catalog write that found the disk full left the job
`running` (and a resubmission joined it) until the server restarted."""

from __future__ import annotations

import time

import numpy as np
import pytest

from actstore.client import Client
from actstore.errors import ResourceExhausted
from actstore.server.app import start_server
from tests.conftest import make_settings
from tests.factories import sentences
from tests.server.captured import read_all
from tests.small_disk import small_disk

pytestmark = pytest.mark.long  # servers on a filesystem of their own: started first (tests/conftest.py)

TEXTS = sentences(400, seed=11)  # 50 shards: time to fill the disk while they are written


def _register(client: Client, tiny_models) -> int:
    model = client.register_model(tiny_models["bert"], name="bert")
    client.register_dataset(texts=TEXTS, name="big")
    return model.num_layers


def test_a_full_disk_mid_capture_and_at_a_backup_fails_clearly_and_a_resubmission_matches(
        tmp_path, client, tiny_models):
    layers = _register(client, tiny_models)
    reference = read_all(client, client.capture("bert", "big", pooling="mean").run_key, layers)
    with small_disk(tmp_path / "disk", 96) as disk:
        running = start_server(make_settings(disk.path / "store", job_progress_seconds=0))
        try:
            with Client(f"127.0.0.1:{running.port}") as full:
                _register(full, tiny_models)
                kept = full.capture("bert", "big", pooling="cls").run_key
                kept_values = read_all(full, kept, layers)
                kept_cka = full.cka(kept).biased

                job = full.submit_capture("bert", "big", pooling="mean")
                for state in full.watch(job.job_id):
                    if state.done >= 2:
                        disk.fill()
                        break
                started = time.monotonic()
                with pytest.raises(ResourceExhausted) as failed:
                    full.wait(job.job_id)
                assert time.monotonic() - started < 120
                message = str(failed.value)
                assert "no space left on the disk of" in message and str(disk.path) in message, message
                assert "free" in message and "Traceback" not in message
                assert full.job(job.job_id).status == "failed"

                # the server keeps answering reads: records, stored values, a cached answer
                assert full.describe(kept).status == "committed"
                assert read_all(full, kept, layers).tobytes() == kept_values.tobytes()
                assert full.cka(kept).biased.tobytes() == kept_cka.tobytes()
                assert {r.run_key for r in full.runs()} >= {kept, job.target}

                backup = r"disk of .*backups for a catalog backup \(0 bytes free, [\d.]+ (MB|bytes) needed"
                with pytest.raises(ResourceExhausted, match=backup):
                    full.backup_catalog()

                disk.free()
                resumed = full.capture("bert", "big", pooling="mean").run_key
                assert resumed == job.target
                stored = read_all(full, resumed, layers)
                assert stored.dtype == reference.dtype and stored.tobytes() == reference.tobytes()
                assert not full.verify([resumed]).damaged
                assert full.backup_catalog().path
        finally:
            disk.free()
            running.stop()
    assert np.isfinite(reference).all()
