"""Waiting for the script's process: --timeout enforced, Ctrl-C and SIGTERM passed on, its status read."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

STOP_GRACE_S = 10.0  # after SIGINT, how long the script gets to finish its own cleanup before SIGKILL
# How long a process whose script and atexit handlers are done may take to exit before it is stopped: CUDA's own
# teardown takes a second or two; a process that runs past this is held by something that will not let go.
EXIT_GRACE_S = 30.0
POLL_S = 0.5  # how often the wait looks whether the process is only exiting


def start(command: list[str], env: dict[str, str], output_log: Path | None = None) -> subprocess.Popen:
    """Start `command`; its stdout and stderr are the terminal's, or appended to `output_log` (a try's)."""
    if output_log is None:
        return subprocess.Popen(command, env=env)
    with output_log.open("ab") as output:
        return subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)


class Supervisor:
    """Waits for the child, enforcing --timeout and passing Ctrl-C and SIGTERM on, and says how it ended.

    `others` gives the job's other processes that gpudoctor records (the ranks it followed): they get the
    same signals as the script's own process, as they would from the terminal.
    """

    def __init__(self, child: subprocess.Popen, timeout_s: float | None,
                 others: Callable[[], list[int]] = list, exiting: Callable[[], bool] | None = None,
                 exit_grace_s: float = EXIT_GRACE_S, on_timeout: Callable[[], None] | None = None) -> None:
        self.child = child
        self.timeout_s = timeout_s
        self.others = others
        self.exiting = exiting
        self.exit_grace_s = exit_grace_s
        self.on_timeout = on_timeout  # called once the timeout is reached, before the child is interrupted
        self.timed_out = False
        self.stuck_at_exit = False  # its script had finished, and its process did not exit: gpudoctor stopped it
        self.interrupted = 0

    def _send(self, sig: int) -> None:
        with contextlib.suppress(OSError):
            self.child.send_signal(sig)
        for pid in self.others():
            with contextlib.suppress(OSError):
                os.kill(pid, sig)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        # The terminal already sent SIGINT to the script too (same process group); a second Ctrl-C kills it.
        self.interrupted += 1
        if self.interrupted == 1 and not terminal_sent_to_group():
            self._send(signal.SIGINT)
        elif self.interrupted > 1:
            self._send(signal.SIGKILL)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self._send(signal.SIGTERM)

    def wait(self, meanwhile: Callable[[], None] | None = None) -> int:
        """Run `meanwhile` (which must not raise), then wait; Ctrl-C and SIGTERM go to the child all along."""
        previous = signal.signal(signal.SIGINT, self._on_sigint), signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            deadline = time.monotonic() + self.timeout_s if self.timeout_s else None
            if meanwhile is not None:
                meanwhile()
            exiting_since: float | None = None
            while True:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    return self.child.wait(timeout=remaining if self.exiting is None else _poll(remaining))
                except subprocess.TimeoutExpired:
                    if deadline is not None and time.monotonic() >= deadline:
                        self.timed_out = True
                        if self.on_timeout is not None:
                            self.on_timeout()
                        return self._stop_child()
                exiting_since = self._exiting_since(exiting_since)
                if exiting_since is not None and time.monotonic() - exiting_since >= self.exit_grace_s:
                    self.stuck_at_exit = True
                    return self._end_stuck_child()
        finally:
            signal.signal(signal.SIGINT, previous[0])
            signal.signal(signal.SIGTERM, previous[1])

    def _exiting_since(self, since: float | None) -> float | None:
        """When the process was first seen only exiting: its atexit handlers run, and no child of its own left
        (multiprocessing joins those at exit, however long they take, as it does plainly)."""
        if self.exiting is None or not self.exiting() or _has_children(self.child.pid):
            return None
        return time.monotonic() if since is None else since

    def _end_stuck_child(self) -> int:
        """A process held at exit does not run Python any more: SIGTERM, then SIGKILL."""
        self._send(signal.SIGTERM)
        try:
            return self.child.wait(timeout=3.0)
        except subprocess.TimeoutExpired:
            self._send(signal.SIGKILL)
            return self.child.wait()

    def _stop_child(self) -> int:
        """Ask nicely (SIGINT, so the window's trace is written), then insist."""
        for sig, grace in ((signal.SIGINT, STOP_GRACE_S), (signal.SIGTERM, 3.0)):
            self._send(sig)
            try:
                return self.child.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                continue
        self._send(signal.SIGKILL)
        return self.child.wait()


def _poll(remaining: float | None) -> float:
    return POLL_S if remaining is None else min(POLL_S, remaining)


def _has_children(pid: int) -> bool:
    import psutil

    try:
        return any(c.status() != psutil.STATUS_ZOMBIE for c in psutil.Process(pid).children())
    except psutil.Error:
        return False


def terminal_sent_to_group() -> bool:
    """Whether a SIGINT came from the terminal's Ctrl-C, which the script's process received as well."""
    for stream in (sys.stdin, sys.stderr):
        try:
            if stream is not None and stream.isatty():
                return os.tcgetpgrp(stream.fileno()) == os.getpgrp()
        except (OSError, ValueError):
            continue
    return False


def exit_status_of(returncode: int) -> int:
    """A child killed by signal N reports -N; a shell, and gpudoctor, report 128 + N."""
    return 128 - returncode if returncode < 0 else returncode
