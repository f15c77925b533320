"""The CUDA caching allocator over the window's steps (collect.gpu_memory, at each step's end): how often it had to
free its cache and retry an allocation, how often it called cudaMalloc and cudaFree inside the steps, its reserved
bytes against those allocated, its peak against the device's capacity; and the host's time in cudaMalloc and
cudaFree in the profiled steps, from the trace.

The allocator's counters count from the process's start: what the window's steps added is the last step's value
less the first's, over the steps between them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpudoctor.analysis.trace import TraceData
from gpudoctor.analysis.views import Step
from gpudoctor.bundle.events import CudaDevice, CudaMemory, OomEvent

ALLOCATOR_CALLS = ("cudaMalloc", "cudaFree")


@dataclass(frozen=True)
class GpuMemory:
    """The allocator over `steps` steps: retries and cudaMalloc/cudaFree calls they added per step, the most
    allocated and reserved at a step's end, the peaks, the bytes free inside split blocks (fragmentation), the
    device's capacity, and the host's seconds per profiled step in cudaMalloc and cudaFree (None: the trace does
    not keep every runtime call)."""

    steps: int
    retries_per_step: float
    mallocs_per_step: float
    frees_per_step: float
    allocated: int
    reserved: int
    peak_allocated: int
    peak_reserved: int
    fragmented: int | None
    capacity: int | None
    calls_s: float | None

    @property
    def peak_share(self) -> float | None:
        """The peak reserved over the device's capacity."""
        return self.peak_reserved / self.capacity if self.capacity else None


def gpu_memory(steps: Sequence[Step], trace: TraceData | None, device: CudaDevice | None) -> GpuMemory | None:
    """The allocator over the steps that recorded its counters; None where fewer than two did (CUDA never
    initialized, or a bundle older than the counters)."""
    measured = [(s, s.cuda_memory) for s in steps if s.cuda_memory is not None
                and s.cuda_memory.alloc_retries is not None]
    if len(measured) < 2:
        return None
    first, last = measured[0][1], measured[-1][1]
    spans = len(measured) - 1
    memories = [m for _, m in measured]
    return GpuMemory(
        steps=len(measured), retries_per_step=_added(first, last, "alloc_retries") / spans,
        mallocs_per_step=_added(first, last, "device_allocs") / spans,
        frees_per_step=_added(first, last, "device_frees") / spans,
        allocated=max(m.allocated for m in memories), reserved=max(m.reserved for m in memories),
        peak_allocated=max(m.max_allocated for m in memories),
        peak_reserved=max(m.max_reserved or m.reserved for m in memories),
        fragmented=max((m.inactive_split for m in memories if m.inactive_split is not None), default=None),
        capacity=device.total_memory if device is not None else None,
        calls_s=_calls_s([s for s, _ in measured], trace),
    )


def _added(first: CudaMemory, last: CudaMemory, counter: str) -> int:
    return max(0, (getattr(last, counter) or 0) - (getattr(first, counter) or 0))


def _calls_s(steps: list[Step], trace: TraceData | None) -> float | None:
    """The host's seconds per profiled step in cudaMalloc and cudaFree (a trace that keeps every runtime call)."""
    profiled = [s for s in steps if s.window == "active"]
    if trace is None or not trace.detail or not profiled:
        return None
    lo, hi = profiled[0].start, profiled[-1].end
    spent = sum(min(c.end, hi) - max(c.start, lo) for c in trace.runtime
                if c.name in ALLOCATOR_CALLS and c.end > lo and c.start < hi)
    return spent / len(profiled)


@dataclass(frozen=True)
class OutOfMemory:
    """CUDA ran out of memory: the allocator when the error ended the script (None: not read), the device's free
    and total bytes (others' use included), and what the failed allocation asked for."""

    memory: CudaMemory | None
    free: int | None
    total: int | None
    requested: str | None


def out_of_memory(events: Sequence[OomEvent]) -> OutOfMemory | None:
    """How the run ran out of GPU memory, if it did."""
    if not events:
        return None
    e = events[-1]
    return OutOfMemory(e.memory, e.free, e.total, e.requested)
