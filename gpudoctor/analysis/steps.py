"""Step views: each step's events, lined up with the profiler trace and the GPU's activity in it."""

from __future__ import annotations

from bisect import bisect_left
from typing import TypedDict

from gpudoctor.analysis.gpu import GpuView
from gpudoctor.analysis.trace import TraceData
from gpudoctor.analysis.views import GilStats, Step
from gpudoctor.bundle.events import GilSummary, Phases, StepEvent


class _GpuFields(TypedDict, total=False):
    """A step's GPU figures, present only when the step lies in the trace."""

    gpu_busy_s: float
    gpu_compute_s: float
    gpu_idle_s: float
    kernels: int


PROFILED = ("warmup", "active")  # the window states whose steps the profiler recorded
OVERLAP_SAID = 0.01  # phases adding up to more than this share past the step's wall time overlap


def _optimizer_alone(phases: Phases, event: StepEvent, copy_s: float | None, sync_s: float | None) -> float:
    """The optimizer's own seconds in a step. Bundles recorded before the optimizer's time left out a closure run
    inside its step() (Lightning's training_step and backward, LBFGS's) counted them in both: where the phases
    then add up to more than the step and the optimizer's time holds the forward and backward, those (or the
    excess, where larger: syncs in the closure) are taken out of it (a Lightning run's phases once added up to
    137%)."""
    if phases.exclusive:
        return phases.optimizer
    timed = event.data_wait_s + phases.forward + phases.backward + phases.optimizer + (copy_s or 0.0) + (sync_s or 0.0)
    excess = timed - event.wall_s
    inside = phases.forward + phases.backward
    if excess <= OVERLAP_SAID * event.wall_s or phases.optimizer < inside:
        return phases.optimizer
    return max(0.0, phases.optimizer - max(excess, inside))  # the closure's whole, and what it timed besides


class StepBuilder:
    """Makes `Step` views for one window's Run (number `window`): `first_step` is the step its trace calls
    ProfilerStep#0, when the trace has such ranges (bundles recorded with a profiler schedule)."""

    def __init__(self, trace: TraceData | None, gpu: GpuView | None, first_step: int, window: int = 0) -> None:
        self.trace, self.gpu, self.first_step, self.window = trace, gpu, first_step, window

    def from_event(self, event: StepEvent) -> Step:
        start, wall = event.t0, event.wall_s
        trace_range = self._trace_range(event)
        if trace_range is not None:  # the trace's clock, so that GPU activity lines up exactly
            start, wall = trace_range[0], trace_range[1] - trace_range[0]
        phases = event.phases
        copy_s = sum(c.host_s for c in event.copies) if event.copies is not None else None
        sync_s = sum(s.host_s for s in event.syncs) if event.syncs is not None else None
        return Step(
            index=event.step, start=start, wall_s=wall, data_wait_s=event.data_wait_s, window=event.window,
            data_wait_cpu_s=event.data_wait_cpu_s,
            forward_s=phases.forward if phases else None, backward_s=phases.backward if phases else None,
            optimizer_s=_optimizer_alone(phases, event, copy_s, sync_s) if phases else None,
            copy_s=copy_s, sync_s=sync_s,
            gil=gil_stats(event.gil), cuda_memory=event.cuda_memory, backwards=event.backwards,
            forwards=event.forwards, batches=event.batches, last_backward=event.last_backward_t,
            ends_run=event.ends_run,
            **self._gpu_fields(start, start + wall, trace_range is not None),
        )

    def from_trace(self) -> list[Step]:
        """A bare trace's steps (see `trace_steps`), with the DataLoader's waits inside each."""
        if self.trace is None:
            return []
        waits = [a for a in self.trace.annotations if "DataLoader" in a.name and "__next__" in a.name]
        wait_starts = [a.start for a in waits]  # annotations are sorted by start
        steps = []
        for index, (start, end) in enumerate(trace_steps(self.trace)[1]):
            wait = sum(a.dur for a in waits[bisect_left(wait_starts, start):bisect_left(wait_starts, end)])
            steps.append(Step(index=index, start=start, wall_s=end - start, data_wait_s=wait, window="active",
                              **self._gpu_fields(start, end, True)))
        return steps

    def _trace_range(self, event: StepEvent) -> tuple[float, float] | None:
        """Where the step lies on the trace's clock: its ProfilerStep range, or else, for a step the profiler
        recorded, its own start and length (the recorder's time.time() and the trace's clock agree to tens of
        microseconds: bench/profiler_cost.py)."""
        if self.trace is None:
            return None
        if self.trace.steps:
            trace_step = event.step - self.first_step
            return self.trace.steps.get(trace_step) if trace_step >= 0 else None
        if event.window in PROFILED and event.window_index == self.window:
            return event.t0, event.t0 + event.wall_s
        return None

    def _gpu_fields(self, start: float, end: float, in_trace: bool) -> _GpuFields:
        if self.gpu is None or not in_trace:
            return {}
        busy = self.gpu.busy_s(start, end)
        return {
            "gpu_busy_s": busy, "gpu_compute_s": self.gpu.compute_s(start, end),
            "gpu_idle_s": max(0.0, (end - start) - busy), "kernels": len(self.gpu.kernels_in(start, end)),
        }


def gil_stats(summary: GilSummary | None) -> GilStats | None:
    if summary is None:
        return None
    return GilStats(summary.samples, summary.mean_s, summary.p95_s, summary.max_s)


OPTIMIZER_STEP = "Optimizer.step#"  # torch's annotation around every optimizer.step(), schedule or not


def trace_steps(trace: TraceData) -> tuple[str | None, list[tuple[float, float]]]:
    """What marks a bare trace's steps, and each step's (start, end): its ProfilerStep ranges (a profiler run
    with a schedule), else the optimizer's step() calls, each ending a step (a profiler run without one)."""
    if trace.steps:
        return "profiler_step", [trace.steps[i] for i in sorted(trace.steps)]
    ends = [a.end for a in trace.annotations if a.name.startswith(OPTIMIZER_STEP)]
    if not ends:
        return None, []
    starts = [min(_first_starts(trace), default=ends[0]), *ends[:-1]]
    return "optimizer", list(zip(starts, ends))


def _first_starts(trace: TraceData) -> list[float]:
    return [spans[0].start for spans in (trace.annotations, trace.runtime, trace.ops, trace.gpu_ops) if spans]
