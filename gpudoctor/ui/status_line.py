"""The status line on the terminal while the script runs: steps seen, and where the profiling window is.

The parent reads the tail of the child's events.jsonl every half second and draws one status line on the bottom row
of the terminal. The script writes to the same terminal, so the status line must never land inside its output: the
rows above the bottom one become the scrolling region (as apt does while it installs), the script's output scrolls
there, and the status line is drawn below it (save cursor, go to the bottom row, clear the line, write, restore).
At the end the line is cleared and the whole screen given back.

It only appears when stderr is a terminal (and TERM is not "dumb"). Piped or redirected (a log file, a CI job's
output, a dumb terminal), the same progress goes out as plain lines instead (`ProgressLines`): one every few seconds
while it changes, and at least one a minute while it does not, each a whole line written at once, starting with
"[gpudoctor]" so that it is told apart from the script's output and from gpudoctor's own messages ("gpudoctor: ...").
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import IO

from gpudoctor.bundle.events import EVENT_DECODER, AnyEvent, StepEvent, StepSpanEvent, WindowEvent
from gpudoctor.bundle.jsonio import JsonlTail
from gpudoctor.collect.config import WindowConfig
from gpudoctor.ui.terminal import is_terminal

INTERVAL_S = 0.5
LINE_EVERY_S = 5.0  # where stderr is no terminal: a progress line at most this often, while the progress changes
LINE_QUIET_S = 60.0  # and at least this often while it does not: a log shows the run is alive
LINE_PREFIX = "[gpudoctor]"  # not "gpudoctor:", which starts gpudoctor's messages
ESC = "\x1b"
SAVE, RESTORE = f"{ESC}7", f"{ESC}8"  # DEC save/restore cursor
CLEAR_LINE = f"{ESC}[2K"


class Status:
    """What the progress line says, from the events seen so far."""

    def __init__(self, window: WindowConfig, max_steps: int | None) -> None:
        self.window = window
        self.max_steps = max_steps
        self.steps = 0
        self.state = "waiting"
        self.window_event: str | None = None
        self.window_first_step = window.wait
        self.windows_recorded = 0
        self.started = time.monotonic()

    def update(self, events: list[AnyEvent]) -> None:
        for event in events:
            if isinstance(event, StepEvent):
                self.steps = max(self.steps, event.step + 1)
                self.state = event.window
            elif isinstance(event, StepSpanEvent):
                self.steps = max(self.steps, event.last_step + 1)
                self.state = event.window
            elif isinstance(event, WindowEvent):
                self.window_event = event.state
                if event.state == "opened" and event.first_step is not None:
                    self.window_first_step = event.first_step
                elif event.state == "closed":
                    self.windows_recorded += 1
                elif event.state == "restarted":  # the steps so far were not the program's: it opens later
                    self.windows_recorded = 0
                    self.window_first_step = event.first_step or self.window.wait

    def _window_text(self) -> str:
        w = self.window
        if self.window_event == "closed":
            if self.windows_recorded < 2:
                return "profiled window recorded"
            return f"{self.windows_recorded} profiled windows recorded"
        if self.window_event in ("failed", "ended_early"):
            return "profiled window not recorded"
        if self.state == "waiting":
            return f"profiling starts after step {self.window_first_step}"
        if self.state == "warmup":
            return "profiler warming up"
        if self.state == "active":
            done = max(0, self.steps - self.window_first_step - w.warmup)
            return f"profiling step {min(done, w.active)} of {w.active}"
        return "profiled window recorded" if self.state == "closed" else self.state

    def said(self) -> str:
        """'step 12 of 40 · profiling step 3 of 10': the steps (of --max-steps' total) and the window's phase."""
        steps = f"step {self.steps}" + (f" of {self.max_steps}" if self.max_steps else "")
        return "waiting for the first step" if self.steps == 0 else f"{steps} · {self._window_text()}"

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def text(self) -> str:
        return f"gpudoctor ▸ {self.elapsed_s():4.0f} s · {self.said()}"

    def line(self) -> str:
        """The progress as a line of a log: '[gpudoctor] 12 s · step 12 of 40 · profiling step 3 of 10'."""
        return f"{LINE_PREFIX} {self.elapsed_s():.0f} s · {self.said()}"


class Progress:
    """Draws the status line from a thread until `stop()`; start it with `Progress.start(...)`."""

    def __init__(self, events: Path, window: WindowConfig, max_steps: int | None, fd: int,
                 interval_s: float = INTERVAL_S) -> None:
        self.fd = fd
        self.interval_s = interval_s
        self.tail = JsonlTail(events, EVENT_DECODER)
        self.status = Status(window, max_steps)
        self.rows = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpudoctor-progress", daemon=True)

    @classmethod
    def start(cls, events: Path, window: WindowConfig, max_steps: int | None = None,
              stream: IO[str] | None = None, interval_s: float = INTERVAL_S) -> Progress | None:
        """A running progress line on `stream` (stderr), or None when it is not a terminal."""
        stream = sys.stderr if stream is None else stream
        if not is_terminal(stream):
            return None
        progress = cls(events, window, max_steps, stream.fileno(), interval_s)
        if progress._size()[0] < 3:
            return None
        stream.flush()
        progress._thread.start()
        return progress

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    # -- the terminal ----------------------------------------------------------------------------
    def _size(self) -> tuple[int, int]:
        try:
            size = os.get_terminal_size(self.fd)
            return size.lines, size.columns
        except OSError:
            return 0, 0

    def _write(self, text: str) -> None:
        try:
            os.write(self.fd, text.encode("utf-8", "replace"))  # one write: the script's output cannot cut into it
        except OSError:
            self._stop.set()

    def _reserve_bottom_row(self, rows: int) -> None:
        # A new line and back up: on the bottom row that scrolls the screen by one, so the cursor ends inside the
        # region to be. Setting the region homes the cursor, hence save and restore around it.
        self._write(f"\n{ESC}[1A{SAVE}{ESC}[1;{rows - 1}r{RESTORE}")
        self.rows = rows

    def _release_bottom_row(self) -> None:
        if self.rows:
            self._write(f"{SAVE}{ESC}[{self.rows};1H{CLEAR_LINE}{ESC}[r{RESTORE}")
            self.rows = 0

    def _draw(self) -> None:
        rows, columns = self._size()
        if rows < 3:
            return
        if rows != self.rows:  # first draw, or the terminal was resized
            self._release_bottom_row()
            self._reserve_bottom_row(rows)
        text = self.status.text()[:max(0, columns - 1)]
        self._write(f"{SAVE}{ESC}[{rows};1H{CLEAR_LINE}\r{text}{RESTORE}")

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval_s):
                self.status.update(self.tail.read())
                self._draw()
        finally:
            self._release_bottom_row()


class ProgressLines:
    """Where stderr is no terminal: the progress as a line every `every_s` while it changes, and every `quiet_s`
    while it does not; start it with `ProgressLines.start(...)`, end it with `stop()`."""

    def __init__(self, events: Path, window: WindowConfig, max_steps: int | None, fd: int,
                 every_s: float = LINE_EVERY_S, quiet_s: float = LINE_QUIET_S) -> None:
        self.fd = fd
        self.every_s = every_s
        self.quiet_s = quiet_s
        self.tail = JsonlTail(events, EVENT_DECODER)
        self.status = Status(window, max_steps)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpudoctor-progress-lines", daemon=True)

    @classmethod
    def start(cls, events: Path, window: WindowConfig, max_steps: int | None = None,
              stream: IO[str] | None = None, every_s: float = LINE_EVERY_S,
              quiet_s: float = LINE_QUIET_S) -> ProgressLines | None:
        """Progress lines on `stream` (stderr), or None where it is a terminal (the status line is drawn there) or
        has no file descriptor."""
        stream = sys.stderr if stream is None else stream
        if is_terminal(stream):
            return None
        try:
            fd = stream.fileno()
        except (AttributeError, ValueError, OSError):
            return None
        lines = cls(events, window, max_steps, fd, every_s, quiet_s)
        lines._thread.start()
        return lines

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        said: str | None = None  # the first line comes after `every_s`, whatever it says
        at = time.monotonic()
        while not self._stop.wait(self.every_s):
            self.status.update(self.tail.read())
            now = self.status.said()
            if now == said and time.monotonic() - at < self.quiet_s:
                continue
            said, at = now, time.monotonic()
            try:  # one write of a whole line: the script's output cannot cut into it
                os.write(self.fd, (self.status.line() + "\n").encode("utf-8", "replace"))
            except OSError:
                return
