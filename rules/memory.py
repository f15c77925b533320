"""GD4xx: host memory."""

from __future__ import annotations

import statistics
from collections.abc import Iterator

from gpudoctor import Finding, NotEvaluated, Run, rule
from gpudoctor.analysis import SeriesPoint

MB = 1024 * 1024


@rule("GD401", "host-memory-pressure", category="host_memory_pressure")
def host_memory_pressure(
    run: Run, min_swap_mb_per_s: float = 1.0, min_available_share: float = 0.05
) -> Iterator[Finding]:
    """The host swaps, or is about to: training pages memory to disk.

    What it detects: swap-in or swap-out above `min_swap_mb_per_s` MB/s during the analysed steps, or
    available memory below `min_available_share` of the total.

    Why it matters: a page fault on swapped memory stalls the thread that touches it for milliseconds;
    loader workers that swap starve the GPU, and the kernel's OOM killer may end the job.

    Fix: load less into host memory (memory-map the dataset, fewer or lighter workers, smaller
    prefetch_factor), or give the job a machine or container with more memory.

    Severity: critical while the host swaps, warning when memory is only nearly full.
    """
    samples = run.require_host_samples().host
    swap = [_swap_bps(p) for p in samples if _swap_bps(p) is not None]
    total = run.host.env.memory_total
    available = [p.values["mem_available"] for p in samples if p.values.get("mem_available") is not None]
    if not swap and not (available and total):
        raise NotEvaluated("the host samples have neither swap traffic nor available memory")
    swap_mb_s = statistics.fmean(swap) / MB if swap else 0.0
    lowest = min(available) / total if available and total else None
    if swap_mb_s < min_swap_mb_per_s and (lowest is None or lowest >= min_available_share):
        return
    rss = max((p.rss_max for p in run.host.processes), default=0)
    evidence = {"swap traffic": (round(swap_mb_s, 2), "MB/s"),
                "lowest available memory": (round(lowest * 100, 1), "%") if lowest is not None else None,
                "largest process RSS": (round(rss / MB), "MB")}
    swapping = swap_mb_s >= min_swap_mb_per_s
    yield Finding(
        f"The host swaps {swap_mb_s:.1f} MB/s during training" if swapping else
        f"Host memory is nearly full: {lowest:.0%} available",
        impact=None, impact_reason="the cost of paging depends on which thread faults; measure again after the fix",
        severity="critical" if swapping else "warning", evidence=evidence,
        fix="reduce host memory use (memory-map the dataset, fewer loader workers, smaller prefetch_factor) "
            "or add memory",
    )


def _swap_bps(point: SeriesPoint) -> float | None:
    """Bytes swapped in and out per second, or None where the sample had no swap counters."""
    swap_in, swap_out = point.values.get("swap_in_bps"), point.values.get("swap_out_bps")
    if swap_in is None and swap_out is None:
        return None
    return (swap_in or 0.0) + (swap_out or 0.0)
