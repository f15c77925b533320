"""Kernel durations in the analysed steps: a log-binned histogram, and the kernels that took the most GPU time.

Many kernels of a few microseconds each mean the GPU spends its time waiting on launches (a small batch, or
an unfused model); the histogram shows that shape on any run whose trace has GPU kernels.
"""

from __future__ import annotations

import statistics
from array import array
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpudoctor.analysis.gpu import GpuView
from gpudoctor.analysis.gpu_ops import GpuOp, GpuOps, array_of
from gpudoctor.analysis.views import Step

# Upper edges of the histogram's bins, in µs; the first bin starts at 0 and the last has no upper edge.
KERNEL_BIN_EDGES_US = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 100_000)
TOP_KERNELS = 8


@dataclass(frozen=True, slots=True)
class KernelBin:
    """The kernels whose duration lies in [lo_us, hi_us) (no upper edge when hi_us is None): how many, their
    GPU time in µs, and their shares of all the kernels' count and time."""

    lo_us: float
    hi_us: float | None
    count: int
    time_us: float
    count_share: float
    time_share: float  # 0.0 when the kernels took no time at all


@dataclass(frozen=True, slots=True)
class KernelTotal:
    """Every launch of one kernel (by name) in the analysed steps: how many, their GPU seconds, their mean
    duration in µs and their share of all the kernels' time."""

    name: str
    count: int
    total_s: float
    mean_us: float
    share: float


@dataclass(frozen=True, slots=True)
class KernelHistogram:
    """The kernels that start in the analysed steps: `count` of them (`per_step` on average), their median
    duration in µs and total GPU seconds; `bins` from the first non-empty bin to the last, and `top`, the
    kernels that took the most time, most first."""

    count: int
    per_step: float
    median_us: float
    total_s: float
    bins: tuple[KernelBin, ...]
    top: tuple[KernelTotal, ...]


def kernels_in_steps(gpu: GpuView, steps: Sequence[Step]) -> GpuOps:
    """The kernels that start in the steps, step by step."""
    rows = array("I")
    for s in steps:
        rows.extend(gpu.kernels_in(s.start, s.end).row_ids())
    return GpuOps(gpu.kernels.columns, rows)


def kernel_histogram(gpu: GpuView | None, steps: Sequence[Step], top: int = TOP_KERNELS) -> KernelHistogram | None:
    """Kernel durations in `steps`, in log-spaced bins; None without GPU activity, steps, or kernels in them."""
    if gpu is None or not steps:
        return None
    kernels = kernels_in_steps(gpu, steps)
    seconds = kernels.durations()
    in_us = [d * 1e6 for d in seconds]
    in_us.sort()
    durations = array_of("d", in_us)  # 8 bytes a kernel, where a float in a list takes 32
    del in_us
    if not durations:
        return None
    total = sum(durations)
    return KernelHistogram(
        count=len(durations), per_step=len(durations) / len(steps), median_us=_median(durations),
        total_s=total / 1e6, bins=_bins(durations, total),
        top=_ranked(_by_name(kernels.name_ids(), seconds, kernels.columns.names), total / 1e6, top),
    )


def _median(ordered: Sequence[float]) -> float:
    """statistics.median of values already sorted (which would sort them again, a float object each)."""
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2


def _bins(durations: Sequence[float], total: float) -> tuple[KernelBin, ...]:
    """Every bin from the first that holds a kernel to the last that does (those between may be empty).
    `durations` are sorted: a bin's kernels are a slice of them, found by bisection."""
    edges = (0.0, *KERNEL_BIN_EDGES_US)
    uppers = (*KERNEL_BIN_EDGES_US, None)
    bins = [_bin(lo, hi, durations, total) for lo, hi in zip(edges, uppers)]
    used = [i for i, b in enumerate(bins) if b.count]
    return tuple(bins[used[0]:used[-1] + 1])


def _bin(lo: float, hi: float | None, durations: Sequence[float], total: float) -> KernelBin:
    inside = durations[bisect_left(durations, lo):len(durations) if hi is None else bisect_left(durations, hi)]
    time_us = sum(inside)
    return KernelBin(lo_us=lo, hi_us=hi, count=len(inside), time_us=time_us, count_share=len(inside) / len(durations),
                     time_share=time_us / total if total else 0.0)


def top_kernels(kernels: Sequence[GpuOp], total_s: float, limit: int = TOP_KERNELS) -> tuple[KernelTotal, ...]:
    """The `limit` kernel names that took the most GPU time among `kernels`; shares are of `total_s`."""
    if isinstance(kernels, GpuOps):  # without making the GpuOps
        return _ranked(_by_name(kernels.name_ids(), kernels.durations(), kernels.columns.names), total_s, limit)
    by_name: dict[str, list[float]] = defaultdict(list)
    for k in kernels:
        by_name[k.name].append(k.dur)
    return _ranked(by_name, total_s, limit)


def _by_name(name_ids: Sequence[int], durations: Sequence[float], names: Sequence[str]) -> dict[str, array[float]]:
    """Each kernel name's durations, in order, grouped by name id (one for each distinct name)."""
    by_id: dict[int, array[float]] = defaultdict(lambda: array("d"))  # 8 bytes a kernel
    for name_id, dur in zip(name_ids, durations):
        by_id[name_id].append(dur)
    return {names[name_id]: durs for name_id, durs in by_id.items()}


def _ranked(by_name: Mapping[str, Sequence[float]], total_s: float, limit: int) -> tuple[KernelTotal, ...]:
    ranked = sorted(by_name.items(), key=lambda item: -sum(item[1]))[:limit]
    return tuple(KernelTotal(name=name, count=len(durs), total_s=sum(durs), mean_us=statistics.fmean(durs) * 1e6,
                             share=sum(durs) / total_s if total_s else 0.0) for name, durs in ranked)
