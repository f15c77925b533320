"""`JobTime`: where the job's time goes outside its steady steps, built once from one window's run: its start-up
(analysis.startup), the steps that stall now and then (analysis.stalls) and what torch.compile compiled
(analysis.compiles)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property

from gpudoctor.analysis.compiles import Compiles, compiles
from gpudoctor.analysis.events import EventsOf
from gpudoctor.analysis.stalls import Stalls, stalled_share, stalls
from gpudoctor.analysis.startup import Startup, StartupEvents, startup
from gpudoctor.analysis.step_view import StepView
from gpudoctor.analysis.timebase import paced_steps
from gpudoctor.bundle.events import (
    CompileEvent,
    DynamoEvent,
    EndEvent,
    HostLinesEvent,
    LoaderStartEvent,
    PauseEvent,
    ProcessEvent,
    StartupEvent,
    StartupLinesEvent,
)
from gpudoctor.bundle.manifest import Manifest


class JobTime:
    """The job's time outside its steady steps: `events` gives the window's events of a kind, `steps` its steps,
    `pace_s` the step at the run's pace."""

    def __init__(self, manifest: Manifest, events: EventsOf, steps: StepView,
                 pace_s: Callable[[], float | None]) -> None:
        self._manifest, self._events, self._steps, self._pace_s = manifest, events, steps, pace_s

    @cached_property
    def startup(self) -> Startup | None:
        """The start-up, and the loaders' worker starts at later epochs; None for a bare trace or without steps."""
        if self._steps.trace_only:
            return None
        loop = frozenset((line.file, line.line) for e in self._events(HostLinesEvent) for line in e.lines)
        events = StartupEvents(self._events(ProcessEvent), self._events(EndEvent), self._events(StartupEvent),
                               self._events(StartupLinesEvent), self._events(LoaderStartEvent),
                               self._events(CompileEvent), loop)
        return startup(self._manifest, self._steps.run_steps, events, self._pace_s())

    @cached_property
    def stalls(self) -> Stalls | None:
        """The steady steps' stalls and their causes; None with too few steps."""
        return stalls(self._steps.steady_steps, self._events(PauseEvent), self._events(LoaderStartEvent))

    @cached_property
    def stall_share(self) -> float:
        """The share of the steps the run's pace is the mean of that stalls of a known cause and later epochs' worker
        starts took beyond the usual step (analysis.stalls.stalled_share): the step budget's `stall` slice."""
        startup = self.startup
        restarted = [r.step for r in startup.restarts] if startup is not None else []
        return stalled_share(paced_steps(self._steps), self.stalls, restarted)

    @cached_property
    def compiles(self) -> Compiles | None:
        """What torch.compile compiled, its graph breaks and recompilations; None when it compiled nothing."""
        return compiles(self._events(CompileEvent), self._events(DynamoEvent))
