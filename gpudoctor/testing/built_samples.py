"""samples/*.jsonl of a built bundle: steady host, process-tree and GPU series as the samplers' rows.

Counters are running totals from the first sample (CPU seconds, context switches, swap bytes), so that the
rates analysis derives from them are exactly the ones the test gave.
"""

from __future__ import annotations

from gpudoctor.bundle.samples import GpuRow, HostRow, Merged, ProcEntry, ProcsRow
from gpudoctor.testing.spec import BundleSpec, GiB, HostSpec, ProcessSpec


def sample_files(spec: BundleSpec) -> dict[str, list[Merged]]:
    """The rows of each sample file to write, by kind (host, procs, gpu); rows given raw replace generated ones."""
    files: dict[str, list[Merged]] = {}
    if spec.host is not None or spec.processes:
        host, procs = host_and_proc_rows(spec)
        files["host"], files["procs"] = list(host), list(procs)
    if spec.gpus:
        files["gpu"] = list(gpu_rows(spec))
    files.update(spec.raw)
    return files


def host_and_proc_rows(spec: BundleSpec) -> tuple[list[HostRow], list[ProcsRow]]:
    host = spec.host or HostSpec()  # processes alone still need the host series
    processes = spec.processes or [_default_process(spec, host)]
    busy = _busy_cores(spec, host, sum(p.cores for p in processes))
    grid = _grid(spec, host.interval_s)
    host_rows = [_host_row(spec, host, busy, t, t - grid[0]) for t in grid]
    proc_rows = [ProcsRow(t=t, procs=[_proc_entry(p, t - grid[0]) for p in processes]) for t in grid]
    return host_rows, proc_rows


def gpu_rows(spec: BundleSpec) -> list[GpuRow]:
    entries = [entry for _, entry in sorted(spec.gpus.items())]
    return [GpuRow(t=t, gpus=entries) for t in _grid(spec, spec.gpu_interval_s)]


def _default_process(spec: BundleSpec, host: HostSpec) -> ProcessSpec:
    """The script's process, when the test describes only the host."""
    pid = spec.settings.pid
    return ProcessSpec(pid, pid - 1, "python", (host.tree_cores or 1.0,), 1, 2 * GiB, 10.0, 100.0, 0.0)


def _busy_cores(spec: BundleSpec, host: HostSpec, tree: float) -> float:
    busy = host.busy_cores if host.busy_cores is not None else tree + host.other_cores
    if busy > spec.cpu_count + 1e-9:
        raise ValueError(f"the host would be {busy:g} cores busy, more than its cpu_count {spec.cpu_count}; "
                         "raise env(cpu_count=...) or lower the CPU figures")
    return busy


def _grid(spec: BundleSpec, interval_s: float) -> list[float]:
    """Sample times every `interval_s` from a second before the first step to half a second after the last."""
    lo, hi = (spec.steps[0].start - 1.0, spec.steps[-1].end + 0.5) if spec.steps else (spec.t0 - 1.0, spec.t0 + 1.0)
    count = int((hi - lo) / interval_s) + 2
    return [lo + k * interval_s for k in range(count)]


def _host_row(spec: BundleSpec, host: HostSpec, busy: float, t: float, elapsed: float) -> HostRow:
    memory = spec.env.memory_total
    return HostRow(
        t=t, cpu_pct=_per_core(busy, spec.cpu_count), load=[host.load1 if host.load1 is not None else busy, busy, busy],
        mem_total=memory, mem_available=host.mem_available if host.mem_available is not None else int(0.8 * memory),
        swap_used=host.swap_used, swap_in=int(host.swap_in_bps * elapsed), swap_out=int(host.swap_out_bps * elapsed),
        cpu_pressure_s=None if host.cpu_pressure is None else host.cpu_pressure * elapsed,
        throttled_s=None if host.throttled is None else host.throttled * elapsed,
    )


def _per_core(busy: float, cores: int) -> list[float]:
    """psutil.cpu_percent(percpu=True) for a host `busy` cores busy: cores filled one after another."""
    return [round(100.0 * min(1.0, max(0.0, busy - i)), 6) for i in range(cores)]


def _proc_entry(p: ProcessSpec, elapsed: float) -> ProcEntry:
    """Thread i > 0 of process `pid` has the OS id `pid * 100 + i`; the main thread's id is the pid."""
    tids = [str(p.pid)] + [str(p.pid * 100 + i) for i in range(1, len(p.thread_cores))]
    return ProcEntry(
        pid=p.pid, ppid=p.ppid, name=p.name, cpu_s=p.cores * elapsed, rss=p.rss, threads=p.threads,
        ctx_vol=int(p.ctx_vol_per_s * elapsed), ctx_invol=int(p.ctx_invol_per_s * elapsed), gpu=p.gpu,
        thread_cpu={tid: cores * elapsed for tid, cores in zip(tids, p.thread_cores)},
        run_delay_s=None if p.run_delay_share is None else p.run_delay_share * elapsed,
        thread_run_delay=_thread_run_delay(p, tids, elapsed),
    )


def _thread_run_delay(p: ProcessSpec, tids: list[str], elapsed: float) -> dict[str, float]:
    """Each thread's run delay, as schedstat gives it: the spec's, else the main thread's share and none for the
    others; none at all where the main thread's was not measured."""
    if p.thread_run_delay:
        return {tid: share * elapsed for tid, share in zip(tids, p.thread_run_delay)}
    if p.run_delay_share is None:
        return {}
    return {tid: (p.run_delay_share if tid == tids[0] else 0.0) * elapsed for tid in tids}
