"""The progress line while the script runs: on a terminal only, below the script's output, and gone at the end."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import termios
import time
from pathlib import Path

from conftest import Result
from gpudoctor.collect.config import WindowConfig
from gpudoctor.ui.status_line import EventTail, Progress, Status

WINDOW = WindowConfig(wait=2, warmup=1, active=3)


def _append(path: Path, *events: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        for event in events:
            f.write(json.dumps(event) + "\n")


def test_absent_when_stderr_is_not_a_terminal(training_run: Result) -> None:
    """The suite runs gpudoctor with stderr piped: not one byte of the progress line may reach it."""
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
    tail = EventTail(events)
    assert tail.read() == []  # the child has not created it yet
    events.write_text('{"kind": "step", "step": 0}\n{"kind": "st')
    assert tail.read() == [{"kind": "step", "step": 0}]
    with open(events, "a") as f:
        f.write('ep", "step": 1}\n')
    assert tail.read() == [{"kind": "step", "step": 1}]


def test_status_follows_steps_and_the_window() -> None:
    status = Status(WINDOW, max_steps=20)
    assert "waiting for the first step" in status.text()
    status.update([{"kind": "step", "step": 0, "window": "waiting"}])
    assert "step 1 of 20 · profiling starts after step 2" in status.text()
    status.update([{"kind": "window", "state": "opened"}, {"kind": "step", "step": 4, "window": "active"}])
    assert "step 5 of 20 · profiling step 2 of 3" in status.text()
    status.update([{"kind": "window", "state": "closed"}, {"kind": "step", "step": 6, "window": "closed"}])
    assert "step 7 of 20 · profiled window recorded" in status.text()


def test_draws_below_the_script_output_and_erases_itself(tmp_path: Path) -> None:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    events = tmp_path / "events.jsonl"
    _append(events, {"kind": "step", "step": 0, "window": "waiting"}, {"kind": "step", "step": 1, "window": "waiting"})
    with os.fdopen(slave, "w") as tty:
        progress = Progress.start(events, WINDOW, stream=tty, interval_s=0.05)
        assert progress is not None
        time.sleep(0.3)
        _append(events, {"kind": "window", "state": "opened"}, {"kind": "step", "step": 3, "window": "active"})
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
    assert text.startswith("\r\n\x1b[1A\x1b7\x1b[1;23r\x1b8") or text.startswith("\n\x1b[1A\x1b7\x1b[1;23r\x1b8"), text[:40]
    assert "\x1b7\x1b[24;1H\x1b[2K\rgpudoctor ▸" in text
    assert "step 2 · profiling starts after step 2" in text and "step 4 · profiling step 1 of 3" in text
    # At the end: the line cleared, the whole screen scrolling again, the cursor where the script left it.
    assert text.endswith("\x1b7\x1b[24;1H\x1b[2K\x1b[r\x1b8"), text[-40:]
