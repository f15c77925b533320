"""GD101's workers sized by what the loader waits on, profiled for real on the CPU: the same starved loader whose
samples sleep (reading a slow disk: I/O-bound) gets more workers than the host's cores, and whose samples keep a
core busy (CPU-bound) stays within them. tests/builtin_rules/test_worker_sizing.py holds the boundaries."""

from __future__ import annotations

import pytest

from conftest import Gpudoctor, script

pytestmark = pytest.mark.e2e

STARVED = script("starved_loader.py")
# Each batch of 8 samples of 10 ms takes 80 ms to load, against the step's 20 ms of device work: 6 workers
# hide it (1.5 × 80 / 20), and a host of 2 cores has 1 to spare for CPU-bound ones.
ARGS = ("--steps", "40", "--sample-ms", "10")


def _gd101(gd: Gpudoctor, out: str, *args: str) -> dict:
    result = gd.profile(STARVED, *ARGS, *args, out=out)
    assert result.returncode == 0, result
    return next(f for f in result.findings()["findings"] if f["code"] == "GD101")


def _evidence(finding: dict) -> dict:
    return {e["name"]: e["value"] for e in finding["evidence"]}


def test_a_sleeping_dataset_gets_more_workers_than_cores_and_a_busy_one_stays_within_them(gd: Gpudoctor) -> None:
    sleeping, busy = _gd101(gd, "sleeping"), _gd101(gd, "busy", "--busy")
    cores = _evidence(sleeping)["cores available"]
    io = sleeping["remedy"]["loader"]["num_workers"]
    assert io > cores, sleeping["fix"]
    assert "of its time on I/O" in sleeping["fix"]
    assert _evidence(sleeping)["loading on a core"] < 20  # percent
    assert busy["remedy"]["loader"]["num_workers"] <= max(2, cores - 1) < io, busy["fix"]
    assert _evidence(busy)["loading waiting on I/O"] < 50
