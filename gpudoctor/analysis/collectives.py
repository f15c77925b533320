"""Time a rank spends in collectives (all-reduce, broadcast, ...), step by step.

On the GPU a collective is an NCCL kernel: it starts when launched and ends when every rank has joined and the
data has moved, so a rank that waits for a slower one shows a long kernel. On the CPU (the gloo backend) the
trace has gloo's own annotation around each collective ("gloo:all_reduce"), timed the same way on gloo's thread.
A collective's time is the union of those intervals within a step: the transfer itself, plus any wait for the
slowest rank.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress

from gpudoctor import intervals
from gpudoctor.analysis.gpu_ops import GPU_KINDS
from gpudoctor.analysis.trace import COLLECTIVE_ANNOTATIONS, TraceData
from gpudoctor.analysis.views import Step


def is_collective_kernel(name: str) -> bool:
    """NCCL's kernels: ncclKernel_AllReduce_..., ncclDevKernel_..., and the like."""
    return "nccl" in name.lower()


def collective_spans(trace: TraceData | None) -> intervals.Disjoint | None:
    """The union of the trace's collectives: NCCL kernels if it has any (the host's "nccl:" annotations time only
    the launch), else gloo's annotations. None when the trace has no collective at all. Computed once a trace."""
    return None if trace is None else trace.derived("collective_spans", _collective_spans)


def _collective_spans(trace: TraceData) -> intervals.Disjoint | None:
    spans = _kernel_spans(trace, collective=True)
    if spans is None:
        spans = _union([(a.start, a.end) for a in trace.annotations if a.name.startswith(COLLECTIVE_ANNOTATIONS)])
    return spans if spans is not None and len(spans) else None


def compute_spans(trace: TraceData) -> intervals.Disjoint:
    """What collectives can overlap: the GPU's other kernels; on a CPU-only trace, the operators of the threads
    that run no collective (the training thread's forward and backward), c10d's own calls left out. Computed once
    a trace."""
    return trace.derived("compute_spans", _compute_spans)


def _compute_spans(trace: TraceData) -> intervals.Disjoint:
    kernels = _kernel_spans(trace, collective=False)
    if kernels is not None:
        return kernels
    collective_threads = {a.tid for a in trace.annotations if a.name.startswith(COLLECTIVE_ANNOTATIONS)}
    found = _union([(op.start, op.end) for op in trace.ops
                    if op.tid not in collective_threads and not op.name.startswith("c10d::")])
    return found if found is not None else intervals.union_of([], [])


def _kernel_spans(trace: TraceData, collective: bool) -> intervals.Disjoint | None:
    """The union of the trace's kernels that are collectives (or that are not), read from the ops' columns: a name
    is looked at once, not once per op. None when there is no such kernel."""
    ops = trace.gpu_ops
    kernel = GPU_KINDS.index("kernel")
    wanted = {i for i, name in enumerate(ops.columns.names) if is_collective_kernel(str(name)) == collective}
    keep = [k == kernel and n in wanted for k, n in zip(ops.kinds(), ops.name_ids())]
    if not any(keep):
        return None
    return _union(list(zip(compress(ops.starts(), keep), compress(ops.ends(), keep))))


def _union(spans: list[tuple[float, float]]) -> intervals.Disjoint | None:
    if not spans:
        return None
    starts, ends = zip(*sorted(spans))
    return intervals.union_of(starts, ends)


@dataclass(frozen=True)
class Exposed:
    """A step's seconds in collectives while no compute ran beside them (see compute_spans): communication on
    the step's critical path; `before_last_backward` is the part that started before the step's last backward()
    call, in a step of several (gradient accumulation): all-reduces of gradients that are not final yet;
    `all_before_last_backward` counts those all-reduces whole, overlapped or not."""

    seconds: float
    before_last_backward: float
    all_before_last_backward: float


def exposed_per_step(trace: TraceData | None, steps: Sequence[Step]) -> list[Exposed] | None:
    """Each step's exposed communication; None when the trace shows no collective."""
    spans = collective_spans(trace)
    if spans is None or trace is None:
        return None
    compute = compute_spans(trace)
    exposed = []
    for step in steps:
        pieces = [(start, end, (end - start) - compute.covered(start, end))
                  for start, end in spans.clipped(step.start, step.end)]
        last = step.last_backward
        early = [(start, end, bare) for start, end, bare in pieces if last is not None and start < last]
        exposed.append(Exposed(sum(bare for _, _, bare in pieces), sum(bare for _, _, bare in early),
                               sum(end - start for start, end, _ in early)))
    return exposed


def collective_only_s(trace: TraceData | None) -> float:
    """Seconds of the trace in collectives with no compute beside them: on a rank that waits for another, mostly
    the wait, which is no work of its own GPU. 0 without collectives."""
    spans = collective_spans(trace)
    if spans is None or trace is None:
        return 0.0
    compute = compute_spans(trace)
    return sum((end - start) - compute.covered(start, end) for start, end in spans.clipped(-math.inf, math.inf))


def collective_s_per_step(trace: TraceData | None, steps: Sequence[Step]) -> list[float] | None:
    """Each step's seconds in collectives (the steps must lie on the trace's clock, as the analysed ones do);
    None when the trace shows no collective."""
    spans = collective_spans(trace)
    if spans is None:
        return None
    return [spans.covered(step.start, step.end) for step in steps]


def collective_ends(trace: TraceData | None, steps: Sequence[Step]) -> list[float | None] | None:
    """When each step's last collective ended, on the trace's clock (None for a step with none); None when the
    trace shows no collective. Under DDP the last all-reduce of a step ends at one moment on every rank, when
    the last rank's data has arrived: what the job's ranks' clocks are aligned by (gpudoctor.job.clocks)."""
    spans = collective_spans(trace)
    if spans is None:
        return None
    ends: list[float | None] = []
    for step in steps:
        within = spans.clipped(step.start, step.end)
        ends.append(within[-1][1] if within else None)
    return ends
