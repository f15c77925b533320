"""The run's time base: where its steps came from, and how much the profiling window slowed the steps it measured.

Every figure gpudoctor gives is a share of a step, so a reader needs to know what a step was (`step_source`) and
whether the profiled steps, which the trace-based figures come from, ran like the others (`window_distortion`:
the median profiled step over the median step outside the windows; 1.0 means the profiler cost nothing).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from itertools import pairwise

from gpudoctor.analysis.step_view import StepView
from gpudoctor.analysis.steps import trace_steps
from gpudoctor.analysis.trace import TraceData
from gpudoctor.analysis.views import Step
from gpudoctor.bundle.events import StepSourceEvent

# What each recorded source is called in findings.json (older bundles wrote "explicit" for gpudoctor.step()).
SOURCE_NAMES = {"explicit": "marker"}
MIN_UNPROFILED_STEPS = 3  # fewer steps outside the window than this give no median to compare with


def step_source(steps: StepView, declared: list[StepSourceEvent], trace: TraceData | None) -> str | None:
    """marker, optimizer, backward, dataloader or forward (the recorder's `declared` sources); for a bare trace,
    profiler_step (its ProfilerStep ranges) or optimizer (its optimizer.step() calls); None when no step was
    found."""
    if steps.trace_only:
        return trace_steps(trace)[0] if trace is not None else None
    if not declared or not steps.all_steps:
        return None
    # The source in force at the first analysed step: a stronger one that took over later, in a run too short to
    # measure its steps again (collect.window's restart), counted none of them.
    first = steps.steps[0].index if steps.steps else None
    in_force = [e for e in declared if first is None or e.at_step <= first] or declared
    return SOURCE_NAMES.get(in_force[-1].source, in_force[-1].source)


@dataclass(frozen=True)
class WindowDistortion:
    """The median profiled step over the median un-profiled one, or None with the reason it cannot be said."""

    ratio: float | None
    profiled_s: float | None = None  # median step inside the window
    unprofiled_s: float | None = None  # median step outside the windows, after start-up
    reason: str | None = None


def window_distortion(steps: StepView) -> WindowDistortion:
    if steps.trace_only:
        return WindowDistortion(None, reason="a bare trace has no steps outside the profiling window to compare with")
    profiled = [s.wall_s for s in steps.steps if s.window == "active"]
    unprofiled = [s.wall_s for s in steps.all_steps if s.window == "closed" and not s.ends_run]  # till the next window
    if not profiled:
        return WindowDistortion(None, reason="no step was profiled")
    if len(unprofiled) < MIN_UNPROFILED_STEPS:
        return WindowDistortion(None, reason=f"only {len(unprofiled)} steps ran after the profiling window "
                                             f"(at least {MIN_UNPROFILED_STEPS} are needed to compare)")
    inside, outside = statistics.median(profiled), statistics.median(unprofiled)
    if outside <= 0:
        return WindowDistortion(None, reason="the steps outside the profiling window took no time")
    return WindowDistortion(round(inside / outside, 3), inside, outside)


# A window that slows its steps more than this has its findings' savings sized on the steps outside it.
DISTORTION_LIMIT = 1.10


@dataclass(frozen=True)
class ReferenceStep:
    """The step time that savings and "after the fix" times are given against: the median analysed step or,
    when the window slowed its steps more than DISTORTION_LIMIT, the median step outside it (`outside`)."""

    seconds: float | None
    outside: bool = False


def reference_step(steps: StepView, distortion: WindowDistortion) -> ReferenceStep:
    if distortion.ratio is not None and distortion.ratio > DISTORTION_LIMIT and distortion.unprofiled_s:
        return ReferenceStep(distortion.unprofiled_s, outside=True)
    analysed = steps.steps
    return ReferenceStep(statistics.median(s.wall_s for s in analysed) if analysed else None)


@dataclass(frozen=True)
class StepTime:
    """The time a step takes at the run's pace: what savings, "after the fix" times and speed-ups are given against.

    A mean, not a median: a loader that cannot keep up starves in bursts (one long wait every few steps, the
    steps between them fed from its queue), and a median step is then a fed one, a fraction of the pace.
    `basis` says where it comes from: "unprofiled" (the steps after the profiling window, the first one left out:
    it carries the profiler's stop and the trace's export), "analysed" (the analysed steps, with too few
    un-profiled ones) or "gpu_work" (the GPU's work per step, when it takes longer: the host launched ahead of
    the GPU, which set the pace).
    """

    seconds: float | None
    basis: str | None = None
    steps: int = 0  # how many steps the mean is over
    evaluations: int = 0  # steps left out of the mean because they ran an evaluation (EVALUATION_CALLS)
    stalls: int = 0  # steps left out of the mean because they stalled outside their data wait (STALL_FACTOR)

    @property
    def reported_s(self) -> float | None:
        """`seconds` to the nanosecond, as findings.json gives it (`run.step_s`): the step that a run's tries and a
        job's ranks are measured against."""
        return None if self.seconds is None else round(self.seconds, 9)


def step_time(view: StepView, gpu_work_per_step_s: float | None) -> StepTime:
    """The step at the run's pace, from the steps of `view` and the GPU's work per step (see StepTime)."""
    steps, basis = _timed_steps(view)
    if not steps:
        return StepTime(None)
    trained = _without_evaluations(steps)
    kept = _without_stalls(trained)
    mean = statistics.fmean(s.wall_s for s in kept)
    evaluations, stalls = len(steps) - len(trained), len(trained) - len(kept)
    if gpu_work_per_step_s is not None and gpu_work_per_step_s > mean:
        return StepTime(gpu_work_per_step_s, "gpu_work", len(kept), evaluations, stalls)
    return StepTime(mean, basis, len(kept), evaluations, stalls)


def paced_steps(view: StepView) -> list[Step]:
    """The steps the run's pace is the mean of (step_time): those after the profiling window, or the analysed ones
    where too few ran after it, without evaluations and rare stalls."""
    steps, _ = _timed_steps(view)
    return _without_stalls(_without_evaluations(steps)) if steps else []


def _timed_steps(view: StepView) -> tuple[list[Step], str]:
    unprofiled = _unprofiled_steps(view)
    return (unprofiled, "unprofiled") if len(unprofiled) >= MIN_UNPROFILED_STEPS else (view.steps, "analysed")


# A step that calls the model more than this many times its steps' usual number ran an evaluation (nanoGPT's
# estimate_loss every 250 iterations: 400 calls in one optimizer step). Its time is no training step's, and one
# in 250 made the mean 43% longer than the steps around it on an H100 (17.6 ms median, 25.2 ms mean).
EVALUATION_CALLS = 4


def _without_evaluations(steps: list[Step]) -> list[Step]:
    """The steps that did not run an evaluation, by their calls of the outermost model (bundles that did not count
    them, and runs whose steps are those calls, keep every step)."""
    usual = statistics.median(s.forwards for s in steps)
    if usual < 1:
        return steps
    kept = [s for s in steps if s.forwards <= EVALUATION_CALLS * usual]
    return kept or steps


# A rare step that took this many times the usual step outside its wait for data stalled on something no fix of the
# step changes: a checkpoint, a pause, or, in a data-parallel job, another rank's evaluation (nanoGPT's rank 0
# evaluates alone every 250 iterations; the other ranks wait for it in their all-reduce, about 2.4 s on an H100
# against 15 ms steps). Rare: at most STALL_SHARE of the steps. A loader's bursts, one long step every
# `num_workers`, are waits for data, and stay.
STALL_FACTOR = 20
STALL_SHARE = 0.02


def _without_stalls(steps: list[Step]) -> list[Step]:
    """The steps but the rare ones that stalled outside their data wait (STALL_FACTOR)."""
    work = [s.wall_s - s.data_wait_s for s in steps]
    usual = statistics.median(work)
    if usual <= 0:
        return steps
    kept = [s for s, w in zip(steps, work) if w <= STALL_FACTOR * usual]
    return kept if len(steps) - len(kept) <= STALL_SHARE * len(steps) else steps


def _unprofiled_steps(view: StepView) -> list[Step]:
    """The steps after each profiling window but the first one (the profiler's stop and the trace's export), and
    not the one the script's end closed (what ran after the loop)."""
    if view.trace_only:
        return []
    steps = view.all_steps
    return [s for before, s in pairwise(steps)
            if s.window == "closed" and before.window == "closed" and not s.ends_run]
