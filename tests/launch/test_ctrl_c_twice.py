"""Two Ctrl-C 0.15 s apart to the whole process group while the window records: the script's own KeyboardInterrupt
is the only traceback, none of gpudoctor's frames shows, nothing half-written is left in the run directory (the
window's trace is whole), and the status is the one a plain run's Ctrl-C gives."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from conftest import RUN_TIMEOUT_S, Gpudoctor, default_sigint, env_with, script

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("attempt", range(3))
def test_a_second_ctrl_c_does_not_break_into_gpudoctor(gd: Gpudoctor, attempt: int) -> None:
    command = gd.command("profile", "--out", "run", "--wait-steps", "3", "--active-steps", "400",
                         script("writes_log.py"), str(gd.cwd / "log.txt"), "100000")
    process = subprocess.Popen(command, cwd=gd.cwd, env=env_with(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True,
                               preexec_fn=default_sigint)  # noqa: PLW1509 - one signal call, before exec
    events = gd.cwd / "run" / "events.jsonl"
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline and (not events.is_file() or '"warmup"' not in events.read_text()):
        time.sleep(0.1)
    time.sleep(0.5)  # inside the window
    os.killpg(process.pid, signal.SIGINT)
    time.sleep(0.15)
    os.killpg(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=RUN_TIMEOUT_S)
    assert err.count("Traceback") == 1 and "KeyboardInterrupt" in err, err
    assert "gpudoctor/collect" not in err and "gpudoctor/launch" not in err, err
    assert process.returncode in (130, -signal.SIGINT), err
    left = [p.name for p in (gd.cwd / "run").iterdir() if "partial" in p.name]
    assert left == []
    # the window's trace whole, and the bundle finished (the report may not be: a second Ctrl-C while gpudoctor
    # analyses stops the analysis, as it would stop any program; `gpudoctor analyze run` writes it then)
    assert (gd.cwd / "run" / "trace.json.gz").is_file() and (gd.cwd / "run" / "manifest.json").is_file()


def test_a_ctrl_c_pending_as_the_first_one_ends_the_script_is_let_go(gd: Gpudoctor) -> None:
    """The race above made deterministic: the second Ctrl-C is already pending in Python when the script's
    KeyboardInterrupt reaches gpudoctor (it used to raise as gpudoctor held Ctrl-C, a second traceback)."""
    result = gd.run("profile", "--out", "run", script("ctrl_c_pending.py"))
    assert result.stderr.count("Traceback") == 1 and "KeyboardInterrupt" in result.stderr, result.stderr
    assert "gpudoctor/collect" not in result.stderr, result.stderr
    assert result.returncode in (130, -signal.SIGINT), result.stderr
    assert (gd.cwd / "run" / "manifest.json").is_file()


def test_a_spawned_rank_interrupted_twice_is_said_to_be_interrupted(gd: Gpudoctor) -> None:
    """A rank of torch.multiprocessing.spawn with a second Ctrl-C pending as its function ends (the group's, then
    the parent's death signal): its ending is written as interrupted, not completed (torch swallows the rank's
    KeyboardInterrupt; the pending one used to cut the ending short, and the process's exit 0 then said completed)."""
    result = gd.run("profile", "--out", "run", script("spawn_ctrl_c_pending.py"))
    ended = json.loads((gd.cwd / "run" / "rank-0" / "manifest.json").read_text())["exit"]
    assert ended["ending"] == "interrupted" and ended["steps"] == 3, (ended, result.stderr)
    assert "gpudoctor/collect" not in result.stderr, result.stderr
