"""How long the threads that feed the GPU waited for a core, and what held the host's cores: the CPU side of a step,
measured directly rather than inferred from the GPU's idle.

Over the steady steps, from the process samples' running totals: the run delay (Linux schedstat: ready to run, no
core free) of the main thread, of the DataLoader's workers and of its pin-memory thread, each as a share of the
wall time; the host's CPU pressure (the share of the time some runnable task waited for a core, from
/proc/pressure/cpu) and the share of the time the script's cgroup was throttled by its CPU limit. Each is None
where this machine does not keep it (report.cpu_wait then says "not measured here").
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from gpudoctor.analysis.samples import within
from gpudoctor.analysis.views import ProcessInfo, ThreadInfo
from gpudoctor.bundle.samples import HostRow

PIN_MEMORY_TARGET = "_pin_memory_loop"  # torch.utils.data._utils.pin_memory's thread function


@dataclass(frozen=True)
class CpuWait:
    """Shares of the wall time over the steady steps; None: not measured here."""

    main_thread: float | None
    loader_workers: float | None  # the median worker's
    workers: int
    pin_memory_thread: float | None
    host_pressure: float | None
    throttled: float | None


def cpu_wait_evidence(found: CpuWait) -> dict[str, tuple[float, str]]:
    """What a finding gives of the CPU side, as evidence: each share measured here, in %, the main thread's
    left to the rule that states it."""
    shares = {"loader workers waiting for a core (median)": found.loader_workers,
              "pin-memory thread waiting for a core": found.pin_memory_thread,
              "host CPU pressure": found.host_pressure, "throttled by a CPU limit": found.throttled}
    return {name: (round(value * 100, 1), "%") for name, value in shares.items() if value is not None}


def cpu_wait(processes: list[ProcessInfo], threads: list[ThreadInfo], main_thread_id: int | None,
             host_rows: list[HostRow], span: tuple[float, float] | None) -> CpuWait:
    """`processes` over the steady steps (`span`), `threads` the Python threads started, `host_rows` the run's."""
    main = next((p for p in processes if p.role == "main"), None)
    workers = [p for p in processes if p.is_loader_worker]
    delays = [w.run_delay_share for w in workers if w.run_delay_share is not None]
    return CpuWait(
        main_thread=_main_thread_delay(main, main_thread_id),
        loader_workers=statistics.median(delays) if delays else None,
        workers=len(workers),
        pin_memory_thread=_pin_memory_delay(main, threads),
        host_pressure=_host_rate(host_rows, span, "cpu_pressure_s"),
        throttled=_host_rate(host_rows, span, "throttled_s"),
    )


def _main_thread_delay(main: ProcessInfo | None, thread_id: int | None) -> float | None:
    if main is None:
        return None
    if thread_id is not None and str(thread_id) in main.thread_run_delay:
        return main.thread_run_delay[str(thread_id)]
    return main.run_delay_share  # /proc/PID/schedstat: the thread group leader's, the main thread


def _pin_memory_delay(main: ProcessInfo | None, threads: list[ThreadInfo]) -> float | None:
    pinning = [t.native_id for t in threads if t.target == PIN_MEMORY_TARGET and t.native_id is not None]
    if main is None or not pinning:
        return None
    found = [main.thread_run_delay[str(tid)] for tid in pinning if str(tid) in main.thread_run_delay]
    return max(found) if found else None


def _host_rate(rows: list[HostRow], span: tuple[float, float] | None, key: str) -> float | None:
    """A host counter's seconds per second over `span`."""
    kept = [(r.t, float(getattr(r, key))) for r in within(rows, span, margin=0.5) if getattr(r, key) is not None]
    if len(kept) < 2 or kept[-1][0] <= kept[0][0]:
        return None
    (t0, first), (t1, last) = kept[0], kept[-1]
    return max(0.0, min(1.0, (last - first) / (t1 - t0)))
