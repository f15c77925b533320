"""The parent's samples as views: host and GPU time series, and the script's processes over a span.

Counters (CPU seconds, swap bytes, context switches) are running totals in the rows; here they become
rates. A row compacted for a long run stands for several samples: its extremes are read where the worst
moment matters (memory), its running totals keep rates exact.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any, TypeVar

from gpudoctor.analysis.views import ProcessInfo, SeriesPoint
from gpudoctor.bundle.samples import GPU_GAUGES, GpuRow, HostRow, ProcEntry, ProcsRow

Row = TypeVar("Row", HostRow, ProcsRow, GpuRow)


def within(rows: list[Row], span: tuple[float, float] | None, margin: float) -> list[Row]:
    """The rows within `margin` seconds of `span` (all of them without a span)."""
    if span is None:
        return rows
    return [rows[i] for i in around([r.t for r in rows], span[0] - margin, span[1] + margin)]


def around(times: Sequence[float], lo: float, hi: float) -> range:
    """Indices of the sorted `times` in [lo, hi]; with fewer than two there (the span of a short window in an
    old stretch of a long run, whose samples were merged into rows seconds apart), the rows on either side."""
    first, end = bisect_left(times, lo), bisect_right(times, hi)
    if end - first >= 2:
        return range(first, end)
    return range(max(0, first - 1), min(len(times), end + 1))


def _rate(before: float | None, now: float | None, dt: float) -> float | None:
    if before is None or now is None or dt <= 0:
        return None
    return max(0.0, (now - before) / dt)


def _tree_cpu(row: ProcsRow) -> dict[int, float]:
    return {p.pid: p.cpu_s for p in row.procs}


def host_series(host: list[HostRow], procs: list[ProcsRow]) -> list[SeriesPoint]:
    """busy_cores, tree_cores (the script's processes), other_cores, load1, mem_available and swap rates."""
    tree_by_time = {round(row.t, 6): _tree_cpu(row) for row in procs}
    points: list[SeriesPoint] = []
    previous: HostRow | None = None
    previous_tree: dict[int, float] | None = None
    for row in host:
        tree = tree_by_time.get(round(row.t, 6))
        if previous is not None:
            points.append(SeriesPoint(row.t, _host_values(previous, row, previous_tree, tree)))
        previous, previous_tree = row, tree
    return points


def _host_values(before: HostRow, row: HostRow, tree_before: dict[int, float] | None,
                 tree: dict[int, float] | None) -> dict[str, float | None]:
    dt = row.t - before.t
    busy = sum(row.cpu_pct) / 100.0
    tree_cores = _cores(tree_before, tree, dt)
    job_cores = _cores(before.job_cpu, row.job_cpu, dt) or 0.0  # a torchrun job's other ranks: not other programs
    return {
        "busy_cores": busy, "tree_cores": tree_cores, "job_cores": job_cores,
        "other_cores": max(0.0, busy - tree_cores - job_cores) if tree_cores is not None else None,
        "load1": row.load[0] if row.load else None,
        # Over a merged row (an old stretch of a long run), memory pressure is its worst moment.
        "mem_available": row.lowest("mem_available"),
        "swap_in_bps": _rate(before.swap_in, row.swap_in, dt), "swap_out_bps": _rate(before.swap_out, row.swap_out, dt),
    }


def _cores(before: Mapping[Any, float] | None, now: Mapping[Any, float] | None, dt: float) -> float | None:
    """Cores used between two samples of processes' running CPU totals (by pid); None without both samples."""
    if before is None or now is None or dt <= 0:
        return None
    # A process new since the last sample (a fresh worker) started with no CPU time of its own.
    return float(sum(max(0.0, cpu - before.get(pid, 0.0)) for pid, cpu in now.items())) / dt


def gpu_series(rows: list[GpuRow]) -> dict[int, list[SeriesPoint]]:
    """Each GPU's NVML gauges over time; a gauge the driver did not give is left out of a point."""
    series: dict[int, list[SeriesPoint]] = defaultdict(list)
    for row in rows:
        for entry in row.gpus:
            values: dict[str, float | None] = {key: getattr(entry, key) for key in GPU_GAUGES
                                               if getattr(entry, key) is not None}
            series[entry.gpu].append(SeriesPoint(row.t, values))
    return dict(series)


def process_infos(rows: list[ProcsRow]) -> list[ProcessInfo]:
    """Each process of the script's tree over the rows: mean and peak CPU, peak memory and threads."""
    if not rows:
        return []
    root = next((p.pid for row in rows for p in row.procs), None)
    history: dict[int, list[tuple[float, ProcEntry]]] = defaultdict(list)
    for row in rows:
        for proc in row.procs:
            history[proc.pid].append((row.t, proc))
    return [_process_info(pid, entries, pid == root) for pid, entries in history.items()]


def _process_info(pid: int, entries: list[tuple[float, ProcEntry]], is_root: bool) -> ProcessInfo:
    rates = [(b.cpu_s - a.cpu_s) / (tb - ta) for (ta, a), (tb, b) in pairwise(entries) if tb > ta]
    (t_first, first), (t_last, last) = entries[0], entries[-1]
    elapsed = t_last - t_first
    return ProcessInfo(
        pid=pid, ppid=last.ppid, name=last.name, role="main" if is_root else "child",
        # CPU seconds are running totals, so this is the mean over time, however unevenly sampled.
        cpu_mean=(last.cpu_s - first.cpu_s) / elapsed if elapsed > 0 else 0.0,
        cpu_max=max(rates, default=0.0),
        rss_max=int(max(e.highest("rss") or 0 for _, e in entries)),
        threads_max=int(max(e.highest("threads") or 0 for _, e in entries)),
        thread_cores=_thread_rates([e.thread_cpu for _, e in entries], elapsed),
        ctx_invol_per_s=_rate(first.ctx_invol, last.ctx_invol, elapsed),
        run_delay_share=_rate(first.run_delay_s, last.run_delay_s, elapsed),
        thread_run_delay=_thread_rates([e.thread_run_delay for _, e in entries], elapsed),
        gpu=any(e.gpu for _, e in entries),
    )


def _thread_rates(totals: list[dict[str, float]], elapsed: float) -> dict[str, float]:
    """Each thread's running total (CPU seconds, run delay) per second of the process's sampled time: from the
    first sample (or from 0, for a thread started later) to the last sample it was seen in, so that a thread
    that ended before the process did still counts."""
    if elapsed <= 0 or not totals:
        return {}
    before = totals[0]
    seen_last: dict[str, float] = {}
    for entry in totals:
        seen_last.update(entry)
    return {tid: max(0.0, value - before.get(tid, 0.0)) / elapsed for tid, value in seen_last.items()}


def main_thread_cpu_rate(rows: list[ProcsRow], thread: int | None,
                         spans: Sequence[tuple[float, float]]) -> float | None:
    """The cores the main thread of the script's process (its OS thread id `thread`; the process's one thread
    when not known) used over `spans`: its running CPU total read at each span's ends, linearly between the
    samples either side, so that the time just before and after a span (a profiling window's export, the
    script's set-up) is not counted in it. The part of a span the samples do not reach is left out; None where
    they reach none of it."""
    root = next((p.pid for row in rows for p in row.procs), None)
    entries = [(row.t, proc) for row in rows for proc in row.procs if proc.pid == root]
    tid = str(thread) if thread is not None else _only_thread(entries)
    points = [(t, proc.thread_cpu[tid]) for t, proc in entries if tid is not None and tid in proc.thread_cpu]
    if len(points) < 2:
        return None
    times = [t for t, _ in points]
    cpu = covered = 0.0
    for start, end in spans:
        lo, hi = max(start, times[0]), min(end, times[-1])
        if hi > lo:
            cpu += _total_at(points, times, hi) - _total_at(points, times, lo)
            covered += hi - lo
    return max(0.0, cpu) / covered if covered > 0 else None


def _only_thread(entries: list[tuple[float, ProcEntry]]) -> str | None:
    names = {tid for _, proc in entries for tid in proc.thread_cpu}
    return next(iter(names)) if len(names) == 1 else None


def _total_at(points: list[tuple[float, float]], times: list[float], t: float) -> float:
    """A running total at `t`, within the points' times, linearly between the points either side."""
    after = min(max(1, bisect_left(times, t)), len(points) - 1)
    (t0, v0), (t1, v1) = points[after - 1], points[after]
    return v0 if t1 <= t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
