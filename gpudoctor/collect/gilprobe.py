"""The GIL probe: a thread that sleeps a few milliseconds at a time and measures how late it wakes.

A thread that wants the GIL back after sleeping waits for the holder to release it (at most the switch
interval, 5 ms by default, when the holder runs Python). Late wake-ups, sustained, mean threads are
serialized on the GIL.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class GilProbe:
    def __init__(self, interval_s: float, record: Callable[[float], None],
                 look: Callable[[], None] | None = None) -> None:
        self._interval = interval_s
        self._record = record
        self._look = look  # called at each wake, with the GIL held (collect.hostlines)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpudoctor-gil-probe", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread = None

    def _run(self) -> None:
        interval, stop, record, look = self._interval, self._stop, self._record, self._look
        while not stop.is_set():
            started = time.perf_counter()
            time.sleep(interval)
            record(max(0.0, time.perf_counter() - started - interval))
            if look is not None:
                look()
