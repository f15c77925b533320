"""The script's interpreter, started while gpudoctor reads its own command line, so that the script starts sooner.

Reading `gpudoctor profile`'s options takes typer a few tenths of a second (it builds a validator for each), and the
script's interpreter takes as long again to start and import gpudoctor's instrumentation. Started first, it does
its part meanwhile and waits on a pipe; the launcher then sends it what to run (collect.bootstrap.main_when_told).
One that is not needed (a usage error, a torchrun job, a try whose output goes to a log) is told nothing and ends.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import subprocess

from gpudoctor.collect.stub import waiting_command

_waiting: tuple[subprocess.Popen, int] | None = None
# Launchers that the script's process is not started for (the job's own processes are), and help, which runs none.
_NOT_A_SCRIPT = ("--help", "torchrun", "torch.distributed.run")
_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE")


def begin(argv: list[str]) -> None:
    """Start the waiting interpreter for `gpudoctor profile ARGV...`, unless that command runs no script of its own."""
    global _waiting  # noqa: PLW0603 - one waiting interpreter per gpudoctor process
    if _waiting is not None or any(a in _NOT_A_SCRIPT for a in argv) or any(v in os.environ for v in _RANK_VARIABLES):
        return
    read, write = os.pipe()
    try:
        process = subprocess.Popen(waiting_command(read), pass_fds=(read,))
    except OSError:
        os.close(write)
        return
    finally:
        os.close(read)
    _waiting = process, write
    atexit.register(discard)


def take(arguments: list[str], env: dict[str, str]) -> subprocess.Popen | None:
    """The waiting interpreter, told to run the bootstrap with `arguments` in `env`; None if there is none."""
    global _waiting
    if _waiting is None:
        return None
    (process, write), _waiting = _waiting, None
    order = {"argv": arguments, "env": {k: v for k, v in env.items() if os.environ.get(k) != v},
             "unset": [k for k in os.environ if k not in env]}
    try:
        if process.poll() is not None:
            return None
        with os.fdopen(write, "wb") as told:
            told.write(json.dumps(order).encode())
    except OSError:
        _end(process)
        return None
    return process


def discard() -> None:
    """Tell the waiting interpreter, if one is left, that there is nothing to run: it ends at once."""
    global _waiting
    if _waiting is None:
        return
    (process, write), _waiting = _waiting, None
    with contextlib.suppress(OSError):
        os.close(write)
    _end(process)


def _end(process: subprocess.Popen) -> None:
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
