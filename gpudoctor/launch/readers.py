"""Readers of the host and of the script's process tree, for the host sampler.

On Linux the host and the tree are read from /proc directly (launch.procfs): each file is opened once and read
again with one `pread` per sample (launch.procfiles). Instead of scanning every process on the host at each
sample, the tree is walked through /proc/PID/task/TID/children once a second, and in between only the pids
handed out since the last sample are looked at. Elsewhere psutil does the same work (launch.psutil_readers).
The rows have the same fields either way.
"""

from __future__ import annotations

from typing import Protocol

import psutil

from gpudoctor.bundle.samples import HostRow, ProcEntry
from gpudoctor.launch.procfiles import ProcFiles
from gpudoctor.launch.procfs import ProcfsHost, ProcfsTree
from gpudoctor.launch.psutil_readers import PsutilHost, PsutilTree


class HostReader(Protocol):
    def sample(self, t: float) -> HostRow: ...

    def close(self) -> None: ...


class TreeReader(Protocol):
    def sample(self) -> list[ProcEntry]: ...

    def close(self) -> None: ...


def host_reader(files: ProcFiles | None) -> HostReader:
    if files is not None:
        try:
            return ProcfsHost(files)
        except (OSError, ValueError):  # a /proc without some of these files (some sandboxes): psutil copes
            pass
    return PsutilHost()


def tree_reader(files: ProcFiles | None, pid: int) -> TreeReader | None:
    if files is not None:
        try:
            return ProcfsTree(files, pid)
        except (OSError, ValueError):  # the script has exited, or /proc lacks a file: psutil tells which
            pass
    try:
        return PsutilTree(pid)
    except psutil.Error:  # the script has already exited
        return None
