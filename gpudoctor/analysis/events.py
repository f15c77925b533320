"""The run's events as `Run` reads them: read once, held compactly, split by profiling window.

A run of hours writes one step event per step (10 hours at 10 steps a second: 360,000). Held as parsed
dicts they cost about 1 kB each; `StepLog` holds the steps outside the profiling windows, which all have
the same few fields, as columns (about 60 bytes a step) and makes each a dict again when it is read.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Iterator
from functools import cached_property
from typing import Any

from gpudoctor import bundle as bundle_io
from gpudoctor.analysis.views import WindowInfo

ANALYSED_WINDOW_STATES = ("active",)

# The fields, in the order the recorder writes them, of a step outside the profiling windows.
PLAIN_STEP_FIELDS = ("kind", "step", "t0", "t1", "wall_s", "data_wait_s", "batches", "source", "window", "t")
_TIMES = 5  # a plain step's t0, t1, wall_s, data_wait_s and t, in the times column


def _plain_values(event: dict[str, Any]) -> tuple[Any, ...] | None:
    """A step event's values, if it has only the plain fields, each of the type the columns hold (so that
    it reads back equal); otherwise None."""
    if tuple(event) != PLAIN_STEP_FIELDS:
        return None
    values = tuple(event.values())
    _, step, t0, t1, wall_s, data_wait_s, batches, source, window, t = values
    if (type(t0) is type(t1) is type(wall_s) is type(data_wait_s) is type(t) is float
            and type(step) is type(batches) is int and type(source) is type(window) is str):
        return values
    return None


class StepLog:
    """The run's step events in the order written; iterating gives each as the dict that was written."""

    def __init__(self) -> None:
        self.numbers = array("q")  # every step's number, for finding a window's steps by bisection
        self._times = array("d")  # a plain step's t0, t1, wall_s, data_wait_s, t (zeros for another step)
        self._batches = array("q")
        self._labels = array("H")  # a plain step's (source, window), as an index into _label_values
        self._label_values: list[tuple[str, str]] = []
        self._label_codes: dict[tuple[str, str], int] = {}
        self._kept_whole: dict[int, dict[str, Any]] = {}  # position -> a step event kept whole

    def append(self, event: dict[str, Any]) -> None:
        position = len(self.numbers)
        self.numbers.append(int(event["step"]))
        values = _plain_values(event)
        if values is not None:
            _, _, t0, t1, wall_s, data_wait_s, batches, source, window, t = values
            self._times.extend((t0, t1, wall_s, data_wait_s, t))
            self._batches.append(batches)
            self._labels.append(self._label_code((source, window)))
        else:
            self._kept_whole[position] = event
            self._times.extend((0.0,) * _TIMES)
            self._batches.append(0)
            self._labels.append(0)

    def __len__(self) -> int:
        return len(self.numbers)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self.between(0, len(self))

    def between(self, first: int, end: int, numbers: set[int] | None = None) -> Iterator[dict[str, Any]]:
        """The step events at positions first to end (excluded); with `numbers`, only the steps numbered so."""
        for position in range(first, min(end, len(self))):
            if numbers is None or self.numbers[position] in numbers:
                yield self._event(position)

    def window_marks(self) -> Iterator[tuple[str | None, int, float, float]]:
        """Each step's (window state, window index, t0, t1), without making its dict."""
        for position in range(len(self)):
            event = self._kept_whole.get(position)
            if event is not None:
                yield event.get("window"), int(event.get("window_index", 0)), event.get("t0"), event.get("t1")
            else:
                t0, t1 = self._times[_TIMES * position], self._times[_TIMES * position + 1]
                yield self._label_values[self._labels[position]][1], 0, t0, t1

    def _event(self, position: int) -> dict[str, Any]:
        event = self._kept_whole.get(position)
        if event is not None:
            return event
        t0, t1, wall_s, data_wait_s, t = self._times[_TIMES * position:_TIMES * (position + 1)]
        source, window = self._label_values[self._labels[position]]
        return {"kind": "step", "step": self.numbers[position], "t0": t0, "t1": t1, "wall_s": wall_s,
                "data_wait_s": data_wait_s, "batches": self._batches[position], "source": source,
                "window": window, "t": t}

    def _label_code(self, label: tuple[str, str]) -> int:
        code = self._label_codes.get(label)
        if code is None:
            code = self._label_codes[label] = len(self._label_values)
            self._label_values.append(label)
        return code


class RunEvents:
    """The events of the whole run, read once and split by profiling window for every window's Run."""

    def __init__(self, events: Iterable[dict[str, Any]]) -> None:
        self.steps = StepLog()
        self.others: list[dict[str, Any]] = []  # every event but the steps, in order
        for event in events:
            if event.get("kind") == "step":
                self.steps.append(event)
            else:
                self.others.append(event)

    @cached_property
    def windows(self) -> list[WindowInfo]:
        opened: dict[int, dict[str, Any]] = {}
        written: dict[int, str] = {}
        analysed: set[int] = {0}  # a repeated window counts once it analysed a step: the script may end first
        for state, index, _, _ in self.steps.window_marks():
            if state in ANALYSED_WINDOW_STATES:
                analysed.add(index)
        for e in self.others:
            if e.get("kind") != "window":
                continue
            index = int(e.get("index", 0))  # bundles from before --every have one window and no index
            if e.get("state") == "opened":
                opened[index] = e
            elif e.get("state") == "closed":
                written[index] = e.get("trace", bundle_io.trace_name(index))
        return [WindowInfo(i, int(e.get("first_step", 0)), float(e.get("t", 0.0)), written.get(i))
                for i, e in sorted(opened.items()) if i in analysed]

    def steps_of(self, window: int, numbers: set[int] | None = None) -> Iterator[dict[str, Any]]:
        """The step events of one window's Run: from its opening to the next window's (all, with one window);
        with `numbers`, only the steps numbered so."""
        return self.steps.between(*self.step_positions(window), numbers)

    def step_positions(self, window: int) -> tuple[int, int]:
        """Where one window's steps are in the step log: from the first to the end (excluded)."""
        if len(self.windows) < 2:
            return 0, len(self.steps)
        return self._step_positions[window]

    def others_of(self, window: int) -> list[dict[str, Any]]:
        """The other events of one window's Run: the run's, and its own window's opening and closing."""
        if len(self.windows) < 2:
            return self.others
        return self._others_by_window[window]

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
    def _others_by_window(self) -> dict[int, list[dict[str, Any]]]:
        shared = [e for e in self.others if e.get("kind") != "window"]
        own: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for e in self.others:
            if e.get("kind") == "window":
                own[int(e.get("index", 0))].append(e)
        return {info.index: shared + own[info.index] for info in self.windows}

    @cached_property
    def window_spans(self) -> dict[int, tuple[float, float]]:
        spans: dict[int, tuple[float, float]] = {}
        for state, index, t0, t1 in self.steps.window_marks():
            if state in ANALYSED_WINDOW_STATES:
                start, end = float(t0), float(t1)
                first, last = spans.get(index, (start, end))
                spans[index] = (min(first, start), max(last, end))
        return spans
