"""The free space gpudoctor leaves on the run directory's disk: it never takes the script's last bytes.

Below MIN_FREE_MB (128 MB; `GPUDOCTOR_MIN_FREE_MB` sets another) of free space, `gpudoctor profile` does not start
the script (status 73, said in one sentence), and once the script runs, every writer of the bundle stops (the
events, the samples, a window's trace), says so once, and lets the script go on: its own files get the space.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

DEFAULT_MIN_FREE_MB = 128
CHECK_EVERY_S = 1.0  # statvfs costs microseconds; a writer looks at most this often


def min_free_bytes() -> int:
    try:
        return max(0, int(float(os.environ.get("GPUDOCTOR_MIN_FREE_MB", DEFAULT_MIN_FREE_MB)) * (1 << 20)))
    except (ValueError, OverflowError):
        return DEFAULT_MIN_FREE_MB << 20


def free_bytes(path: Path) -> int | None:
    """Bytes free to an unprivileged writer on the disk of `path` (its nearest existing parent); None where the
    system does not say."""
    for place in (path, *path.parents):
        try:
            stats = os.statvfs(place)
        except FileNotFoundError:
            continue
        except OSError:
            return None
        return stats.f_bavail * stats.f_frsize
    return None


def short_of_space(path: Path) -> OSError | None:
    """An ENOSPC error saying how little is free, where the disk of `path` has less than the margin free."""
    free, margin = free_bytes(path), min_free_bytes()
    if free is None or free >= margin:
        return None
    return OSError(errno.ENOSPC, f"only {free / (1 << 20):.1f} MB free on its disk, under the "
                                 f"{margin / (1 << 20):.0f} MB gpudoctor leaves to the script")


class FreeSpaceCheck:
    """`short()`: the error of `short_of_space`, looked at most every CHECK_EVERY_S."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._next = 0.0

    def short(self) -> OSError | None:
        now = time.monotonic()
        if now < self._next:
            return None
        self._next = now + CHECK_EVERY_S
        return short_of_space(self.path)
