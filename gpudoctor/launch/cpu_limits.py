"""What holds the script's CPU back beyond its own demand: the host's CPU pressure (Linux's pressure stall
information, /proc/pressure/cpu) and the CPU throttling of the script's cgroup (its cpu.stat), as running totals.

Either may be missing: a kernel without PSI, a cgroup without a CPU limit's statistics, a container that does not
mount its cgroup. A reader that finds none returns None, and the samples leave the value out.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from gpudoctor.launch.procfiles import HeldFile, PathFile, ProcFiles

PRESSURE = "/proc/pressure/cpu"
CGROUP_ROOT = "/sys/fs/cgroup"


def pressure_seconds(text: bytes) -> float | None:
    """The seconds some runnable task waited for a core, since boot: the "some" line's total (µs)."""
    for line in text.splitlines():
        if line.startswith(b"some "):
            for field in line.split():
                if field.startswith(b"total="):
                    return int(field[6:]) / 1e6
    return None


def throttled_seconds(text: bytes) -> float | None:
    """The seconds a cgroup's CPU limit held its tasks back: cgroup v2's throttled_usec, v1's throttled_time (ns)."""
    for line in text.splitlines():
        name, _, value = line.partition(b" ")
        if name == b"throttled_usec" and value.strip().isdigit():
            return int(value) / 1e6
        if name == b"throttled_time" and value.strip().isdigit():
            return int(value) / 1e9
    return None


def cgroup_cpu_stat(pid: int) -> str | None:
    """The cpu.stat of `pid`'s cgroup: v2's unified hierarchy, else v1's cpu controller; where the path /proc gives
    is not mounted (a container's namespace), the mounted hierarchy's root. None where there is none."""
    try:
        with open(f"/proc/{pid}/cgroup", "rb") as file:
            lines = file.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    candidates = []
    for line in lines:
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        path = path.lstrip("/")
        if controllers == "":
            candidates += [os.path.join(CGROUP_ROOT, path, "cpu.stat"), os.path.join(CGROUP_ROOT, "cpu.stat")]
        elif "cpu" in controllers.split(","):
            mount = os.path.join(CGROUP_ROOT, controllers)
            candidates += [os.path.join(mount, path, "cpu.stat"), os.path.join(mount, "cpu.stat")]
    return next((c for c in candidates if _has_throttling(c)), None)


def _has_throttling(path: str) -> bool:
    try:
        with open(path, "rb") as file:
            return throttled_seconds(file.read()) is not None
    except OSError:
        return False


class CpuLimits:
    """The host's CPU pressure and the script's cgroup's throttling, read at each sample."""

    def __init__(self, files: ProcFiles, pid: int) -> None:
        self._pressure = _open(files, PRESSURE, pressure_seconds)
        stat = cgroup_cpu_stat(pid)
        self._throttle = _open(files, stat, throttled_seconds) if stat else None

    def pressure_s(self) -> float | None:
        return _read(self._pressure, pressure_seconds)

    def throttled_s(self) -> float | None:
        return _read(self._throttle, throttled_seconds)

    def close(self) -> None:
        for file in (self._pressure, self._throttle):
            if file is not None:
                file.close()


Parse = Callable[[bytes], float | None]


def _open(files: ProcFiles, path: str, parse: Parse) -> HeldFile | PathFile | None:
    try:
        file = files.open(path)
        return file if parse(file.read()) is not None else None
    except (OSError, ValueError):
        return None


def _read(file: HeldFile | PathFile | None, parse: Parse) -> float | None:
    if file is None:
        return None
    try:
        return parse(file.read())
    except (OSError, ValueError):
        return None
