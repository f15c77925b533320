"""The user's lines the host spends its time on, sampled in the window's detail steps.

The GIL probe (collect.gilprobe) wakes every few milliseconds holding the GIL; at each wake it takes one look at
the main thread's stack and counts its innermost line in the user's own code (collect.callsite): no thread and
no wake-up of its own. The counts are written at the end of the detail steps as a HostLinesEvent.

The probe looks when it gets the GIL, so the main thread is seen where it lets the GIL go: in a call into torch,
a wait, I/O, or at the interpreter's forced switch (every 5 ms by default). Lines that call into torch or wait
are seen as they are; a stretch of pure Python is seen partly at its own lines and partly at its next such call.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter

from gpudoctor.bundle.events import HostLine, HostLinesEvent
from gpudoctor.collect.callsite import location, user_frame_from

TOP_LINES = 10


class HostLines:
    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._counts: Counter[tuple[str, int, str]] = Counter()
        self._samples = 0
        self._main = threading.main_thread().ident

    def sample(self) -> None:
        """One look at the main thread's stack (called by the GIL probe's thread, which holds the GIL)."""
        frame = sys._current_frames().get(self._main or -1)
        if frame is None:
            return
        self._samples += 1
        site = location(user_frame_from(frame))
        if site is not None:
            self._counts[(site.file, site.line, site.function)] += 1

    def event(self) -> HostLinesEvent | None:
        """The lines seen so far, the most sampled first; None when nothing was sampled. Starts counting anew."""
        if not self._samples:
            return None
        lines = [HostLine(file=file, line=line, function=function, samples=count)
                 for (file, line, function), count in self._counts.most_common(TOP_LINES)]
        found = HostLinesEvent(samples=self._samples, interval_s=self.interval_s, lines=lines)
        self._counts.clear()
        self._samples = 0
        return found
