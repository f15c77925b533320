"""`GpuWork`: the GPU's work over one profiling window's steps, built once: each step split into the budget's
slices, the GPU's work and idle per step, the idle that synchronizing calls explain, the kernels the steps launch,
how they launch them and the precision their matrix math runs in."""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from gpudoctor.analysis.budget import idle_in_syncs, step_splits
from gpudoctor.analysis.collectives import collective_only_s
from gpudoctor.analysis.events import TRACED_WINDOW_STATES
from gpudoctor.analysis.fusion import Fusion, fusion
from gpudoctor.analysis.gpu import GpuView
from gpudoctor.analysis.gpu_ops import GpuOps
from gpudoctor.analysis.kernels import kernels_in_steps
from gpudoctor.analysis.precision import Precision, precision
from gpudoctor.analysis.step_view import StepView
from gpudoctor.analysis.steps import OPTIMIZER_STEP
from gpudoctor.analysis.trace import GRAPH_LAUNCH, TraceData
from gpudoctor.analysis.views import Step
from gpudoctor.bundle.events import CudaDevice


def gpu_view(trace: TraceData | None) -> GpuView | None:
    """The GPU activity in `trace`, over its steps (or all of it without step ranges); None when it has none."""
    if trace is None or not trace.has_gpu:
        return None
    if trace.steps:
        span = (min(s for s, _ in trace.steps.values()), max(e for _, e in trace.steps.values()))
    else:
        span = (trace.gpu_ops[0].start, max(op.end for op in trace.gpu_ops))
    return GpuView(trace.gpu_ops, span)


def optimizer_spans(trace: TraceData, steps: StepView, placed: Sequence[Step],
                    steps_end_in_optimizer: bool) -> list[tuple[float, float]]:
    """When the host ran an optimizer's step() in the `placed` steps: torch's `Optimizer.step#` annotations where
    the trace has them; else, in steps that end as their optimizer.step() returns (steps marked by the
    optimizer), the end of each step for the share of the step that optimizer.step() took in the steps that timed
    it (the window's detail steps, off the trace); empty where neither says."""
    annotated = [(a.start, a.end) for a in trace.annotations if a.name.startswith(OPTIMIZER_STEP)]
    if annotated or not steps_end_in_optimizer:
        return sorted(annotated)
    shares = [s.optimizer_s / s.wall_s for s in steps.all_steps if s.optimizer_s is not None and s.wall_s > 0]
    if not shares:
        return []
    share = statistics.median(shares)
    return [(s.end - share * s.wall_s, s.end) for s in placed]


def launched_in(trace: TraceData, spans: list[tuple[float, float]]) -> set[int]:
    """The correlation ids of the CUDA calls the host made within `spans` (sorted, not overlapping)."""
    starts = [start for start, _ in spans]
    inside: set[int] = set()
    for call in trace.runtime:
        at = bisect.bisect_right(starts, call.start) - 1
        if call.correlation is not None and at >= 0 and call.start < spans[at][1]:
            inside.add(call.correlation)
    return inside


@dataclass(frozen=True)
class Launches:
    """How the analysed steps that lie on the trace launch their kernels: shares of their wall time the GPU was
    busy, the steps waited for data, and the GPU idled in synchronizing calls; and the kernels' durations."""

    steps: int
    wall_s: float
    busy_share: float
    wait_share: float
    stalled_share: float
    durations: list[float]  # seconds, a float per kernel

    @property
    def kernels_per_step(self) -> float:
        return len(self.durations) / self.steps

    @property
    def median_kernel_s(self) -> float:
        return statistics.median(self.durations)

    @property
    def idle_per_kernel_s(self) -> float:
        """The GPU's idle time, syncs' stalls left out, per kernel: the time to launch the next one, when the host
        does nothing else between launches."""
        return (1 - self.busy_share - self.stalled_share) * self.wall_s / len(self.durations)


class GpuWork:
    """The GPU's work over the steps of `steps`, from its activity in the trace (`gpu`, None without any)."""

    def __init__(self, gpu: GpuView | None, trace: TraceData | None, steps: StepView,
                 steps_end_in_optimizer: bool = False) -> None:
        self.gpu, self._trace, self._steps = gpu, trace, steps
        self._steps_end_in_optimizer = steps_end_in_optimizer  # each step ends as its optimizer.step() returns

    @cached_property
    def placed_steps(self) -> list[Step]:
        """The analysed steps that lie on the trace, with GPU figures."""
        return [s for s in self._steps.steps if s.gpu_busy_s is not None]

    @property
    def idle_share(self) -> float | None:
        """The GPU's idle time over the analysed steps' wall time, or None when the trace has no GPU activity."""
        measured = [s for s in self._steps.steps if s.gpu_idle_s is not None]
        wall = sum(s.wall_s for s in measured)
        return sum(s.gpu_idle_s or 0.0 for s in measured) / wall if wall > 0 else None

    @cached_property
    def splits(self) -> list[dict[str, float]] | None:
        """The analysed steps split into the budget's slices, once (analysis.budget.step_splits)."""
        return step_splits(self._steps.steps, self.gpu, self._trace)

    @cached_property
    def sync_stall_s(self) -> float | None:
        """GPU idle time, over the analysed steps, that overlaps a synchronizing CUDA call on the host: while the
        host is blocked in a sync the GPU drains its queue, then idles until the host launches again: those gaps
        are what the syncs cost. None when the trace has no GPU activity."""
        if self.gpu is None or self._trace is None or not self._steps.steps:
            return None
        return idle_in_syncs(self.splits or [])

    @cached_property
    def per_step_s(self) -> float | None:
        """The GPU's work for one step: its busy time over the whole trace, what it ran after the host had launched
        the last traced step included (a host that runs ahead of a GPU-bound step leaves its work queued past the
        step's end, and the profiler's stop waits for it), over the steps traced (the profiler's warm-up ones
        too). Collectives with no compute beside them are left out: on a rank of a job they are mostly its wait
        for the others, which an NCCL kernel spends busy (a rank that waited 3 ms a step read as GPU-bound at
        8.0 ms a step, its host and the other rank stepping in 5.6). None without GPU activity in the trace."""
        gpu, steps = self.gpu, self._steps.steps
        if gpu is None or not steps:
            return None
        every = self._steps.all_steps
        traced = len(every) if self._steps.trace_only else sum(1 for s in every if s.window in TRACED_WINDOW_STATES)
        work = gpu.busy_s(-math.inf, math.inf) - collective_only_s(self._trace)
        return max(0.0, work) / (traced or len(steps))

    @cached_property
    def kernels(self) -> GpuOps | None:
        """The kernels that start in the placed steps, step by step; None without GPU activity or placed steps."""
        if self.gpu is None or not self.placed_steps:
            return None
        return kernels_in_steps(self.gpu, self.placed_steps)

    @cached_property
    def launches(self) -> Launches | None:
        """How the placed steps launch their kernels (GD301); None without kernels in them."""
        steps, kernels = self.placed_steps, self.kernels
        if kernels is None:
            return None
        durations = list(kernels.durations())
        wall = sum(s.wall_s for s in steps)
        if not durations or wall <= 0:
            return None
        return Launches(len(steps), wall, busy_share=sum(s.gpu_busy_s or 0.0 for s in steps) / wall,
                        wait_share=sum(s.data_wait_s for s in steps) / wall,
                        stalled_share=(self.sync_stall_s or 0.0) / wall, durations=durations)

    @cached_property
    def precision(self) -> Precision | None:
        """The placed steps' kernels by the precision their matrix math runs in, on the device they train on
        (analysis.precision); None without kernels in them."""
        kernels, gpu = self.kernels, self.gpu
        if kernels is None or gpu is None:
            return None
        return precision(kernels, len(self.placed_steps), self._trace, gpu.primary_device)

    @cached_property
    def fusion(self) -> Fusion | None:
        """The share of the placed steps' kernels torch.compile would fuse (analysis.fusion); None without kernels."""
        if self.kernels is None:
            return None
        spans = (optimizer_spans(self._trace, self._steps, self.placed_steps, self._steps_end_in_optimizer)
                 if self._trace else [])
        return fusion(self.kernels, launched_in(self._trace, spans) if self._trace and spans else ())

    @cached_property
    def replays_cuda_graphs(self) -> bool:
        """Whether the profiled steps launch CUDA graphs (cudaGraphLaunch in the trace)."""
        trace = self._trace
        return trace is not None and any(call.name == GRAPH_LAUNCH for call in trace.runtime)


def memory_headroom(steps: list[Step], device: CudaDevice | None) -> float | None:
    """How many times the steps' peak CUDA allocation fits in the device's memory; None when either is unknown."""
    peaks = [s.cuda_memory.max_allocated for s in steps if s.cuda_memory]
    total = device.total_memory if device is not None else None
    if not peaks or not total or not max(peaks):
        return None
    return total / max(peaks)
