"""Which `gpudoctor profile` records into a run directory now: `.recording` names its process and host while it runs.

A second `gpudoctor profile` with the same --out is refused before it touches the directory (it would empty the
first run's files and mix its events with them); `gpudoctor analyze` of a run still being recorded says so instead
of reporting a run cut short. A `.recording` whose process is gone (a gpudoctor killed with SIGKILL) is stale, and
ignored.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import socket
from pathlib import Path

RECORDING = ".recording"


def recorder(run_dir: Path) -> tuple[int, str] | None:
    """The live `gpudoctor profile` recording into `run_dir` (its pid, and when it started), else None."""
    try:
        found = json.loads((run_dir / RECORDING).read_text(encoding="utf-8"))
        pid, host, started = int(found["pid"]), str(found["host"]), str(found.get("started", ""))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if host != socket.gethostname():
        return None  # another host's: its process cannot be looked at from here
    if pid == os.getpid() or not _alive(pid):
        return None
    return pid, started


def claim(run_dir: Path) -> None:
    record = {"pid": os.getpid(), "host": socket.gethostname(),
              "started": dt.datetime.now().astimezone().strftime("%H:%M:%S")}
    with contextlib.suppress(OSError):  # without it, only a second run into this directory goes unrefused
        (run_dir / RECORDING).write_text(json.dumps(record), encoding="utf-8")


def release(run_dir: Path) -> None:
    with contextlib.suppress(OSError):
        found = json.loads((run_dir / RECORDING).read_text(encoding="utf-8"))
        if found.get("pid") == os.getpid():
            (run_dir / RECORDING).unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
