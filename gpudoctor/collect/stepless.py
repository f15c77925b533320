"""The GIL probe for a program that marks no step: threads that share the GIL need no training loop to.

A program with no optimizer, DataLoader, backward() or model call that gpudoctor sees (worker threads doing
Python work, say) never opens the profiling window, whose detail steps run the probe. So, if no step has
ended `after_s` seconds after the recorder started, the probe runs on its own until a step ends (then the
window takes over) or the script does; its delays are summed into one `StepLessGilEvent` at the end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from gpudoctor.bundle.events import AnyEvent, GilSummary, StepLessGilEvent
from gpudoctor.collect.gilprobe import GilProbe

AFTER_S = 1.0  # a training loop ends its first step sooner, start-up aside; scripts of a second say little anyway


class StepLessProbe:
    def __init__(self, steps_done: Callable[[], int], emit: Callable[[AnyEvent], None], interval_s: float,
                 after_s: float = AFTER_S) -> None:
        self._steps_done, self._emit, self._after_s = steps_done, emit, after_s
        self._delays: list[float] = []
        self._probe = GilProbe(interval_s, self._record)
        self._timer = threading.Timer(after_s, self._start_if_stepless)
        self._timer.name = "gpudoctor-stepless"
        self._timer.daemon = True

    def start(self) -> None:
        self._timer.start()

    def _start_if_stepless(self) -> None:
        if self._steps_done() == 0:
            self._probe.start()

    def _record(self, delay: float) -> None:
        if self._steps_done():  # the program has steps after all: the window's probe takes over
            self._probe.stop()
            self._delays.clear()
        else:
            self._delays.append(delay)

    def finish(self) -> None:
        """Stop watching; with no step ended and delays recorded, write their summary."""
        self._timer.cancel()
        self._probe.stop()
        delays = sorted(self._delays)
        if not delays or self._steps_done():
            return
        self._emit(StepLessGilEvent(
            gil=GilSummary(samples=len(delays), mean_s=sum(delays) / len(delays),
                           p95_s=delays[min(len(delays) - 1, int(0.95 * len(delays)))], max_s=delays[-1]),
            watched_s=self._after_s, t=time.time()))
