"""The job's start-up: its time from launch to the end of its first step, beyond one step at the run's pace, split
into its causes (collect.startup): the interpreter's start, torch's import, CUDA's initialization, the DataLoader
workers' start and first batches, compilation, and the script's own set-up (the lines the main thread was seen in);
and the workers a DataLoader starts again at each later epoch, which without persistent workers is start-up paid
again and again.
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from gpudoctor.analysis.views import Location, Step
from gpudoctor.bundle.events import (
    CompileEvent,
    EndEvent,
    LoaderStartEvent,
    ProcessEvent,
    StartupEvent,
    StartupLinesEvent,
)
from gpudoctor.bundle.manifest import Manifest

PHASES = ("interpreter", "torch_import", "imports", "cuda_init", "loader_workers", "compile", "first_step", "setup")
PHASE_NAMES = {"interpreter": "the interpreter's start", "torch_import": "import torch",
               "imports": "the script's other imports", "cuda_init": "CUDA's initialization",
               "loader_workers": "the DataLoader workers' start", "compile": "torch.compile",
               "first_step": "the first step's own start (libraries loaded, kernels chosen)",
               "setup": "the script's own set-up"}
# The phases a change to the script shortens: its own set-up (cached on disk), the loader's workers (as many as
# the cores, started once), compilation (cached between jobs). The others are every job's fixed costs.
CHANGEABLE = ("setup", "loader_workers", "compile")


@dataclass(frozen=True)
class StartupEvents:
    """The events a start-up is made of."""

    process: list[ProcessEvent]
    ends: list[EndEvent]
    timed: list[StartupEvent]
    lines: list[StartupLinesEvent]
    loaders: list[LoaderStartEvent]
    compiles: list[CompileEvent]
    loop_lines: frozenset[tuple[str, int]] = frozenset()  # (file, line) the training loop's steps were seen at


@dataclass(frozen=True)
class Restart:
    """A DataLoader that started its workers again at a later epoch: in step `step`, taking `seconds` (that step
    beyond the usual one: the old workers shut down, the new ones started, the first batch awaited)."""

    loader_id: int | None
    step: int
    seconds: float
    workers: int


@dataclass(frozen=True)
class Startup:
    """The job's start-up: `seconds` from its launch to its first step's end, beyond one step at the run's pace,
    split into `phases` (PHASES, in seconds; "setup" is what the others leave), the lines the main thread was
    seen in meanwhile (`lines`, with their shares of the samples), the loaders' `restarts` after it, and the
    job's time from launch to its end (`job_s`)."""

    seconds: float
    job_s: float
    phases: dict[str, float]
    lines: tuple[tuple[Location, float], ...]
    restarts: tuple[Restart, ...]
    first_loader_workers: int

    @property
    def restart_s(self) -> float:
        return sum(r.seconds for r in self.restarts)

    @property
    def share(self) -> float:
        """The share of the job spent starting up, later epochs' worker starts included."""
        return min(1.0, (self.seconds + self.restart_s) / self.job_s) if self.job_s > 0 else 0.0

    @property
    def largest(self) -> str:
        """The phase that took the most of the start-up."""
        return max(self.phases.items(), key=lambda item: item[1])[0]

    @property
    def changeable_share(self) -> float:
        """The share of the job in what a change to the script shortens: the changeable phases (CHANGEABLE) and
        the later epochs' worker starts."""
        changeable = sum(self.phases.get(name, 0.0) for name in CHANGEABLE) + self.restart_s
        return min(1.0, changeable / self.job_s) if self.job_s > 0 else 0.0

    @property
    def largest_changeable(self) -> str | None:
        """The changeable phase that took the most, or "restarts" for the later epochs' worker starts."""
        times = {name: self.phases.get(name, 0.0) for name in CHANGEABLE} | {"restarts": self.restart_s}
        name, seconds = max(times.items(), key=lambda item: item[1])
        return name if seconds > 0 else None


def startup(manifest: Manifest, steps: Sequence[Step], events: StartupEvents, pace_s: float | None) -> Startup | None:
    """The start-up of the run whose steps (every step of the run, in order) and events are given; None when the
    launch or the first step's end is not known, or the start-up was not watched (a bundle recorded before
    gpudoctor watched it: no start-up event)."""
    launch = _launch(manifest, events.process)
    if launch is None or not steps or not (events.timed or events.lines):
        return None
    first = steps[0]
    end = _end(manifest, launch, events.ends, steps[-1].end)
    seconds = max(0.0, first.end - launch - (pace_s or 0.0))
    usual_wait = statistics.median(s.data_wait_s for s in steps)
    usual_s = statistics.median(s.wall_s for s in steps)
    loader_starts = events.loaders
    first_starts = [e for e in loader_starts if e.step == first.index]
    phases = _phases(launch, seconds, first, events, first_starts, pace_s)
    restarts = tuple(_restart(e, steps, usual_wait, usual_s) for e in loader_starts
                     if e.step > first.index and e.workers > 0 and not _reused(e, loader_starts))
    return Startup(seconds, max(0.0, end - launch), phases, _lines(events.lines), restarts,
                   max((e.workers for e in first_starts), default=0))


def _launch(manifest: Manifest, process: list[ProcessEvent]) -> float | None:
    """When the job was launched: the manifest's creation (gpudoctor's start), else the script's process's start."""
    if manifest.created is not None:
        try:
            return dt.datetime.fromisoformat(manifest.created).timestamp()
        except ValueError:
            pass
    return next((e.t for e in process if e.t is not None), None)


def _end(manifest: Manifest, launch: float, ends: list[EndEvent], last_step_end: float) -> float:
    """When the job ended: its recorded duration from the launch, its end event, or its last step's end, the
    latest of them."""
    known = [e.t for e in ends if e.t is not None] + [last_step_end]
    if manifest.duration_s is not None and manifest.created is not None:
        known.append(launch + manifest.duration_s)
    return max(known)


def _phases(launch: float, seconds: float, first: Step, events: StartupEvents, first_starts: list[LoaderStartEvent],
            pace_s: float | None) -> dict[str, float]:
    """The start-up's `seconds` by phase. The timed phases are as timed; the sampled ones (imports, the script's own
    set-up) are the looks at the main thread that found it there, times the sampling interval; the lines of the
    training loop (those the detail steps' hooks saw the host in) and what no look explains are the first step's
    own start (libraries loaded, kernels chosen). The phases are scaled down where they add up to more than the
    start-up (the samples and the timings overlap)."""
    process = next((e.t for e in events.process if e.t is not None), launch)
    timed = {e.phase: e.seconds for e in events.timed}
    first_wait = first.data_wait_s if first_starts else 0.0  # the first batch, waiting for the workers to start
    phases = {
        "interpreter": max(0.0, process - launch),
        "torch_import": timed.get("torch_import", 0.0),
        "cuda_init": timed.get("cuda_init", 0.0),
        "loader_workers": sum(e.seconds for e in first_starts) + first_wait,
        "compile": sum(e.seconds for e in events.compiles if e.step == first.index),
    }
    imports, setup = _sampled(events.lines, events.loop_lines)
    phases["imports"] = max(0.0, imports - phases["torch_import"])
    phases["setup"] = setup
    known = sum(phases.values())
    phases["first_step"] = max(0.0, seconds - known)
    if known > seconds > 0:
        phases = {name: value * seconds / known for name, value in phases.items()}
    return phases


def _sampled(events: list[StartupLinesEvent], loop_lines: frozenset[tuple[str, int]]) -> tuple[float, float]:
    """The seconds the main thread was seen importing, and at the script's own lines outside its training loop."""
    event = events[0] if events else None
    if event is None:
        return 0.0, 0.0
    own = sum(line.samples for line in event.lines if (line.file, line.line) not in loop_lines)
    return event.importing * event.interval_s, own * event.interval_s


def _reused(start: LoaderStartEvent, starts: list[LoaderStartEvent]) -> bool:
    """A persistent loader's later iterations reuse the workers its first one started."""
    return start.persistent and any(e.loader_id == start.loader_id and e.step < start.step for e in starts)


def _restart(start: LoaderStartEvent, steps: Sequence[Step], usual_wait: float, usual_s: float) -> Restart:
    """A later epoch's worker start: the step it happened in, over the usual step (the old workers shut down, the
    new ones started, the first batch awaited), or at least the iterator's making and the first batch's wait."""
    step = next((s for s in steps if s.index == start.step), None)
    if step is None:
        return Restart(start.loader_id, start.step, start.seconds, start.workers)
    seconds = max(step.wall_s - usual_s, start.seconds + max(0.0, step.data_wait_s - usual_wait))
    return Restart(start.loader_id, start.step, seconds, start.workers)


def _lines(events: list[StartupLinesEvent]) -> tuple[tuple[Location, float], ...]:
    """The lines the main thread was seen in before the first step ended, with their shares of the looks."""
    event = events[0] if events else None
    if event is None or not event.samples:
        return ()
    return tuple((Location(line.file, line.line, line.function), line.samples / event.samples) for line in event.lines)
