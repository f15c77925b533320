"""The progress line on the terminal while `gpudoctor analyze` reads a big trace.

`parse_trace` takes any `progress(done, total)` callback (and calls its `close()` at the end, if it has one);
`TraceProgress` is the one that draws.
"""

from __future__ import annotations

import sys
import time
from typing import IO

from gpudoctor.ui.terminal import is_terminal


class TraceProgress:
    """`gpudoctor ▸ reading the trace:  42% (31 of 74 MB)` on one line of a terminal while a trace is read
    (MB of the file as it is on disk, compressed or not).

    Nothing is drawn for a trace read in under `delay_s`, and the line is cleared when reading ends.
    Use `TraceProgress.on_terminal()`, which gives None when stderr is not a terminal.
    """

    def __init__(self, stream: IO[str], label: str = "trace", delay_s: float = 0.5, interval_s: float = 0.2) -> None:
        self.stream, self.label = stream, label
        self.delay_s, self.interval_s = delay_s, interval_s
        self.started: float | None = None  # the first chunk read
        self._last = 0.0
        self.drawn = False

    @classmethod
    def on_terminal(cls, stream: IO[str] | None = None, label: str = "trace") -> TraceProgress | None:
        stream = sys.stderr if stream is None else stream
        return cls(stream, label) if is_terminal(stream) else None

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if self.started is None:
            self.started = now
        if now - self.started < self.delay_s or now - self._last < self.interval_s:
            return
        self._last = now
        share = f"{done / total:4.0%} " if total else ""
        mb = f"({done / 1e6:,.0f} of {total / 1e6:,.0f} MB)"
        self._write(f"\r\x1b[2Kgpudoctor ▸ reading the {self.label}: {share}{mb}")
        self.drawn = True

    def close(self) -> None:
        if self.drawn:
            self._write("\r\x1b[2K")
            self.drawn = False

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            pass
