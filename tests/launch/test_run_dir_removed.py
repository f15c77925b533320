"""The run directory removed while the script runs (a cleanup job, a user's rm): the script runs on, its status
passes through, gpudoctor says in one sentence that there is nothing to report, and none of torch's chatter
reaches the terminal."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from conftest import RUN_TIMEOUT_S, Gpudoctor, script
from gpudoctor.collect.window import ProfilerChatter

KINETO_LINE = b"USDT:2026-12-02 12:30:02 18640:18640 SyncActivityProfilerHandler.cpp:52] profiler_start\n"


def test_the_chatter_of_a_window_with_no_run_directory_goes_nowhere(tmp_path: Path,
                                                                      capfd: pytest.CaptureFixture[str]) -> None:
    chatter = ProfilerChatter(tmp_path / "removed" / "gpudoctor.log")
    with chatter.quiet():
        os.write(2, KINETO_LINE)
        os.write(2, b"the script's own line\n")
    assert capfd.readouterr().err == "the script's own line\n"


@pytest.mark.e2e
def test_a_run_directory_removed_mid_run_leaves_the_script_its_status(gd: Gpudoctor) -> None:
    run = gd.cwd / "run"
    process = gd.start("profile", "--out", "run", "--wait-steps", "400", script("writes_log.py"),
                       str(gd.cwd / "log.txt"), "1200")
    deadline = time.monotonic() + RUN_TIMEOUT_S
    events = run / "events.jsonl"
    while time.monotonic() < deadline and (not events.is_file() or events.read_text().count('"kind":"step"') < 50):
        time.sleep(0.1)
    shutil.rmtree(run)  # before the window opens at step 400
    out, err = process.communicate(timeout=RUN_TIMEOUT_S)
    assert process.returncode == 3, err  # the script's own
    assert "writes_log: done" in out and (gd.cwd / "log.txt").stat().st_size == 120 * 8000 * 11
    ours = [line for line in err.splitlines() if line.startswith("gpudoctor:")]
    assert ours[-1] == f"gpudoctor: {run.resolve()} was removed while the script ran: there is no bundle to report on."
    assert "Traceback" not in err and "internal error" not in err
    assert not [line for line in err.splitlines() if line.startswith(("USDT:", "ERROR:", "STAGE:"))], err
