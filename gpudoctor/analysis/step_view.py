"""`StepView`: one profiling window's steps, built once: the steps analysed, those after start-up, those the per-call
hooks watched, and the whole run's."""

from __future__ import annotations

from collections.abc import Iterable
from functools import cached_property

from gpudoctor.analysis.events import ANALYSED_WINDOW_STATES, RunEvents
from gpudoctor.analysis.steps import StepBuilder
from gpudoctor.analysis.views import Step
from gpudoctor.bundle.events import StepEvent


class StepView:
    """The steps of window number `window` of a run (`events`), made by `builder`; `startup_steps` are skipped as
    start-up (the window's `wait`). A bare trace (`trace_only`) has its steps from the trace alone."""

    def __init__(self, events: RunEvents, window: int, builder: StepBuilder, trace_only: bool,
                 startup_steps: int) -> None:
        self._events, self.window, self._builder = events, window, builder
        self.trace_only, self.startup_steps = trace_only, startup_steps

    def step_events(self) -> Iterable[StepEvent]:
        """The window's step events: from its opening to the next window's."""
        return self._events.steps_of(self.window)

    @cached_property
    def all_steps(self) -> list[Step]:
        """Every step of the window, start-up and the profiler's warm-up included."""
        if self.trace_only:
            return self._builder.from_trace()
        return [self._builder.from_event(e) for e in self.step_events()]

    @cached_property
    def run_steps(self) -> list[Step]:
        """Every step of the whole run, every window's included (the same as all_steps with one window)."""
        if len(self._events.windows) < 2:
            return self.all_steps
        steps, (first, end) = self._events.steps, self._events.step_positions(self.window)
        build = self._builder.from_event
        return ([build(e) for e in steps.between(0, first)] + self.all_steps
                + [build(e) for e in steps.between(end, len(steps))])

    @property
    def window_spans(self) -> dict[int, tuple[float, float]]:
        """Each profiling window's analysed steps, from the first one's start to the last one's end."""
        return self._events.window_spans

    @property
    def steps_in_run(self) -> int:
        """Steps in the whole run, every window's included."""
        return len(self.all_steps) if self.trace_only else len(self._events.steps)

    @cached_property
    def steps(self) -> list[Step]:
        """The steps analysed: those the profiler's active window recorded, otherwise every step after start-up but
        the profiler's warm-up ones, which it slows, otherwise all of them."""
        active = [s for s in self.all_steps if s.window in ANALYSED_WINDOW_STATES]
        return active or [s for s in self.steady_steps if s.window != "warmup"] or self.steady_steps

    @cached_property
    def steady_steps(self) -> list[Step]:
        """Every step after start-up (the window's `wait`), inside the window or not.

        Data wait and wall time are measured at every step, so figures built from them alone should use
        these: a loader with many workers starves in bursts, one long wait every `num_workers` steps,
        which a short window can miss. The step the script's end closed is not one: it holds what ran after
        the loop.
        """
        steps = [s for s in self.all_steps if not s.ends_run]
        wait = self.startup_steps
        return steps[wait:] if len(steps) > wait else steps

    @property
    def span(self) -> tuple[float, float] | None:
        """From the first analysed step's start to the last one's end (seconds since the epoch)."""
        return (self.steps[0].start, self.steps[-1].end) if self.steps else None

    @property
    def wall_s(self) -> float:
        """Wall time of the analysed steps."""
        return sum(s.wall_s for s in self.steps)

    @cached_property
    def hooked_step_events(self) -> list[StepEvent]:
        """The steps gpudoctor's per-call hooks watched: the window's detail steps, after the profiled ones
        (in bundles recorded before there were detail steps, the analysed steps themselves)."""
        detail = [e for e in self._events.steps_of(self.window) if e.window == "detail"]
        if detail:
            return detail
        analysed = {s.index for s in self.steps}
        return list(self._events.steps_of(self.window, analysed))

    @cached_property
    def hooked_steps(self) -> list[Step]:
        """The steps the per-call hooks watched (phases, copies, syncs): the window's detail steps, if any."""
        return [self._builder.from_event(e) for e in self.hooked_step_events]

    @property
    def site_steps(self) -> int:
        """How many steps the call sites (copies, syncs) add up: divide their counts and times by it for figures
        per step."""
        return len(self.hooked_step_events) or len(self.steps) or 1
