"""/proc files opened once and read again with one `pread` per sample, within a budget of open files."""

from __future__ import annotations

import os
import sys

HELD_FILES_MAX = 512  # /proc files kept open between samples, at most (and at most a quarter of the fd limit)
PID_READ_SIZE = 8192  # first read size for a /proc/PID file (stat, status and children are shorter)

# Linux's /proc, with a directory per thread: what the /proc readers need
PROCFS = sys.platform.startswith("linux") and os.path.isdir("/proc/self/task")


def run_delay_seconds(schedstat: bytes) -> float | None:
    """The run delay in a /proc/PID/schedstat line ("on-CPU, waiting for a CPU, timeslices", in nanoseconds): the
    seconds the thread was ready to run but waited for a core. None for a line that does not have it."""
    fields = schedstat.split()
    return int(fields[1]) / 1e9 if len(fields) > 1 and fields[1].isdigit() else None


def held_files_budget() -> int:
    import resource  # POSIX only

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return HELD_FILES_MAX if soft == resource.RLIM_INFINITY else min(HELD_FILES_MAX, soft // 4)


class ProcFiles:
    """Opens /proc files to be read again and again, holding at most `budget` of them open at once."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.held = 0

    def open(self, path: str, size: int = PID_READ_SIZE) -> HeldFile | PathFile:
        """Raises OSError when the file does not exist (its process or thread has exited)."""
        if self.held < self.budget:
            return HeldFile(self, path, size)
        return PathFile(path, size)

    def open_all(self, *paths: str, size: int = PID_READ_SIZE) -> list[HeldFile | PathFile]:
        """All of them, or OSError with none left open."""
        opened = []
        try:
            for path in paths:
                opened.append(self.open(path, size))
        except OSError:
            for file in opened:
                file.close()
            raise
        return opened


class HeldFile:
    """A /proc file kept open. A pread at offset 0 returns its current content in one system call; once its
    process (or thread) has exited, reads fail, even if the pid has been given to another process since."""

    __slots__ = ("_fd", "_files", "_size")

    def __init__(self, files: ProcFiles, path: str, size: int) -> None:
        self._fd = os.open(path, os.O_RDONLY)
        self._size, self._files = size, files
        files.held += 1

    def read(self) -> bytes:
        data, self._size = _read_whole(self._fd, self._size)
        return data

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            self._files.held -= 1


class PathFile:
    """A /proc file opened for each read, once the budget of held files is spent."""

    __slots__ = ("_path", "_size")

    def __init__(self, path: str, size: int) -> None:
        os.stat(path)
        self._path, self._size = path, size

    def read(self) -> bytes:
        return read_file(self._path, self._size)

    def close(self) -> None:
        pass


def read_file(path: str, size: int = PID_READ_SIZE) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return _read_whole(fd, size)[0]
    finally:
        os.close(fd)


def _read_whole(fd: int, size: int) -> tuple[bytes, int]:
    """The file's content, and the read size that held all of it."""
    data = os.pread(fd, size, 0)
    while len(data) == size:
        size *= 4
        data = os.pread(fd, size, 0)
    return data, size
