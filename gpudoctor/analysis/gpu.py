"""The GPU view: what ran on each device, when it was busy, and when it sat idle.

The ops stay columns (`GpuOps`): the kernels, the memcpys and the ops of a step are rows of them, and the busy and
compute time of each device are unions held as arrays (`intervals.Disjoint`), built once from the sorted starts
and ends.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import compress, islice
from operator import and_, gt

from gpudoctor import intervals
from gpudoctor.analysis.gpu_ops import GPU_KINDS, GpuOp, GpuOps, array_of

_KERNEL, _MEMCPY = GPU_KINDS.index("kernel"), GPU_KINDS.index("memcpy")


@dataclass
class GpuView:
    """GPU activity from the trace. Busy is the union over streams of kernels, copies and memsets, per device."""

    ops: Sequence[GpuOp]  # a trace's GpuOps (by start), or any sequence of GpuOp
    span: tuple[float, float]  # the analysed steps, first start to last end

    @cached_property
    def _table(self) -> GpuOps:
        return self.ops if isinstance(self.ops, GpuOps) else GpuOps.of(self.ops)

    @cached_property
    def devices(self) -> list[int]:
        return sorted(set(self._table.devices()))

    def _mask(self, kind: int) -> bytes:
        """1 for each op of `kind`, 0 for the others."""
        return bytes(self._table.kinds()).translate(bytes(k == kind for k in range(256)))

    @cached_property
    def _kernel_mask(self) -> bytes:
        return self._mask(_KERNEL)

    @cached_property
    def kernels(self) -> GpuOps:
        return self._table.select(compress(range(len(self._table)), self._kernel_mask))

    @cached_property
    def _kernel_starts(self) -> Sequence[float]:
        return array_of("d", compress(self._table.starts(), self._kernel_mask))

    @cached_property
    def _kernels_sorted(self) -> bool:
        starts = self._kernel_starts
        return not any(map(gt, starts, islice(starts, 1, None)))

    @cached_property
    def memcpys(self) -> GpuOps:
        return self._table.select(compress(range(len(self._table)), self._mask(_MEMCPY)))

    def _union(self, mask: bytes | None = None, device: int | None = None) -> intervals.Disjoint:
        """The union of the ops (those `mask` keeps, and of those the ones on `device` unless None)."""
        starts, ends = self._table.starts(), self._table.ends()
        if device is not None and len(self.devices) > 1:
            on_device = bytes(d == device for d in self._table.devices())
            mask = on_device if mask is None else bytes(map(and_, mask, on_device))
        if mask is not None:  # the kernels' starts are kept: kernels_in bisects them
            starts = self._kernel_starts if mask is self._kernel_mask else array_of("d", compress(starts, mask))
            ends = array_of("d", compress(ends, mask))
        return intervals.union_of(starts, ends)

    @cached_property
    def _busy_by_device(self) -> dict[int, intervals.Disjoint]:
        return {d: self._union(None, d) for d in self.devices}

    @cached_property
    def _compute_by_device(self) -> dict[int, intervals.Disjoint]:
        return {d: self._union(self._kernel_mask, d) for d in self.devices}

    @cached_property
    def primary_device(self) -> int | None:
        """The device with the most busy time: the one the script trains on."""
        if not self.devices:
            return None
        lo, hi = self.span
        return max(self.devices, key=lambda d: self._busy_by_device[d].covered(lo, hi))

    def busy_s(self, lo: float, hi: float, device: int | None = None) -> float:
        return self._of_device(self._busy_by_device, device).covered(lo, hi)

    def compute_s(self, lo: float, hi: float, device: int | None = None) -> float:
        return self._of_device(self._compute_by_device, device).covered(lo, hi)

    def idle_gaps(self, lo: float, hi: float, device: int | None = None) -> list[intervals.Interval]:
        return self._of_device(self._busy_by_device, device).gaps(lo, hi)

    def _of_device(self, by_device: dict[int, intervals.Disjoint], device: int | None) -> intervals.Disjoint:
        """The intervals of `device` (default: the primary one); none when the trace has no GPU activity."""
        device = self.primary_device if device is None else device
        return _NONE if device is None else by_device.get(device, _NONE)

    @cached_property
    def _h2d_copies(self) -> intervals.Disjoint:
        names, kinds, name_ids = self._table.columns.names, self._table.kinds(), self._table.name_ids()
        h2d = {n: "HtoD" in names[n] for k, n in zip(kinds, name_ids) if k == _MEMCPY}
        return self._union(bytes(k == _MEMCPY and h2d[n] for k, n in zip(kinds, name_ids)))

    @cached_property
    def _kernels_any_device(self) -> intervals.Disjoint:
        if len(self.devices) == 1:
            return self._compute_by_device[self.devices[0]]
        return self._union(self._kernel_mask)

    @cached_property
    def _copies_any_device(self) -> intervals.Disjoint:
        return self._union(self._mask(_MEMCPY))

    def exposed_copy_s(self, lo: float, hi: float) -> float:
        """Seconds of [lo, hi] with a copy (any direction) in flight and no kernel beside it."""
        spans = self._copies_any_device.clipped(lo, hi)
        return sum((e - s) - self._kernels_any_device.covered(s, e) for s, e in spans)

    def h2d_copy_overlap(self, lo: float, hi: float) -> tuple[float, float]:
        """Seconds of [lo, hi] with a host-to-device copy in flight, and how many of them a kernel overlaps."""
        spans = self._h2d_copies.clipped(lo, hi)
        copying = sum(e - s for s, e in spans)
        return copying, sum(self._kernels_any_device.covered(s, e) for s, e in spans)

    def kernels_in(self, lo: float, hi: float) -> GpuOps:
        """Kernels that start in [lo, hi), in the order of `kernels` (by start, as the trace gives them)."""
        if not self._kernels_sorted:
            return self.kernels.select(i for i, start in enumerate(self._kernel_starts) if lo <= start < hi)
        starts = self._kernel_starts
        return self.kernels[bisect_left(starts, lo):bisect_left(starts, hi)]

    @property
    def busy_fraction(self) -> float:
        lo, hi = self.span
        return self.busy_s(lo, hi) / (hi - lo) if hi > lo else 0.0


_NONE = intervals.union_of((), ())
