"""gpudoctor killed (SIGKILL: nothing of its own runs) while the script waits on forked workers that never return:
the script's process ends itself, and takes every process it started with it; none is left orphaned."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from conftest import RUN_TIMEOUT_S, Gpudoctor, script

pytestmark = pytest.mark.e2e


def test_no_process_of_the_job_outlives_a_killed_gpudoctor(gd: Gpudoctor) -> None:
    process = gd.start("profile", "--out", "run", script("stuck_pool.py"))
    events = gd.cwd / "run" / "events.jsonl"
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline and (not events.is_file() or events.read_text().count('"kind":"fork"') < 2):
        time.sleep(0.2)  # the pool's two workers are forked
    time.sleep(1.0)
    job = psutil.Process(process.pid).children(recursive=True)  # the script's process, its workers, helpers
    assert len(job) >= 3, job
    os.kill(process.pid, signal.SIGKILL)
    process.communicate(timeout=30)
    _, alive = psutil.wait_procs(job, timeout=30)
    for leftover in alive:
        leftover.kill()
    assert alive == []
