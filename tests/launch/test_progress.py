"""The progress while the script runs: on a terminal a status line below the script's output, gone at the end;
elsewhere a plain line every few seconds."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import termios
import time
from pathlib import Path

import pytest

from conftest import WINDOW as WINDOW_OPTIONS
from conftest import Gpudoctor, Result
from gpudoctor.bundle.events import EVENT_DECODER, AnyEvent, StepEvent, WindowEvent
from gpudoctor.bundle.jsonio import JsonlTail, encode
from gpudoctor.collect.config import WindowConfig
from gpudoctor.ui.status_line import LINE_PREFIX, Progress, ProgressLines, Status

WINDOW = WindowConfig(wait=2, warmup=1, active=3)


def _append(path: Path, *events: AnyEvent) -> None:
    with open(path, "ab") as f:
        for event in events:
            f.write(encode(event) + b"\n")


def step(number: int, window: str) -> StepEvent:
    return StepEvent(step=number, t0=float(number), t1=number + 1.0, wall_s=1.0, window=window)


def test_absent_when_stderr_is_not_a_terminal(training_run: Result) -> None:
    """The suite runs gpudoctor with stderr piped: not one byte of the terminal's status line may reach it (the
    progress goes there as plain lines, ProgressLines, below)."""
    assert "gpudoctor ▸" not in training_run.stderr
    assert "\x1b[" not in training_run.stderr and "\r" not in training_run.stderr and "\x1b7" not in training_run.stderr


def test_not_started_for_a_pipe_or_a_dumb_terminal(tmp_path: Path, monkeypatch) -> None:
    read, write = os.pipe()
    with os.fdopen(write, "w") as pipe:
        assert Progress.start(tmp_path / "events.jsonl", WINDOW, stream=pipe) is None
    os.close(read)
    master, slave = pty.openpty()
    monkeypatch.setenv("TERM", "dumb")
    with os.fdopen(slave, "w") as tty:
        assert Progress.start(tmp_path / "events.jsonl", WINDOW, stream=tty) is None
    os.close(master)


def test_tail_reads_whole_lines_only(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    tail = JsonlTail(events, EVENT_DECODER)
    assert tail.read() == []  # the child has not created it yet
    first, second = encode(step(0, "waiting")), encode(step(1, "waiting"))
    events.write_bytes(first + b"\n" + second[:10])
    assert tail.read() == [step(0, "waiting")]
    with open(events, "ab") as f:
        f.write(second[10:] + b"\n")
    assert tail.read() == [step(1, "waiting")]


def test_status_follows_steps_and_the_window() -> None:
    status = Status(WINDOW, max_steps=20)
    assert "waiting for the first step" in status.text()
    status.update([step(0, "waiting")])
    assert "step 1 of 20 · profiling starts after step 2" in status.text()
    status.update([WindowEvent(state="opened"), step(4, "active")])
    assert "step 5 of 20 · profiling step 2 of 3" in status.text()
    status.update([WindowEvent(state="closed"), step(6, "closed")])
    assert "step 7 of 20 · profiled window recorded" in status.text()


def test_draws_below_the_script_output_and_erases_itself(tmp_path: Path) -> None:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    events = tmp_path / "events.jsonl"
    _append(events, step(0, "waiting"), step(1, "waiting"))
    with os.fdopen(slave, "w") as tty:
        progress = Progress.start(events, WINDOW, stream=tty, interval_s=0.05)
        assert progress is not None
        time.sleep(0.3)
        _append(events, WindowEvent(state="opened"), step(3, "active"))
        time.sleep(0.3)
        progress.stop()
    output = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        output += chunk
    os.close(master)
    text = output.decode()
    # The rows above the last become the scrolling region; the status line is drawn on row 24 and the cursor restored.
    assert text.startswith(("\r\n\x1b[1A\x1b7\x1b[1;23r\x1b8", "\n\x1b[1A\x1b7\x1b[1;23r\x1b8")), text[:40]
    assert "\x1b7\x1b[24;1H\x1b[2K\rgpudoctor ▸" in text
    assert "step 2 · profiling starts after step 2" in text and "step 4 · profiling step 1 of 3" in text
    # At the end: the line cleared, the whole screen scrolling again, the cursor where the script left it.
    assert text.endswith("\x1b7\x1b[24;1H\x1b[2K\x1b[r\x1b8"), text[-40:]


def _read_all(fd: int) -> str:
    output = b""
    while chunk := os.read(fd, 65536):
        output += chunk
    os.close(fd)
    return output.decode()


def test_lines_where_stderr_is_not_a_terminal(tmp_path: Path) -> None:
    """Piped, the progress is a line every few seconds while it changes (and at least once in a while while it does
    not): the steps of --max-steps' total, the window's phase and the time, never "gpudoctor:" and no escape code."""
    events = tmp_path / "events.jsonl"
    read, write = os.pipe()
    with os.fdopen(write, "w") as pipe:
        assert Progress.start(events, WINDOW, stream=pipe) is None  # no status line on a pipe: lines
        lines = ProgressLines.start(events, WINDOW, max_steps=20, stream=pipe, every_s=0.1, quiet_s=0.6)
        assert lines is not None
        time.sleep(0.25)  # a line, then nothing while nothing changes
        _append(events, step(0, "waiting"), step(1, "waiting"))
        time.sleep(0.25)
        _append(events, WindowEvent(state="opened"), step(4, "active"))
        time.sleep(1.3)  # still step 5: said again once quiet_s has passed
        lines.stop()
    said = _read_all(read).splitlines()
    assert said and all(line.startswith(LINE_PREFIX + " ") and " s · " in line for line in said), said
    assert not any(line.startswith("gpudoctor:") or "\x1b" in line or "\r" in line for line in said), said
    progress = [line.split(" s · ", 1)[1] for line in said]
    assert progress[0] == "waiting for the first step"
    assert progress.index("step 2 of 20 · profiling starts after step 2") < progress.index(
        "step 5 of 20 · profiling step 2 of 3")
    assert progress.count("step 5 of 20 · profiling step 2 of 3") >= 2, said  # the quiet line
    assert progress.count("waiting for the first step") == 1, said  # a change, or quiet_s, between lines


def test_no_lines_on_a_terminal(tmp_path: Path) -> None:
    master, slave = pty.openpty()
    with os.fdopen(slave, "w") as tty:
        assert ProgressLines.start(tmp_path / "events.jsonl", WINDOW, stream=tty) is None
    os.close(master)


SLOW_STEPS = """\
import sys
import time

import gpudoctor

print("script: started", file=sys.stderr, flush=True)
for _ in range(60):
    time.sleep(0.2)
    gpudoctor.step()
"""


@pytest.mark.e2e
def test_a_piped_run_shows_its_progress_as_lines(gd: Gpudoctor) -> None:
    (gd.cwd / "slow.py").write_text(SLOW_STEPS)
    result = gd.profile("slow.py", options=(*WINDOW_OPTIONS, "--max-steps", "40"))
    assert result.returncode == 0, result
    said = [line for line in result.stderr.splitlines() if line.startswith(LINE_PREFIX)]
    assert said, result
    assert any(" · step " in line and " of 40 · " in line for line in said), said
    script_lines = [line for line in result.stderr.splitlines() if line.startswith("script:")]
    assert script_lines == ["script: started"], result  # the script's own lines, whole
    assert result.messages and not any(m.startswith(LINE_PREFIX) for m in result.messages)
