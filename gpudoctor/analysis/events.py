"""The run's events as `Run` reads them: read once, held compactly, split by profiling window.

A run of hours writes one step event per step (10 hours at 10 steps a second: 360,000). `StepLog` holds the
steps outside the profiling windows, which carry only their times, wait, batches and labels, as columns
(about 70 bytes a step) and makes each a `StepEvent` again when it is read.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Iterator
from functools import cached_property
from typing import Protocol, TypeVar

import msgspec

from gpudoctor.analysis.views import WindowInfo
from gpudoctor.bundle import trace_name
from gpudoctor.bundle.events import (
    AnyEvent,
    BackwardSiteEvent,
    CompileEvent,
    ForwardSiteEvent,
    HostLinesEvent,
    LoaderStartEvent,
    LossEvent,
    PauseEvent,
    StepEvent,
    StepSourceEvent,
    StepSpanEvent,
    WindowEvent,
)
from gpudoctor.bundle.step_spans import expand

ANALYSED_WINDOW_STATES = ("active",)
TRACED_WINDOW_STATES = ("warmup", "active")  # the steps the profiler records
# What a window records besides its steps: its opening and closing, and what its detail steps' hooks saw (the lines
# that call the model and backward(), the lines the host ran).
WINDOW_BOUND = (WindowEvent, ForwardSiteEvent, BackwardSiteEvent, HostLinesEvent)
_TIMES = 5  # a plain step's t0, t1, wall_s, data_wait_s and data_wait_cpu_s (NaN: not measured), in the times column

_NAN = float("nan")
E = TypeVar("E", bound=AnyEvent)


class StepLog:
    """The run's step events in the order written; iterating gives each as the StepEvent that was written."""

    def __init__(self) -> None:
        self.numbers = array("q")  # every step's number, for finding a window's steps by bisection
        self._times = array("d")  # a plain step's t0, t1, wall_s, data_wait_s, data_wait_cpu_s (zeros for another)
        self._written = array("d")  # a plain step's `t`; NaN where it had none
        self._batches = array("q")
        self._backwards = array("q")  # a plain step's backward() calls (one, in most training steps)
        self._forwards = array("q")  # a plain step's calls of the outermost model
        self._labels = array("H")  # a plain step's (source, window), as an index into _label_values
        self._label_values: list[tuple[str, str]] = []
        self._label_codes: dict[tuple[str, str], int] = {}
        self._kept_whole: dict[int, StepEvent] = {}  # position -> a step event kept whole

    def append(self, event: StepEvent) -> None:
        position = len(self.numbers)
        self.numbers.append(event.step)
        if event.plain:
            cpu = event.data_wait_cpu_s
            self._times.extend((event.t0, event.t1, event.wall_s, event.data_wait_s, _NAN if cpu is None else cpu))
            self._written.append(float("nan") if event.t is None else event.t)
            self._batches.append(event.batches)
            self._backwards.append(event.backwards)
            self._forwards.append(event.forwards)
            self._labels.append(self._label_code((event.source, event.window)))
        else:
            self._kept_whole[position] = event
            self._times.extend((0.0,) * _TIMES)
            self._written.append(0.0)
            self._batches.append(0)
            self._backwards.append(0)
            self._forwards.append(0)
            self._labels.append(0)

    def __len__(self) -> int:
        return len(self.numbers)

    def __iter__(self) -> Iterator[StepEvent]:
        return self.between(0, len(self))

    def between(self, first: int, end: int, numbers: set[int] | None = None) -> Iterator[StepEvent]:
        """The step events at positions first to end (excluded); with `numbers`, only the steps numbered so."""
        for position in range(first, min(end, len(self))):
            if numbers is None or self.numbers[position] in numbers:
                yield self._event(position)

    def window_marks(self) -> Iterator[tuple[str, int, float, float]]:
        """Each step's (window state, window index, t0, t1), without making its event."""
        for position in range(len(self)):
            event = self._kept_whole.get(position)
            if event is not None:
                yield event.window, event.window_index, event.t0, event.t1
            else:
                t0, t1 = self._times[_TIMES * position], self._times[_TIMES * position + 1]
                yield self._label_values[self._labels[position]][1], 0, t0, t1

    def _event(self, position: int) -> StepEvent:
        event = self._kept_whole.get(position)
        if event is not None:
            return event
        t0, t1, wall_s, data_wait_s, cpu = self._times[_TIMES * position:_TIMES * (position + 1)]
        source, window = self._label_values[self._labels[position]]
        written = self._written[position]
        return StepEvent(step=self.numbers[position], t0=t0, t1=t1, wall_s=wall_s, data_wait_s=data_wait_s,
                         data_wait_cpu_s=None if cpu != cpu else cpu,  # NaN: not measured
                         batches=self._batches[position], backwards=self._backwards[position],
                         forwards=self._forwards[position], source=source,
                         window=window,
                         t=None if written != written else written)  # NaN: no `t` was written

    def _label_code(self, label: tuple[str, str]) -> int:
        code = self._label_codes.get(label)
        if code is None:
            code = self._label_codes[label] = len(self._label_values)
            self._label_values.append(label)
        return code


def _shifted(event: E, by: int) -> E:
    """The event with the step numbers it holds `by` lower (never below 0): the steps of a dropped prologue."""
    if not by:
        return event
    if isinstance(event, StepEvent):
        return msgspec.structs.replace(event, step=max(0, event.step - by))
    if isinstance(event, StepSourceEvent):
        return msgspec.structs.replace(event, at_step=max(0, event.at_step - by))
    if isinstance(event, WindowEvent) and event.first_step is not None:
        return msgspec.structs.replace(event, first_step=max(0, event.first_step - by))
    if isinstance(event, PauseEvent | LoaderStartEvent | CompileEvent):  # what happened in a step, by its number
        return msgspec.structs.replace(event, step=max(0, event.step - by))
    if isinstance(event, LossEvent):
        return msgspec.structs.replace(event, steps=[max(0, step - by) for step in event.steps])
    return event


class EventsOf(Protocol):
    """A window's events of one kind, as written: `events(LoaderEvent)`."""

    def __call__(self, kind: type[E]) -> list[E]: ...


class RunEvents:
    """The events of the whole run, read once and split by profiling window for every window's Run."""

    def __init__(self, events: Iterable[AnyEvent]) -> None:
        self.steps = StepLog()
        self.others: list[AnyEvent] = []  # every event but the steps, in order
        # Steps counted by a weaker source before the window restarted, left out; the steps after them are numbered
        # from 0, as in a rank of the same job that had no such prologue (only rank 0 evaluates in nanoGPT).
        self.prologue_steps = 0
        restart: tuple[int, int] | None = None  # where the last restart came, in steps and other events
        for event in events:
            if isinstance(event, StepEvent):
                self.steps.append(_shifted(event, self.prologue_steps))
                continue
            if isinstance(event, StepSpanEvent):  # a long run's plain steps, summarised as they were written
                for step in expand(event):
                    self.steps.append(_shifted(step, self.prologue_steps))
                continue
            if isinstance(event, WindowEvent) and event.state == "restarted":
                restart = (len(self.steps), len(self.others))
                continue
            if isinstance(event, WindowEvent) and event.state == "opened" and restart is not None:
                self._drop_prologue(*restart)
                restart = None
            self.others.append(_shifted(event, self.prologue_steps))

    def _drop_prologue(self, steps_at: int, others_at: int) -> None:
        """A stronger step source took over and the window opened again on its steps: the steps before (an
        evaluation loop's forward calls, say) and what the windows that measured them recorded are not the run's.
        A restart that no window followed leaves the run as it was: its earlier window is all there is."""
        kept = StepLog()
        for event in self.steps.between(steps_at, len(self.steps)):
            kept.append(_shifted(event, steps_at))
        self.prologue_steps += steps_at
        self.steps = kept
        self.others = [_shifted(e, steps_at) for n, e in enumerate(self.others)
                       if n >= others_at or not isinstance(e, WINDOW_BOUND)]

    @cached_property
    def windows(self) -> list[WindowInfo]:
        opened: dict[int, WindowEvent] = {}
        written: dict[int, str] = {}
        analysed: set[int] = {0}  # a repeated window counts once it analysed a step: the script may end first
        for state, index, _, _ in self.steps.window_marks():
            if state in ANALYSED_WINDOW_STATES:
                analysed.add(index)
        for e in self._window_events:
            if e.state == "opened":
                opened[e.index] = e
            elif e.state == "closed":
                written[e.index] = e.trace or trace_name(e.index)
        return [WindowInfo(i, e.first_step or 0, e.t or 0.0, written.get(i))
                for i, e in sorted(opened.items()) if i in analysed]

    @cached_property
    def _window_events(self) -> list[WindowEvent]:
        return [e for e in self.others if isinstance(e, WindowEvent)]

    def steps_of(self, window: int, numbers: set[int] | None = None) -> Iterator[StepEvent]:
        """The step events of one window's Run: from its opening to the next window's (all, with one window);
        with `numbers`, only the steps numbered so."""
        return self.steps.between(*self.step_positions(window), numbers)

    def step_positions(self, window: int) -> tuple[int, int]:
        """Where one window's steps are in the step log: from the first to the end (excluded)."""
        if len(self.windows) < 2:
            return 0, len(self.steps)
        return self._step_positions[window]

    def others_of(self, window: int, kind: type[E]) -> list[E]:
        """One window's Run's other events of one kind: the run's, and its own window's opening and closing."""
        events = self.others if len(self.windows) < 2 else self._others_by_window[window]
        return [e for e in events if isinstance(e, kind)]

    @cached_property
    def _step_positions(self) -> dict[int, tuple[int, int]]:
        """Each window's steps, as positions in the step log: step events are written in order."""
        windows, numbers = self.windows, self.steps.numbers
        positions = {}
        for n, info in enumerate(windows):
            first = bisect_left(numbers, info.first_step) if n else 0
            end = bisect_left(numbers, windows[n + 1].first_step) if n + 1 < len(windows) else len(numbers)
            positions[info.index] = (first, end)
        return positions

    @cached_property
    def _others_by_window(self) -> dict[int, list[AnyEvent]]:
        shared: list[AnyEvent] = [e for e in self.others if not isinstance(e, WindowEvent)]
        own: dict[int, list[AnyEvent]] = defaultdict(list)
        for e in self._window_events:
            own[e.index].append(e)
        return {info.index: shared + own[info.index] for info in self.windows}

    @cached_property
    def window_spans(self) -> dict[int, tuple[float, float]]:
        spans: dict[int, tuple[float, float]] = {}
        for state, index, t0, t1 in self.steps.window_marks():
            if state in ANALYSED_WINDOW_STATES:
                first, last = spans.get(index, (t0, t1))
                spans[index] = (min(first, t0), max(last, t1))
        return spans
