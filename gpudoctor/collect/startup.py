"""The script's start-up: where its time goes before the first step ends, and each time a DataLoader starts its
workers again.

- CUDA's first initialization, timed (torch.cuda._lazy_init, which every first use of CUDA goes through).
- Each DataLoader iterator made, timed: its workers start there (each epoch's, unless persistent_workers).
- The user's lines the main thread is in until the first step ends, sampled every START_INTERVAL_S by a thread of
  its own (dataset indexing, model building, a download), and how often it was importing a module instead:
  written as one StartupLinesEvent.
The import of torch is timed by the watcher that finds it (collect.torch_import).
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from gpudoctor.bundle.events import HostLine, LoaderStartEvent, StartupEvent, StartupLinesEvent
from gpudoctor.collect.callsite import location, user_frame_from
from gpudoctor.collect.patches import Patches
from gpudoctor.collect.recorder import Recorder

perf_counter = time.perf_counter
START_INTERVAL_S = 0.05  # twenty looks a second at the main thread's stack
MAX_WATCH_S = 3600.0  # a start-up longer than an hour is watched for its first hour
TOP_LINES = 10


class StartupWatch:
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.on_cuda_init: list[Callable[[], None]] = []  # told once, when CUDA is first initialized
        self._counts: Counter[tuple[str, int, str]] = Counter()
        self._samples = 0
        self._importing = 0  # looks that found the main thread importing a module
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._main = threading.main_thread().ident

    # -- before the script runs --------------------------------------------------------------------------
    def start(self) -> None:
        """Sample the main thread's line until the first step ends."""
        self._thread = threading.Thread(target=self._watch, name="gpudoctor-startup", daemon=True)
        self._thread.start()
        self.recorder.on_step_end(self._first_step_ended)
        self.recorder.on_finishing(lambda exception: self.stop())

    def torch_imported(self, seconds: float) -> None:
        self.recorder.emit(StartupEvent(phase="torch_import", seconds=seconds))

    # -- once torch is imported --------------------------------------------------------------------------
    def install(self, patches: Patches, loader_numbers: Any) -> None:
        import torch
        from torch.utils.data import dataloader

        self._time_cuda_init(patches, torch)
        self._time_loader_starts(patches, dataloader.DataLoader, loader_numbers)

    def _time_cuda_init(self, patches: Patches, torch: Any) -> None:
        done, emit, told = [torch.cuda.is_initialized()], self.recorder.emit, self.on_cuda_init

        def make(original: Any) -> Any:
            def _lazy_init() -> Any:
                if done[0]:
                    return original()
                started = perf_counter()
                try:
                    return original()
                finally:
                    if torch.cuda.is_initialized():
                        done[0] = True
                        emit(StartupEvent(phase="cuda_init", seconds=perf_counter() - started))
                        for listener in told:
                            listener()

            return _lazy_init

        patches.wrap(torch.cuda, "_lazy_init", make)

    def _time_loader_starts(self, patches: Patches, loader_class: type, numbers: Any) -> None:
        recorder = self.recorder

        def make(original: Any) -> Any:
            def __iter__(loader: Any) -> Any:
                started = perf_counter()
                iterator = original(loader)
                seconds = perf_counter() - started
                try:
                    number = numbers.get(loader)
                except TypeError:
                    number = None
                recorder.emit(LoaderStartEvent(loader_id=number, step=recorder.completed, seconds=seconds,
                                               workers=loader.num_workers, persistent=bool(loader.persistent_workers)))
                return iterator

            return __iter__

        patches.wrap(loader_class, "__iter__", make)

    # -- the lines ---------------------------------------------------------------------------------------
    def _watch(self) -> None:
        deadline = perf_counter() + MAX_WATCH_S
        while not self._stop.wait(START_INTERVAL_S) and perf_counter() < deadline:
            frame = sys._current_frames().get(self._main or -1)
            if frame is None:
                continue
            self._samples += 1
            if _importing(frame):
                self._importing += 1
                continue
            site = location(user_frame_from(frame))
            del frame
            if site is not None:
                self._counts[(site.file, site.line, site.function)] += 1

    def _first_step_ended(self, step: int) -> None:
        if step == 0:
            self.stop()

    def stop(self) -> None:
        """Stop sampling and write the lines seen, once."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(1.0)
        if self._samples:
            lines = [HostLine(file=file, line=line, function=function, samples=count)
                     for (file, line, function), count in self._counts.most_common(TOP_LINES)]
            self.recorder.emit(StartupLinesEvent(samples=self._samples, interval_s=START_INTERVAL_S, lines=lines,
                                                 importing=self._importing))


def _importing(frame: Any) -> bool:
    """Whether a stack is inside an import: Python's import machinery (importlib's frozen frames) is on it."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False
