"""Step spans: a long run's steps outside the profiling windows, summarised as they are written.

One step event is about 220 bytes: 60 steps a second write 48 MB an hour per rank. After its first RAW_STEPS
steps, the script's process gathers the plain steps (StepEvent.plain: outside the windows) into a StepSpanEvent
every SPAN_S seconds, so that events.jsonl grows by a bounded amount per span whatever the step rate
(docs/performance.md gives the measured figure). A span keeps:

- its steps' numbers and the times it starts and ends;
- each step's wall time and data wait, as histograms of 1% bins (the median, the spread and the total come out
  within 0.5%);
- its KEPT_SLOWEST slowest steps exactly, with their numbers, and every outlier besides (up to MAX_EXACT): a stall
  every N steps stays where it was;
- the totals of the batches, backward() and model calls and the data wait's CPU time.

`expand` gives the span's steps back as plain StepEvents, so that every reader of steps reads a span as the steps
it holds. What a span cannot give back is each ordinary step's own order: the expanded ones take the span's
values in a fixed, trendless order, their times laid out between the exact ones.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from gpudoctor.bundle.events import StepEvent, StepSpanEvent

SPAN_S = 10.0  # a span's length: what a killed process loses at most of its plain steps, besides its window's
RAW_STEPS = 500  # the first steps are written one by one: start-up and the first window read them one by one
KEPT_SLOWEST = 4
# Besides those, every step this much slower than the span's median is kept exactly, up to MAX_EXACT: a
# checkpoint every 100 steps puts 8 stalls in one span at 80 steps a second, each where it happened.
OUTLIER = 1.5
MAX_EXACT = 64
STEP_BIN = math.log(1.01)  # bins 1% wide: a value read back is within 0.5% of the one written
_SMALLEST = 1e-7  # a wall time or wait below it (0.1 us) is kept as 0.1 us (a wait as none)
_GOLDEN = (math.sqrt(5) - 1) / 2
# A profiling window's steps are written one by one, whatever they carry: the trace is aligned by their times
# (a CPU-only run's warm-up and active steps carry no CUDA memory figures, and would otherwise look plain).
PROFILED = ("warmup", "active", "detail")


def to_bin(seconds: float) -> int:
    return round(math.log(max(seconds, _SMALLEST)) / STEP_BIN)


def from_bin(code: int) -> float:
    return math.exp(code * STEP_BIN)


@dataclass
class _Pending:
    source: str
    window: str
    steps: list[StepEvent] = field(default_factory=list)


class StepSpans:
    """The writer's side: `take(step)` gives the events to write now, `flush()` the span still gathering."""

    def __init__(self, span_s: float = SPAN_S, raw_steps: int = RAW_STEPS) -> None:
        self.span_s = span_s
        self.raw_steps = raw_steps
        self._pending: _Pending | None = None

    def take(self, event: StepEvent) -> list[StepEvent | StepSpanEvent]:
        if not event.plain or event.window in PROFILED or event.step < self.raw_steps:
            return [*self.flush(), event]
        written: list[StepEvent | StepSpanEvent] = []
        pending = self._pending
        if pending is not None and (pending.source, pending.window) != (event.source, event.window):
            written += self.flush()
        if self._pending is None:
            self._pending = _Pending(event.source, event.window)
        self._pending.steps.append(event)
        if event.t1 - self._pending.steps[0].t0 >= self.span_s:
            written += self.flush()
        return written

    def flush(self) -> list[StepEvent | StepSpanEvent]:
        """The steps gathered so far, as one span (a single step as itself); nothing when none are."""
        pending = self._pending
        if pending is None or not pending.steps:
            return []
        # Summarised before it is let go: a Ctrl-C meanwhile leaves it pending, for the end's flush to write.
        written: list[StepEvent | StepSpanEvent] = [pending.steps[0] if len(pending.steps) == 1
                                                    else summarise(pending.steps)]
        self._pending = None
        return written


def summarise(steps: list[StepEvent]) -> StepSpanEvent:
    """One span of consecutive plain steps of one source and window state."""
    by_wall = sorted(steps, key=lambda s: s.wall_s, reverse=True)
    median = by_wall[len(by_wall) // 2].wall_s
    kept = max(KEPT_SLOWEST, sum(1 for s in by_wall[:MAX_EXACT] if s.wall_s > OUTLIER * median))
    exact, others = by_wall[:kept], by_wall[kept:]
    cpu = [s.data_wait_cpu_s for s in steps if s.data_wait_cpu_s is not None]
    return StepSpanEvent(
        first_step=steps[0].step, last_step=steps[-1].step, t0=steps[0].t0, t1=steps[-1].t1,
        walls=_histogram(s.wall_s for s in others),
        waits=_histogram(s.data_wait_s for s in others if s.data_wait_s >= _SMALLEST),
        data_wait_cpu_s=sum(cpu) if cpu else None,
        batches=sum(s.batches for s in steps), backwards=sum(s.backwards for s in steps),
        forwards=sum(s.forwards for s in steps),
        slowest=sorted((s.step, s.t0, s.t1, s.wall_s, s.data_wait_s) for s in exact),
        source=steps[0].source, window=steps[0].window, t=steps[-1].t,
    )


def _histogram(values: Iterable[float]) -> list[tuple[int, int]]:
    return sorted(Counter(to_bin(v) for v in values).items())


def expand(span: StepSpanEvent) -> Iterator[StepEvent]:
    """The span's steps, numbered first_step to last_step, as plain step events."""
    numbers = range(span.first_step, span.last_step + 1)
    exact = {row[0]: row for row in span.slowest if span.first_step <= row[0] <= span.last_step}
    walls = sorted(from_bin(code) for code, count in span.walls for _ in range(count))
    free = [n for n in numbers if n not in exact]
    del walls[len(free):]
    walls += [walls[-1] if walls else 0.0] * (len(free) - len(walls))  # a span short of values repeats its last
    positive = sorted(from_bin(code) for code, count in span.waits for _ in range(count))[:len(walls)]
    waits = [0.0] * (len(walls) - len(positive)) + positive  # the longest waits go with the longest steps
    order = _trendless(len(free))
    wall_of = {free[i]: walls[j] for i, j in enumerate(order)}
    wait_of = {free[i]: waits[j] for i, j in enumerate(order)}
    for row in exact.values():
        wall_of[row[0]], wait_of[row[0]] = row[3], row[4]
    times = _laid_out(span, numbers, exact, wall_of)
    total_wait = sum(wait_of.values())
    count = len(numbers)
    for k, n in enumerate(numbers):
        if span.data_wait_cpu_s is None:
            cpu = None
        else:
            cpu = span.data_wait_cpu_s * (wait_of[n] / total_wait if total_wait > 0 else 1 / count)
        t0, t1 = times[n]
        yield StepEvent(step=n, t0=t0, t1=t1, wall_s=wall_of[n], data_wait_s=wait_of[n], data_wait_cpu_s=cpu,
                        batches=_share(span.batches, count, k), backwards=_share(span.backwards, count, k),
                        forwards=_share(span.forwards, count, k), source=span.source, window=span.window)


def _trendless(n: int) -> list[int]:
    """A fixed order of n sorted values with no trend: position i takes the value at golden-ratio stride."""
    if n < 3:
        return list(range(n))
    stride = max(1, round(n * _GOLDEN))
    while math.gcd(stride, n) != 1:
        stride += 1
    return [(i * stride) % n for i in range(n)]


def _laid_out(span: StepSpanEvent, numbers: range, exact: dict[int, tuple[int, float, float, float, float]],
              wall_of: dict[int, float]) -> dict[int, tuple[float, float]]:
    """Each step's (t0, t1): the exact steps at their own times, the others filling the time between them in
    proportion to their wall time."""
    times: dict[int, tuple[float, float]] = {}
    start, segment = span.t0, list[int]()
    for n in [*numbers, None]:
        row = exact.get(n) if n is not None else None
        if n is not None and row is None:
            segment.append(n)
            continue
        end = max(start, row[1] if row is not None else span.t1)
        total = sum(wall_of[m] for m in segment)
        cursor = start
        for m in segment:
            width = (end - start) * (wall_of[m] / total if total > 0 else 1 / len(segment))
            times[m] = (cursor, cursor + width)
            cursor += width
        if row is not None:
            times[row[0]] = (row[1], row[2])
            start = max(start, row[2])
        segment = []
    return times


def _share(total: int, count: int, k: int) -> int:
    """Step k's part of `total` split over `count` steps as evenly as integers allow."""
    return total // count + (1 if k < total % count else 0)
