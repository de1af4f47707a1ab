"""The Gram-space plan of the matrix job (`server/gram_matrix.plan`): memory of the running tile
tasks (their arrays and their worker processes' own growth) plus the reducer within the limit,
every Gram entry in exactly one tile, enough tiles."""

from __future__ import annotations

import numpy as np
import pytest

from actstore.server.gram_matrix import plan, reducer_nbytes, task_nbytes

GiB = 1 << 30
WORKER = 96 << 20  # Settings.metric_worker_bytes


@pytest.mark.parametrize("runs", [4, 8, 32])
def test_job_fits_the_limit_with_every_task_running(runs):
    widths, n, tasks = [384] * (7 * runs), 10_000, 2
    chosen = plan(widths, n, 256, 2, 7 * 384, GiB, tasks, 4, WORKER)
    assert chosen is not None
    used = tasks * (WORKER + task_nbytes(widths, chosen.panel_rows, 256, chosen.piece_rows, 2, 7 * 384))
    assert used + reducer_nbytes(len(widths), n) == chosen.memory_bytes <= GiB
    assert chosen.panel_rows % 256 == 0 and len(chosen.tiles) >= 4 * tasks
    covered = np.zeros((n, n), dtype=np.int8) if runs == 4 else None
    if covered is not None:  # each entry of the upper triangle once, tiles strictly above twice via symmetry
        for i, j in chosen.tiles:
            (r0, r1), (c0, c1) = chosen.panels[i], chosen.panels[j]
            covered[r0:r1, c0:c1] += 1
        assert (np.triu(covered) == np.triu(np.ones((n, n), dtype=np.int8))).all()


def test_more_memory_means_taller_panels_and_fewer_reads():
    widths = [384] * 224
    small, large = (plan(widths, 10_000, 256, 2, 7 * 384, limit, 2, 4, WORKER) for limit in (GiB, 4 * GiB))
    assert small.panel_rows < large.panel_rows and len(small.panels) > len(large.panels)


def test_worker_processes_take_their_share_of_the_limit():
    # at M = 32 the arrays alone would take 1,536-row panels; each of the two running tasks' worker
    # processes keeps 96 MiB of the limit for itself, so the panels are shorter
    widths = [384] * 224
    bare, counted = (plan(widths, 10_000, 256, 2, 7 * 384, GiB, 2, 4, worker) for worker in (0, WORKER))
    assert (bare.panel_rows, counted.panel_rows) == (1536, 1024)
    assert counted.memory_bytes <= GiB < bare.memory_bytes + 2 * WORKER


def test_nothing_fits_a_tiny_limit():
    assert plan([384] * 224, 10_000, 256, 2, 7 * 384, 64 << 20, 2, 4) is None
