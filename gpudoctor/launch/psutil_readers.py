"""Readers of the host and of the script's process tree through psutil, where /proc cannot be read directly
(other systems, or a /proc without some of its files). Their rows have the fields of launch.procfs's."""

from __future__ import annotations

import psutil

from gpudoctor.bundle.samples import HostRow, ProcEntry
from gpudoctor.launch.procfiles import run_delay_seconds
from gpudoctor.launch.procfs import GpuFileLook


class PsutilHost:
    def __init__(self) -> None:
        psutil.cpu_percent(percpu=True)  # the first call only sets the baseline

    def sample(self, t: float) -> HostRow:
        memory, swap = psutil.virtual_memory(), psutil.swap_memory()
        return HostRow(t=t, cpu_pct=psutil.cpu_percent(percpu=True), load=list(psutil.getloadavg()),
                       mem_total=memory.total, mem_available=memory.available, swap_used=swap.used,
                       swap_in=swap.sin, swap_out=swap.sout)

    def close(self) -> None:
        pass


class PsutilTree:
    def __init__(self, root: int) -> None:
        self._root = psutil.Process(root)
        self._known: dict[int, psutil.Process] = {}
        self._gpu_looks: dict[int, GpuFileLook] = {}

    def sample(self) -> list[ProcEntry]:
        try:
            members = [self._root, *self._root.children(recursive=True)]
        except psutil.Error:  # the root has exited
            members = []
        # Keep one Process object per pid so psutil can tell a reused pid from the same process.
        current = {p.pid: self._known.get(p.pid, p) for p in members}
        self._known = current
        self._gpu_looks = {pid: self._gpu_looks.get(pid) or GpuFileLook(pid) for pid in current}
        rows = []
        for process in current.values():
            row = _psutil_process_sample(process, self._gpu_looks[process.pid])
            if row is not None:
                rows.append(row)
        return rows

    def close(self) -> None:
        pass


def _psutil_process_sample(process: psutil.Process, gpu: GpuFileLook) -> ProcEntry | None:
    try:
        with process.oneshot():
            times = process.cpu_times()
            switches = process.num_ctx_switches()
            name = process.name()
            return ProcEntry(
                pid=process.pid, ppid=process.ppid(), name=name, cpu_s=times.user + times.system,
                rss=process.memory_info().rss, threads=process.num_threads(), ctx_vol=switches.voluntary,
                ctx_invol=switches.involuntary,
                thread_cpu={str(th.id): th.user_time + th.system_time for th in process.threads()},
                run_delay_s=_run_delay(process.pid), gpu=gpu.holds(name),
            )
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None


def _run_delay(pid: int) -> float | None:
    """The main thread's run delay from Linux's /proc/PID/schedstat, where there is one (psutil has no reader)."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as file:
            return run_delay_seconds(file.read())
    except OSError:
        return None
