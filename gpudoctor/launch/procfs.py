"""Readers of the host and of the script's process tree from /proc (Linux).

Each file is opened once and read again with one `pread` per sample (launch.procfiles). Instead of scanning
every process on the host at each sample, the tree is walked through /proc/PID/task/TID/children once a
second, and in between only the pids handed out since the last sample are looked at. The rows have the fields
that psutil's readers (launch.psutil_readers) give.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import defaultdict

import psutil

from gpudoctor.bundle.samples import LOADER_WORKER_NAME, HostRow, ProcEntry
from gpudoctor.launch.procfiles import PROCFS, HeldFile, PathFile, ProcFiles, read_file, run_delay_seconds

REDISCOVER_S = 1.0  # the whole tree is walked again at least this often
GPU_FILES_EVERY_S = 1.0  # how often a process's open files are looked at, until one is a GPU's
NEW_PIDS_MAX = 32  # more new pids than this since the last sample are left to the next walk of the tree
HOST_READ_SIZE = 65536  # first read size for /proc/stat and /proc/vmstat; a longer file is read again whole

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if PROCFS else 100
SWAP_PAGE = 4096  # /proc/vmstat counts pswpin and pswpout in 4 KiB pages


def _stat_fields(stat: bytes) -> tuple[bytes, list[bytes]]:
    """The command name and the fields after it, of a /proc/PID/stat line (the name may hold spaces and ')')."""
    close = stat.rfind(b")")
    return stat[stat.find(b"(") + 1:close], stat[close + 2:].split()


def _tick_seconds(utime: bytes, stime: bytes) -> float:
    return int(utime) / CLOCK_TICKS + int(stime) / CLOCK_TICKS


class ProcfsHost:
    """Per-core CPU from /proc/stat, load from /proc/loadavg, memory from /proc/meminfo, swap from /proc/vmstat."""

    def __init__(self, files: ProcFiles) -> None:
        self._files = files.open_all("/proc/stat", "/proc/loadavg", "/proc/meminfo", "/proc/vmstat",
                                     size=HOST_READ_SIZE)
        self._stat, self._loadavg, self._meminfo, self._vmstat = self._files
        self._last_cores = _core_ticks(self._stat.read())

    def sample(self, t: float) -> HostRow:
        cores = _core_ticks(self._stat.read())
        busy = [_busy_percent(before, now) for before, now in zip(self._last_cores, cores)]
        self._last_cores = cores
        meminfo, vmstat = b"\n" + self._meminfo.read(), self._vmstat.read()
        swap_total = _counter(meminfo, b"SwapTotal:")
        # MemAvailable is missing only before Linux 3.14, where psutil estimates it
        available = _counter(meminfo, b"MemAvailable:") * 1024 or psutil.virtual_memory().available
        return HostRow(
            t=t, cpu_pct=busy, load=[float(x) for x in self._loadavg.read().split()[:3]],
            mem_total=_counter(meminfo, b"MemTotal:") * 1024, mem_available=available,
            swap_used=(swap_total - _counter(meminfo, b"SwapFree:")) * 1024,
            swap_in=_counter(vmstat, b"pswpin ") * SWAP_PAGE, swap_out=_counter(vmstat, b"pswpout ") * SWAP_PAGE,
        )

    def close(self) -> None:
        for file in self._files:
            file.close()


def _core_ticks(stat: bytes) -> list[list[int]]:
    """Per core: user, nice, system, idle, iowait, irq, softirq, steal, guest, guest_nice (clock ticks)."""
    lines = stat.split(b"\n")
    return [[int(x) for x in line.split()[1:11]] for line in lines[1:] if line.startswith(b"cpu")]


def _busy_percent(before: list[int], now: list[int]) -> float:
    """psutil.cpu_percent's formula: a counter that went back counts as 0; guest time is already in user and nice."""
    deltas = [max(0, b - a) for a, b in zip(before, now)]
    total = sum(deltas) - sum(deltas[8:10])
    busy = total - deltas[3] - deltas[4]
    return round(busy / total * 100, 1) if total else 0.0


def _counter(text: bytes, name: bytes) -> int:
    """The number after `name` at the start of a line of /proc/meminfo or /proc/vmstat; 0 when absent."""
    at = text.find(b"\n" + name)
    if at < 0:
        return 0
    start = at + 1 + len(name)
    return int(text[start:text.find(b"\n", start)].split()[0])


class ProcfsTree:
    """The process tree under one pid. Its processes are read at every sample; new ones are found by walking
    the tree every REDISCOVER_S and, in between, among the pids handed out since the last sample."""

    def __init__(self, files: ProcFiles, root: int) -> None:
        self._files = files
        self._root = root
        self._loadavg = files.open("/proc/loadavg")
        try:
            self._last_pid = _last_pid(self._loadavg.read())
            self._members = {root: TrackedProcess(files, root)}
        except (OSError, ValueError):
            self._loadavg.close()
            raise
        self._children_files = os.path.exists(f"/proc/{root}/task/{root}/children")
        self._walked_at = float("-inf")

    def sample(self) -> list[ProcEntry]:
        if self._root not in self._members:  # the script has exited
            return []
        self._find_new_processes()
        rows = []
        for pid, member in list(self._members.items()):
            row = member.sample()
            if row is None:
                self._drop(pid)
            else:
                rows.append(row)
        if self._root not in self._members:
            self.close()
            return []
        kept = _descendants(rows, self._root)
        for row in rows:
            if row.pid not in kept:  # re-parented away (its parent exited): no longer the script's
                self._drop(row.pid)
        return [row for row in rows if row.pid in kept]

    def close(self) -> None:
        for pid in list(self._members):
            self._drop(pid)
        self._loadavg.close()

    def _find_new_processes(self) -> None:
        now, last_pid = time.monotonic(), _last_pid(self._loadavg.read())
        if now - self._walked_at >= REDISCOVER_S:
            self._walk()
            self._walked_at = now
        elif 0 < last_pid - self._last_pid <= NEW_PIDS_MAX:  # pids are handed out in increasing order (until they wrap)
            for pid in range(self._last_pid + 1, last_pid + 1):
                if _parent_pid(pid) in self._members and _is_process(pid):
                    self._member(pid)
        self._last_pid = last_pid

    def _walk(self) -> None:
        scanned = None if self._children_files else _children_by_scan()
        found, seen = [self._root], {self._root}
        for pid in found:  # grows as children are found
            member = self._member(pid)
            if member is None:
                continue
            children = member.child_pids() if scanned is None else scanned.get(pid, [])
            for child in children:
                if child not in seen:
                    seen.add(child)
                    found.append(child)
        for pid in set(self._members) - seen:
            self._drop(pid)

    def _member(self, pid: int) -> TrackedProcess | None:
        member = self._members.get(pid)
        if member is not None:
            return member
        try:
            member = self._members[pid] = TrackedProcess(self._files, pid)
        except OSError:  # it exited meanwhile
            return None
        return member

    def _drop(self, pid: int) -> None:
        self._members.pop(pid).close()


def holds_gpu_file(pid: int) -> bool | None:
    """Whether the process has a GPU's device file open (/dev/nvidia0, ...: not nvidiactl or nvidia-uvm); None
    where its open files cannot be listed."""
    try:
        entries = os.scandir(f"/proc/{pid}/fd")
    except OSError:
        return None
    with entries:
        for entry in entries:
            try:
                target = os.readlink(entry.path)
            except OSError:  # closed meanwhile
                continue
            if target.startswith("/dev/nvidia") and target[len("/dev/nvidia"):].isdigit():
                return True
    return False


class GpuFileLook:
    """Whether one process holds a GPU's device file open, looked at every GPU_FILES_EVERY_S until it does.

    A DataLoader worker is not looked at: the report never names one, and a loader may have many.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._held: bool | None = None
        self._looked_at = float("-inf")

    def holds(self, name: str) -> bool | None:
        if name == LOADER_WORKER_NAME:
            return None
        now = time.monotonic()
        if not self._held and now - self._looked_at >= GPU_FILES_EVERY_S:
            self._held, self._looked_at = holds_gpu_file(self.pid), now
        return self._held


def _descendants(rows: list[ProcEntry], root: int) -> set[int]:
    """The pids among rows that descend from root through parents also among rows."""
    children: dict[int | None, list[int]] = defaultdict(list)
    for row in rows:
        children[row.ppid].append(row.pid)
    found = [root]
    for pid in found:  # grows as children are found
        found.extend(child for child in children[pid] if child != root)
    return set(found)


def _last_pid(loadavg: bytes) -> int:
    """The pid (of a process or a thread) handed out last: the last field of /proc/loadavg."""
    return int(loadavg.rsplit(None, 1)[-1])


def _parent_pid(pid: int) -> int | None:
    """For a thread's id, the parent of its process."""
    try:
        return int(_stat_fields(read_file(f"/proc/{pid}/stat"))[1][1])
    except OSError:
        return None


def _is_process(pid: int) -> bool:
    try:
        return _status_count(read_file(f"/proc/{pid}/status"), b"\nTgid:") == pid
    except OSError:
        return False


def _children_by_scan() -> dict[int, list[int]]:
    """Every process's children, from every /proc/PID/stat on the host, where /proc has no children files."""
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                _, fields = _stat_fields(read_file(f"/proc/{entry}/stat"))
            except OSError:
                continue
            children[int(fields[1])].append(int(entry))
    return children


class TrackedProcess:
    """One process of the tree and its threads, with their /proc files held between samples."""

    def __init__(self, files: ProcFiles, pid: int) -> None:
        self.pid = pid
        self._files = files
        self._stat, self._status = files.open_all(f"/proc/{pid}/stat", f"/proc/{pid}/status")
        self._schedstat = _open_schedstat(files, pid)
        # a thread's schedstat gives its CPU time and its run delay in one read; a kernel without it, its stat
        self._thread_file = "schedstat" if self._schedstat is not None else "stat"
        self._threads: dict[str, HeldFile | PathFile] = {}
        self._children: dict[str, HeldFile | PathFile] = {}
        self._comm, self._name = b"", ""
        self._gpu_look = GpuFileLook(pid)

    def sample(self) -> ProcEntry | None:
        """None once the process has exited."""
        try:
            comm, fields = _stat_fields(self._stat.read())
            status = self._status.read()
            threads = int(fields[17])
            if threads != len(self._threads):
                self._list_threads()
        except OSError:
            return None
        name = self._name_of(comm)
        cpu, delay = self._thread_times()
        return ProcEntry(
            pid=self.pid, ppid=int(fields[1]), name=name, cpu_s=_tick_seconds(fields[11], fields[12]),
            rss=_resident_bytes(status), threads=threads,
            ctx_vol=_status_count(status, b"\nvoluntary_ctxt_switches:"),
            ctx_invol=_status_count(status, b"\nnonvoluntary_ctxt_switches:"), thread_cpu=cpu,
            run_delay_s=self._run_delay(), thread_run_delay=delay, gpu=self._gpu_look.holds(name),
        )

    def _run_delay(self) -> float | None:
        """The main thread's run delay: /proc/PID/schedstat is the thread group leader's."""
        if self._schedstat is None:
            return None
        try:
            return run_delay_seconds(self._schedstat.read())
        except OSError:
            return None

    def _list_threads(self) -> None:
        tids = sorted(os.listdir(f"/proc/{self.pid}/task"))
        for tid in set(self._threads) - set(tids):
            self._forget_thread(tid)
        for tid in tids:
            if tid not in self._threads:
                with contextlib.suppress(OSError):  # the thread has exited
                    self._threads[tid] = self._files.open(f"/proc/{self.pid}/task/{tid}/{self._thread_file}")

    def child_pids(self) -> list[int]:
        """The children of all its threads (a child belongs to the thread that started it)."""
        try:
            self._list_threads()
        except OSError:
            return []
        pids: list[int] = []
        for tid in self._threads:
            try:
                pids.extend(int(pid) for pid in self._children_file(tid).read().split())
            except OSError:
                continue
        return pids

    def close(self) -> None:
        for tid in list(self._threads):
            self._forget_thread(tid)
        self._stat.close()
        self._status.close()
        if self._schedstat is not None:
            self._schedstat.close()

    def _thread_times(self) -> tuple[dict[str, float], dict[str, float]]:
        """Each thread's CPU seconds and, from schedstat, its run delay (seconds), by thread id."""
        cpu: dict[str, float] = {}
        delay: dict[str, float] = {}
        gone = []
        for tid, file in self._threads.items():
            try:
                text = file.read()
            except OSError:
                gone.append(tid)
                continue
            if self._thread_file == "schedstat":
                on_cpu, waited = _schedstat_seconds(text)
                cpu[tid], delay[tid] = on_cpu, waited
            else:
                fields = text[text.rfind(b")") + 2:].split(None, 13)
                cpu[tid] = _tick_seconds(fields[11], fields[12])
        for tid in gone:
            self._forget_thread(tid)
        return cpu, delay

    def _children_file(self, tid: str) -> HeldFile | PathFile:
        file = self._children.get(tid)
        if file is None:
            file = self._children[tid] = self._files.open(f"/proc/{self.pid}/task/{tid}/children")
        return file

    def _forget_thread(self, tid: str) -> None:
        for files in (self._threads, self._children):
            file = files.pop(tid, None)
            if file is not None:
                file.close()

    def _name_of(self, comm: bytes) -> str:
        if comm != self._comm:
            self._comm, self._name = comm, _process_name(self.pid, os.fsdecode(comm))
        return self._name


def _schedstat_seconds(schedstat: bytes) -> tuple[float, float]:
    """A schedstat line's time on a CPU and time waiting for one (nanoseconds), in seconds."""
    fields = schedstat.split()
    return int(fields[0]) / 1e9, int(fields[1]) / 1e9


def _open_schedstat(files: ProcFiles, pid: int) -> HeldFile | PathFile | None:
    """None on a kernel built without scheduler statistics (no /proc/PID/schedstat)."""
    try:
        return files.open(f"/proc/{pid}/schedstat")
    except OSError:
        return None


def _resident_bytes(status: bytes) -> int:
    """VmRSS: what psutil's rss (/proc/PID/statm) says; /proc/PID/stat's rss may be an estimate. A zombie has none."""
    return _status_count(status, b"\nVmRSS:") * 1024 if b"\nVmRSS:" in status else 0


def _status_count(status: bytes, key: bytes) -> int:
    start = status.index(key) + len(key)
    return int(status[start:status.index(b"\n", start)].split()[0])


def _process_name(pid: int, comm: str) -> str:
    """psutil's name: the kernel keeps 15 characters of it; the command line's first word may have the rest."""
    if len(comm) < 15:
        return comm
    try:
        cmdline = read_file(f"/proc/{pid}/cmdline")
    except OSError:
        return comm
    args = cmdline[:-1].split(b"\0") if cmdline.endswith(b"\0") else [cmdline]
    first = args[0] if len(args) > 1 else args[0].split(b" ")[0]
    full = os.path.basename(os.fsdecode(first))
    return full if full.startswith(comm) else comm
