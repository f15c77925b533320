"""The recorder inside the script's process: counts steps, times their phases, drives the window, writes events.

Steps come from the strongest source seen: explicit `gpudoctor.step()` calls, else the first optimizer's
`step()`, else DataLoader batches. Everything a step accumulates is written as one `step` event when it ends.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from gpudoctor.bundle import EVENTS, JsonlWriter
from gpudoctor.bundle.events import (
    AnyEvent,
    CollectorEvent,
    CopyRow,
    CudaMemory,
    EndEvent,
    GilSummary,
    MaxStepsEvent,
    Phases,
    StepEvent,
    StepSourceEvent,
    SyncRow,
    WindowEvent,
)
from gpudoctor.bundle.records import Site
from gpudoctor.bundle.step_spans import StepSpans
from gpudoctor.collect import window as window_states
from gpudoctor.collect.config import ChildConfig
from gpudoctor.collect.gpu_memory import cuda_memory
from gpudoctor.collect.markers import NO_TOOL, Markers
from gpudoctor.collect.stepless import StepLessProbe
from gpudoctor.collect.window import ProfilerWindow

# The step sources, weakest first: a program's steps come from the strongest one it has. The outermost model's
# forward calls (an inference loop), DataLoader batches, backward() calls (a hand-written update), the first
# optimizer's step(), and gpudoctor.step() markers.
SOURCE_RANK = {"forward": 1, "dataloader": 2, "backward": 3, "optimizer": 4, "marker": 5}
IN_WINDOW = (window_states.WARMUP, window_states.ACTIVE, window_states.DETAIL)
# Events that the reader places among the steps by where they come (a window's restart, a new step source, the
# end): the span gathering steps is written before them.
ORDERED_WITH_STEPS = (WindowEvent, StepSourceEvent, MaxStepsEvent, EndEvent)


ExceptionDetails = tuple[str, str, "Site | None"]  # what the script raised: its type, message and where
CopyKey = tuple[str, "bool | None", bool, str, int, str]  # direction, pinned, non_blocking, file, line, function
SyncKey = tuple[str, str | None, str, int, str]  # kind, via, file, line, function


class MaxStepsReached(SystemExit):
    """Raised from inside the script once --max-steps steps have run; ends it like sys.exit(0)."""

    def __init__(self) -> None:
        super().__init__(0)


def _site_key(site: Site | None) -> tuple[str, int, str]:
    return (site.file, site.line, site.function) if site else ("", 0, "")


@dataclass
class StepRecord:
    """What one step accumulates until it ends."""

    index: int
    t0: float  # time.time() at the start, comparable with the parent's samples
    p0: float  # perf_counter() at the start
    window: str
    window_index: int = 0  # which profiling window, when `window` is warmup or active
    data_wait_s: float = 0.0
    data_wait_cpu_s: float = 0.0  # the waiting thread's CPU time in those waits
    batches: int = 0
    forwards: int = 0  # calls of the outermost model
    backwards: int = 0  # backward() calls
    last_backward_t: float | None = None  # time.time() at the last backward() call
    phases: dict[str, float] = field(default_factory=lambda: {"forward": 0.0, "backward": 0.0, "optimizer": 0.0})
    copies: dict[CopyKey, list[float]] = field(default_factory=dict)
    syncs: dict[SyncKey, list[float]] = field(default_factory=dict)
    gil_delays: list[float] = field(default_factory=list)

    def to_event(self, t1: float, p1: float, source: str, cuda_memory: CudaMemory | None,
                 ends_run: bool = False) -> StepEvent:
        in_window = self.window in IN_WINDOW
        hooked = self.window == window_states.DETAIL  # the hooks' figures: only the detail steps have them
        return StepEvent(
            step=self.index, t0=self.t0, t1=t1, wall_s=max(0.0, p1 - self.p0), data_wait_s=self.data_wait_s,
            data_wait_cpu_s=self.data_wait_cpu_s if self.batches else None, batches=self.batches, source=source,
            window=self.window, backwards=self.backwards, forwards=self.forwards,
            last_backward_t=self.last_backward_t if self.backwards > 1 else None, ends_run=ends_run,
            window_index=self.window_index if in_window else 0,
            phases=Phases(**self.phases, exclusive=True) if hooked else None,
            copies=[_copy_row(k, v) for k, v in self.copies.items()] if hooked else None,
            syncs=[_sync_row(k, v) for k, v in self.syncs.items()] if hooked else None,
            gil=_gil_summary(self.gil_delays) if hooked else None,
            cuda_memory=cuda_memory if in_window else None,
        )


def _copy_row(key: CopyKey, totals: list[float]) -> CopyRow:
    direction, pinned, non_blocking, file, line, function = key
    count, nbytes, seconds, longest = totals
    return CopyRow(direction="h2d" if direction == "h2d" else "d2h", pinned=pinned, non_blocking=non_blocking,
                   count=int(count), bytes=int(nbytes), host_s=seconds, max_s=longest, site=_site(file, line, function))


def _sync_row(key: SyncKey, totals: list[float]) -> SyncRow:
    kind, via, file, line, function = key
    count, seconds, longest = totals
    return SyncRow(kind=kind, count=int(count), host_s=seconds, max_s=longest, site=_site(file, line, function),
                   via=via)


def _site(file: str, line: int, function: str) -> Site | None:
    return Site(file=file, line=line, function=function) if file else None


def _gil_summary(delays: list[float]) -> GilSummary | None:
    if not delays:
        return None
    ordered = sorted(delays)
    return GilSummary(samples=len(ordered), mean_s=sum(ordered) / len(ordered),
                      p95_s=ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], max_s=ordered[-1])


class Recorder:
    def __init__(self, config: ChildConfig) -> None:
        run_dir = Path(config.run_dir)
        self.config = config
        self.events = JsonlWriter(run_dir / EVENTS, on_failure=self._recording_failed)
        self.spans = StepSpans()  # the plain steps of a long run, written as spans
        self._spans_lock = threading.RLock()
        self.markers = Markers()
        self.window = ProfilerWindow(config.window, run_dir, self.emit, config.with_stack)
        self.source: str | None = None
        self.completed = 0
        self._first_optimizer: Callable[[], object] | None = None  # a weak reference where it takes one
        # Reentrant for the same reason as JsonlWriter's: the SIGTERM handler records on the main thread.
        self._lock = threading.RLock()
        self._disabled = False
        self._window_listeners: list[Callable[[bool], None]] = []
        self._max_steps_listeners: list[Callable[[], None]] = []
        self._step_end_listeners: list[Callable[[int], None]] = []
        self._finish_listeners: list[Callable[[ExceptionDetails | None], None]] = []
        self.current = self._new_step()
        self._stopping = False
        self._stepless = StepLessProbe(lambda: self.completed, self.emit, config.gil_probe_interval_s)
        self._stepless.start()
        status = self.markers.nvtx_status
        nvtx_ok = status in ("ok", NO_TOOL)  # no tool, no ranges wanted: nothing missing from the report
        self.emit(CollectorEvent(name="nvtx", ok=nvtx_ok, reason=None if status == "ok" else status))

    # -- events ----------------------------------------------------------------------------------
    def emit(self, event: AnyEvent) -> None:
        if self._disabled:
            return
        if event.t is None:
            event = msgspec.structs.replace(event, t=time.time())
        with self._spans_lock:  # steps end on the main thread; a window's events may come from another
            if isinstance(event, StepEvent):
                written: list[AnyEvent] = list(self.spans.take(event))
            elif isinstance(event, ORDERED_WITH_STEPS):
                written = [*self.spans.flush(), event]
            else:
                written = [event]
            for each in written:
                self.events.write(each)

    def _recording_failed(self, path: Path, error: OSError) -> None:
        """The run directory refused a write (disk full, say): stop recording, say so once, let the script go on."""
        self._disabled = True
        print(f"gpudoctor: recording stopped, {path} cannot be written ({error.strerror or error}); "
              "the script goes on.", file=sys.stderr, flush=True)
        self.close_window()

    @property
    def stopping(self) -> bool:
        """Whether --max-steps has stopped the script."""
        return self._stopping

    def disable_in_forked_child(self) -> None:
        """A forked child inherits the recorder; it must not write into the parent's bundle. Its locks are made
        anew: another thread of the parent (the GIL probe's, a window's) may have held one at the fork, and the
        child has no such thread to release it."""
        self._disabled = True
        self._lock = threading.RLock()
        self._spans_lock = threading.RLock()
        self.events.forget_lock()

    def on_window_change(self, listener: Callable[[bool], None]) -> None:
        """Call `listener(hooked)` whenever the window's detail steps, those with per-call hooks, start or end."""
        self._window_listeners.append(listener)

    def on_max_steps(self, listener: Callable[[], None]) -> None:
        """Call `listener()` when --max-steps stops the script, just before it is stopped."""
        self._max_steps_listeners.append(listener)

    def on_step_end(self, listener: Callable[[int], None]) -> None:
        """Call `listener(step)` once each step has ended and its event is written: what it recorded of that step."""
        self._step_end_listeners.append(listener)

    def on_finishing(self, listener: Callable[[ExceptionDetails | None], None]) -> None:
        """Call `listener(exception)` as the process finishes, before the window's trace is written: what the script
        raised (None when it did not)."""
        self._finish_listeners.append(listener)

    # -- step sources ----------------------------------------------------------------------------
    def _claims(self, source: str) -> bool:
        """Whether a boundary signalled by `source` ends a step: the strongest source seen wins."""
        if self.source is None or SOURCE_RANK[source] > SOURCE_RANK[self.source]:
            superseded = self.source is not None and self.completed > 0
            self.source = source
            self.emit(StepSourceEvent(source=source, at_step=self.completed))
            if superseded:
                self._restart_window()
        return source == self.source

    def _restart_window(self) -> None:
        """The steps counted so far came from a weaker source (an evaluation loop's forward calls before the
        training loop's optimizer): the window starts over on the new source's steps."""
        hooked_before = self.window.attributing
        self.window.restart(self.completed)
        self.markers.annotate = self.window.recording and self.window.cpu_ops
        with self._lock:
            self.current.window = self.window.state_for_step(self.completed)
            self.current.window_index = max(0, self.window.index)
        if self.window.attributing != hooked_before:
            self._notify_window()

    def on_batch_requested(self) -> None:
        """A DataLoader is asked for its next batch; in DataLoader mode that starts a new step."""
        if self._claims("dataloader") and self.current.batches > 0:
            self.end_step()

    def on_batch_received(self, wait_s: float, cpu_s: float = 0.0) -> None:
        with self._lock:
            self.current.data_wait_s += wait_s
            self.current.data_wait_cpu_s += cpu_s
            self.current.batches += 1

    def timed_inside(self) -> float:
        """The seconds the current step has timed so far in forward, backward, copies and syncs: what an optimizer's
        step() that runs a closure holds, and leaves out of its own time."""
        with self._lock:
            step = self.current
            return (step.phases["forward"] + step.phases["backward"] + sum(t[2] for t in step.copies.values())
                    + sum(t[1] for t in step.syncs.values()))

    def on_optimizer_step(self, optimizer: object, seconds: float) -> None:
        if self._first_optimizer is None or self._first_optimizer() is None:  # none yet, or the first one freed
            self._first_optimizer = _reference(optimizer)
        with self._lock:
            self.current.phases["optimizer"] += seconds
        # With several optimizers (a GAN, say), the first one's step marks the boundary.
        if optimizer is self._first_optimizer() and self._claims("optimizer"):
            self.end_step()

    def on_explicit_step(self) -> None:
        if self._claims("marker"):
            self.end_step()

    def on_backward(self) -> None:
        """backward() is called; with no optimizer (a hand-written update), a second one in a step starts the next.

        Counted at the call, not at its end, so that in a loop with an optimizer the backward source, claimed
        first, ends no step before the optimizer's step() claims the boundary (one step per iteration)."""
        if self._claims("backward") and self.current.backwards > 0:
            self.end_step()
        with self._lock:
            self.current.backwards += 1
            self.current.last_backward_t = time.time()

    def on_forward(self) -> None:
        """The outermost model is called; in forward mode (an inference loop) that starts a new step."""
        if self._claims("forward") and self.current.forwards > 0:
            self.end_step()
        with self._lock:
            self.current.forwards += 1

    # -- measurements inside a step --------------------------------------------------------------
    def add_phase(self, phase: str, seconds: float) -> None:
        with self._lock:
            self.current.phases[phase] += seconds

    def add_copy(self, direction: str, pinned: bool | None, non_blocking: bool, nbytes: int, seconds: float,
                 site: Site | None) -> None:
        key = (direction, pinned, non_blocking, *_site_key(site))
        with self._lock:
            totals = self.current.copies.setdefault(key, [0, 0, 0.0, 0.0])
            totals[0] += 1
            totals[1] += nbytes
            totals[2] += seconds
            totals[3] = max(totals[3], seconds)

    def add_sync(self, kind: str, seconds: float, site: Site | None, via: str | None = None) -> None:
        """`via`: the library module that made the call, when the user's line (`site`) did not make it itself."""
        key = (kind, via, *_site_key(site))
        with self._lock:
            totals = self.current.syncs.setdefault(key, [0, 0.0, 0.0])
            totals[0] += 1
            totals[1] += seconds
            totals[2] = max(totals[2], seconds)

    def add_gil_delay(self, seconds: float) -> None:
        self.current.gil_delays.append(seconds)

    # -- step boundaries -------------------------------------------------------------------------
    def _new_step(self) -> StepRecord:
        return StepRecord(self.completed, time.time(), time.perf_counter(), self.window.state_for_step(self.completed))

    def end_step(self, ends_run: bool = False) -> None:
        if self._disabled or self._stopping:
            return
        with self._lock:
            finished = self.current
            self.completed += 1
            # The next step exists at once: the GIL probe thread may record into it at any moment.
            self.current = StepRecord(self.completed, time.time(), time.perf_counter(), finished.window,
                                      finished.window_index)
        hooked_before = self.window.attributing
        memory = cuda_memory() if finished.window in IN_WINDOW else None
        self.emit(finished.to_event(time.time(), time.perf_counter(), self.source or "none", memory, ends_run))
        for told in self._step_end_listeners:
            with contextlib.suppress(Exception):  # what a listener records is gpudoctor's, never the script's
                told(finished.index)
        self.window.on_step_completed(self.completed)
        self.markers.annotate = self.window.recording and self.window.cpu_ops
        self.current.window = self.window.state_for_step(self.completed)
        self.current.window_index = max(0, self.window.index)
        if self.window.attributing != hooked_before:
            self._notify_window()
        # gpudoctor's own work at the boundary (the event written, the profiler started, stopped or exported, the
        # hooks put on or off) is no step's time: the trace's export alone took 78 ms of a 5 ms step.
        self.current.t0, self.current.p0 = time.time(), time.perf_counter()
        if self.config.max_steps is not None and self.completed >= self.config.max_steps:
            self._stopping = True
            self.emit(MaxStepsEvent(steps=self.completed))
            self.close_window(final=True)
            for listener in self._max_steps_listeners:
                with contextlib.suppress(Exception):  # the script is stopped whatever a listener does
                    listener()
            raise MaxStepsReached()

    def close_window(self, final: bool = False) -> None:
        """Close the window now; `final` when the process is ending (its script returned, raised or was stopped)."""
        was_hooked = self.window.attributing
        self.window.close(final)
        self.markers.annotate = False
        if was_hooked:
            self._notify_window()

    def _notify_window(self) -> None:
        hooked = self.window.attributing
        for listener in self._window_listeners:
            listener(hooked)

    def _end_last_counted_step(self) -> None:
        """Steps counted by backward() or forward calls end when the next one starts: the last ends with the script."""
        if not self._stopping and _counted(self.current, self.source):
            with contextlib.suppress(MaxStepsReached):  # the script is ending anyway
                self.end_step(ends_run=True)

    def finish(self, reason: str, code: int | None = None, exception: ExceptionDetails | None = None) -> None:
        """The script is ending: close the window (writing its trace) and say how the run ended."""
        if self._disabled:
            return
        self._end_last_counted_step()
        self._stepless.finish()
        for listener in self._finish_listeners:
            with contextlib.suppress(Exception):  # the process ends as it would without gpudoctor
                listener(exception)
        self.close_window(final=True)
        what, message, where = exception if exception is not None else (None, None, None)
        self.emit(EndEvent(reason=reason, steps=self.completed, pid=os.getpid(), code=code, exception=what,
                           message=message, where=where))
        self.events.close()


def _reference(obj: object) -> Callable[[], object]:
    """A weak reference to `obj`, or a strong one for an object that takes no weak reference."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


def _counted(step: StepRecord, source: str | None) -> bool:
    """Whether the step a backward() or forward source was counting has begun (the next call would end it)."""
    return (source == "backward" and step.backwards > 0) or (source == "forward" and step.forwards > 0)


_active: Recorder | None = None


def active() -> Recorder | None:
    return _active


def set_active(recorder: Recorder | None) -> None:
    global _active  # noqa: PLW0603 - the one recorder of this process, for the patched functions to find
    _active = recorder
