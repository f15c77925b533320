"""Faults while a run records never become the script's: a run directory that stops taking writes (disk full) stops
the recording, says so in one sentence and lets the script finish with its own status; helper processes that
--max-steps leaves running are ended, so the run ends."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from conftest import RUN_TIMEOUT_S, Gpudoctor, checked_findings, env_with, script
from gpudoctor.analysis import Run

HELPER_SCRIPT = '''\
import multiprocessing as mp
import time

import gpudoctor


def serve(stop):
    while not stop.is_set():
        time.sleep(0.05)


if __name__ == "__main__":
    stop = mp.Event()
    helper = mp.Process(target=serve, args=(stop,))  # not a daemon: at exit, multiprocessing waits for it
    helper.start()
    for _ in range(40):
        time.sleep(0.02)
        gpudoctor.step()
    stop.set()  # the script's own cleanup, which --max-steps skips
    helper.join()
'''


def test_a_helper_process_left_running_by_max_steps_is_ended(gd: Gpudoctor) -> None:
    (gd.cwd / "helper.py").write_text(HELPER_SCRIPT, encoding="utf-8")
    started = time.monotonic()
    result = gd.profile("helper.py", options=("--max-steps", "12", "--wait-steps", "1", "--warmup-steps", "1",
                                              "--active-steps", "2"), timeout=60)
    assert result.returncode == 0, result
    assert time.monotonic() - started < 45  # it used to wait for the helper forever
    said = "gpudoctor: stopped 1 helper process that the script left running when --max-steps ended it."
    assert said in result.stderr
    assert result.manifest()["exit"]["ending"] == "max_steps"


# gpudoctor, with every file it (and the script) writes stopped from growing past 20 kB: writes past it fail
# (EFBIG), as they would on a full disk.
WITH_FULL_DISK = ("import os, resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000)); "
                  "os.execv(sys.executable, [sys.executable, '-m', 'gpudoctor', *sys.argv[1:]])")


def test_a_run_directory_that_stops_taking_writes_stops_the_recording_not_the_script(gd: Gpudoctor) -> None:
    command = [sys.executable, "-c", WITH_FULL_DISK, "profile", "--out", "run", "--wait-steps", "1", "--warmup-steps",
               "1", "--active-steps", "2", script("train_loop.py"), "--steps", "200", "--batch-size", "4",
               "--sleep-ms", "1", "--report", str(gd.cwd / "done.json")]
    done = subprocess.run(command, cwd=gd.cwd, env=env_with(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    assert '"steps": 200' in (gd.cwd / "done.json").read_text()  # the script ran to its end
    assert "Traceback" not in done.stderr
    mine = [line for line in done.stderr.splitlines() if line.startswith("gpudoctor:")]
    assert any("recording stopped, " in line and "events.jsonl cannot be written" in line for line in mine), mine
    run_dir = gd.cwd / "run"
    assert Run.from_bundle(run_dir).steps  # what was recorded before the disk filled is read
    if (run_dir / "findings.json").is_file():
        checked_findings(run_dir / "findings.json")
    assert Path(run_dir / "events.jsonl").stat().st_size <= 20_000
