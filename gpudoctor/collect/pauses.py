"""What holds a step up now and then, outside its usual work: checkpoints written with torch.save, garbage
collections, evaluation loops (the model put in eval mode). Always on, since the steps they stall are seldom the
profiled ones: a wrapper call per save, a callback per collection, a wrapper call per `.eval()`.

Each is kept with the step it happened in and written when that step ends (a collection's callback runs inside
the allocation that triggered it, where writing a file could re-enter the writer); the recorder's
`on_step_end` and `on_finishing` write them.
"""

from __future__ import annotations

import _thread
import contextlib
import gc
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from gpudoctor.bundle.events import PauseEvent
from gpudoctor.bundle.records import Site
from gpudoctor.collect.callsite import user_location
from gpudoctor.collect.compile_safe import compiling_check
from gpudoctor.collect.patches import Patches
from gpudoctor.collect.recorder import Recorder

perf_counter = time.perf_counter
# A collection of the youngest generations takes microseconds; one of the oldest, or one this long, is kept.
GC_KEPT_S = 0.005
MAX_PENDING = 1000  # pauses kept for one step at most (a script that saves in a loop)
INTERRUPT_AGAIN_S = 0.001  # an interrupt the collector's callback caught is delivered again after this long


def _interrupt_main_later() -> None:
    time.sleep(INTERRUPT_AGAIN_S)
    _thread.interrupt_main()


class PauseWatch:
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self._pending: list[PauseEvent] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._gc_started: float | None = None
        self._eval_step = -1  # the step whose first .eval() was kept: one a step
        self._gc_callback: Callable[[str, dict[str, Any]], None] | None = None
        self._previous_hook: Callable[[Any], Any] | None = None
        self._hook: Callable[[Any], None] | None = None

    def install(self, patches: Patches) -> None:
        import torch

        compiling = compiling_check()
        patches.wrap(torch, "save", self._timed("save", compiling))
        patches.wrap(torch.nn.Module, "eval", self._marked_eval(compiling))
        self._gc_callback = self._on_gc
        gc.callbacks.append(self._gc_callback)
        self._guard_unraisable()
        self.recorder.on_step_end(lambda step: self.flush())
        self.recorder.on_finishing(lambda exception: self.flush())

    def uninstall(self) -> None:
        if self._gc_callback in gc.callbacks:
            gc.callbacks.remove(self._gc_callback)
        if self._hook is not None and sys.unraisablehook is self._hook and self._previous_hook is not None:
            sys.unraisablehook = self._previous_hook

    def _guard_unraisable(self) -> None:
        """The interrupt the signal handler raises at the callback's very first instruction, before its `try`
        (a SIGINT that comes while a collection runs is handled at the first Python code after it: the callback),
        reaches the collector, which hands it to sys.unraisablehook to print and drop. That one, and only that one,
        is delivered again instead, as `_on_gc` does; everything else goes to the hook there was."""
        self._previous_hook = sys.unraisablehook
        self._hook = self._unraisable_hook  # one bound method, to know it again
        sys.unraisablehook = self._hook

    def _unraisable_hook(self, unraisable: Any) -> None:
        callback = getattr(unraisable, "object", None)
        if (isinstance(getattr(unraisable, "exc_value", None), KeyboardInterrupt)
                and getattr(callback, "__func__", None) is PauseWatch._on_gc):
            with contextlib.suppress(RuntimeError):  # no new thread while the interpreter shuts down
                _thread.start_new_thread(_interrupt_main_later, ())
            return
        previous = self._previous_hook or sys.__unraisablehook__
        previous(unraisable)

    def flush(self) -> None:
        """Write the pauses kept so far."""
        with self._lock:
            pending, self._pending = self._pending, []
        for event in pending:
            self.recorder.emit(event)

    def _keep(self, cause: str, seconds: float, site: Site | None) -> None:
        if os.getpid() != self._pid:  # a forked child (a DataLoader worker) inherits the hooks, not the recording
            return
        event = PauseEvent(cause=cause, step=self.recorder.completed, seconds=seconds, site=site, t=time.time())
        with self._lock:
            if len(self._pending) < MAX_PENDING:
                self._pending.append(event)

    def _timed(self, cause: str, compiling: Callable[[], bool]) -> Callable[[Any], Any]:
        keep = self._keep

        def make(original: Any) -> Any:
            def timed(*args: Any, **kwargs: Any) -> Any:
                started = perf_counter()
                try:
                    return original(*args, **kwargs)
                finally:
                    if not compiling():
                        keep(cause, perf_counter() - started, user_location())

            return timed

        return make

    def _marked_eval(self, compiling: Callable[[], bool]) -> Callable[[Any], Any]:
        """Module.eval that marks the step an evaluation starts in, with the user's line: once a step, so that a
        script putting layers in eval mode one by one pays one look at its stack."""

        def make(original: Any) -> Any:
            def eval(module: Any) -> Any:
                step = self.recorder.completed
                if step != self._eval_step and not compiling():
                    self._eval_step = step
                    self._keep("eval", 0.0, user_location())
                return original(module)

            return eval

        return make

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        try:
            self._timed_gc(phase, info)
        except KeyboardInterrupt:
            # Python prints and drops what a gc callback raises: Ctrl-C (or --timeout's SIGINT) arriving in this
            # one would be lost, and the script run on. Delivered again a moment later, from another thread (from
            # this one it would be raised here again), it is raised in the script's own code, as without gpudoctor.
            with contextlib.suppress(RuntimeError):  # no new thread while the interpreter shuts down
                _thread.start_new_thread(_interrupt_main_later, ())

    def _timed_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = perf_counter()
            return
        started, self._gc_started = self._gc_started, None
        if started is None:
            return
        seconds = perf_counter() - started
        if info.get("generation") == 2 or seconds >= GC_KEPT_S:
            self._keep("gc", seconds, None)
