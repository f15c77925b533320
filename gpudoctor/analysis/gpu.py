"""The GPU view: what ran on each device, when it was busy, and when it sat idle."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from functools import cached_property
from itertools import pairwise

from gpudoctor import intervals
from gpudoctor.analysis.trace import GpuOp


@dataclass
class GpuView:
    """GPU activity from the trace. Busy is the union over streams of kernels, copies and memsets, per device."""

    ops: list[GpuOp]
    span: tuple[float, float]  # the analysed steps, first start to last end

    @cached_property
    def devices(self) -> list[int]:
        return sorted({op.device for op in self.ops})

    @cached_property
    def kernels(self) -> list[GpuOp]:
        return [op for op in self.ops if op.kind == "kernel"]

    @cached_property
    def _kernel_starts(self) -> list[float]:
        return [k.start for k in self.kernels]

    @cached_property
    def _kernels_sorted(self) -> bool:
        starts = self._kernel_starts
        return all(a <= b for a, b in pairwise(starts))

    @cached_property
    def memcpys(self) -> list[GpuOp]:
        return [op for op in self.ops if op.kind == "memcpy"]

    @cached_property
    def _busy_by_device(self) -> dict[int, list[intervals.Interval]]:
        return {d: intervals.union((op.start, op.end) for op in self.ops if op.device == d) for d in self.devices}

    @cached_property
    def _compute_by_device(self) -> dict[int, list[intervals.Interval]]:
        return {d: intervals.union((k.start, k.end) for k in self.kernels if k.device == d) for d in self.devices}

    @cached_property
    def primary_device(self) -> int | None:
        """The device with the most busy time: the one the script trains on."""
        if not self.devices:
            return None
        lo, hi = self.span
        return max(self.devices, key=lambda d: intervals.covered(self._busy_by_device[d], lo, hi))

    def busy_s(self, lo: float, hi: float, device: int | None = None) -> float:
        return intervals.covered(self._of_device(self._busy_by_device, device), lo, hi)

    def compute_s(self, lo: float, hi: float, device: int | None = None) -> float:
        return intervals.covered(self._of_device(self._compute_by_device, device), lo, hi)

    def idle_gaps(self, lo: float, hi: float, device: int | None = None) -> list[intervals.Interval]:
        return intervals.gaps(self._of_device(self._busy_by_device, device), lo, hi)

    def _of_device(
        self, by_device: dict[int, list[intervals.Interval]], device: int | None
    ) -> list[intervals.Interval]:
        """The intervals of `device` (default: the primary one); none when the trace has no GPU activity."""
        device = self.primary_device if device is None else device
        return [] if device is None else by_device.get(device, [])

    @cached_property
    def _h2d_copies(self) -> list[intervals.Interval]:
        return intervals.union((op.start, op.end) for op in self.memcpys if "HtoD" in op.name)

    @cached_property
    def _kernels_any_device(self) -> list[intervals.Interval]:
        return intervals.union((k.start, k.end) for k in self.kernels)

    def h2d_copy_overlap(self, lo: float, hi: float) -> tuple[float, float]:
        """Seconds of [lo, hi] with a host-to-device copy in flight, and how many of them a kernel overlaps."""
        spans = intervals.clip(intervals.within(self._h2d_copies, lo, hi), lo, hi)
        copying = sum(e - s for s, e in spans)
        return copying, sum(intervals.covered(self._kernels_any_device, s, e) for s, e in spans)

    def kernels_in(self, lo: float, hi: float) -> list[GpuOp]:
        """Kernels that start in [lo, hi), in the order of `kernels` (by start, as the trace gives them)."""
        if not self._kernels_sorted:
            return [k for k in self.kernels if lo <= k.start < hi]
        starts = self._kernel_starts
        return self.kernels[bisect_left(starts, lo):bisect_left(starts, hi)]

    @property
    def busy_fraction(self) -> float:
        lo, hi = self.span
        return self.busy_s(lo, hi) / (hi - lo) if hi > lo else 0.0
