"""GPU idle time that a synchronizing CUDA call on the host explains."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from itertools import accumulate

from gpudoctor.analysis.gpu import GpuView
from gpudoctor.analysis.trace import SYNC_CALLS, TraceData
from gpudoctor.analysis.views import Step


def sync_stall_s(gpu: GpuView, trace: TraceData, steps: Sequence[Step]) -> float:
    """The GPU's idle gaps within the steps that overlap a synchronizing call (or a blocking cudaMemcpy): while
    the host is blocked in one, the GPU drains its queue, then idles until the host launches again."""
    syncs = [r for r in trace.runtime if r.name in SYNC_CALLS or r.name == "cudaMemcpy"]  # by start
    sync_starts = [s.start for s in syncs]
    latest_end = list(accumulate((s.end for s in syncs), max))  # latest end among the syncs up to each one
    stalled = 0.0
    for step in steps:
        for start, end in gpu.idle_gaps(step.start, step.end):
            before = bisect_left(sync_starts, end)  # the syncs that start before the gap ends
            if before and latest_end[before - 1] > start:  # one of them ends after it starts
                stalled += end - start
    return stalled
