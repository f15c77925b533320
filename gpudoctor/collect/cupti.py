"""CUPTI detached after each profiling window, and never left half-detached when the process exits.

With TEARDOWN_CUPTI=1, Kineto detaches CUPTI when the profiler stops, but not at once: the stop starts a native
thread that arms a callback and waits until the process's next CUDA call, whose callback runs cuptiFinalize. A
process that makes no CUDA call after the stop (its window closed by the script's end, or on its last step) exits
with that thread still waiting, and CUDA's own teardown at exit then runs the callback: on an H200 such a process
spun at exit for minutes with every Python thread gone. So the window closed by the script's end asks for no
teardown (the process is ending: there are no later steps to speed up), and after any other window gpudoctor makes
the CUDA call itself and waits, within a bound, until the detaching thread has gone.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from collections.abc import Iterator

TEARDOWN_ENV = "TEARDOWN_CUPTI"
# How long the end of a window waits for CUPTI to detach; it took milliseconds in every run measured (tests/gpu).
DETACH_DEADLINE_S = 2.0
POKE_INTERVAL_S = 0.002
_TASKS = "/proc/self/task"


def request_teardown() -> None:
    """Have Kineto detach CUPTI (cuptiFinalize) once a window's trace is collected, unless the user chose otherwise.

    Without TEARDOWN_CUPTI=1 Kineto leaves CUPTI attached when the profiler stops, and an attached CUPTI slows
    every later kernel launch: on an H100, a step of 2,000 launches ran 1.36x slower for the rest of the process
    after a 7-step window, and 0.82x with the teardown (bench/window_transient.py, docs/performance.md). Kineto
    reads the variable when it stops. Teardown is only safe with CUDA graphs from CUDA 12.6 on, so older builds
    keep CUPTI attached.
    """
    import torch

    if TEARDOWN_ENV in os.environ:
        return
    version = tuple(int(part) for part in re.findall(r"\d+", torch.version.cuda or "")[:2])
    if version >= (12, 6):
        os.environ[TEARDOWN_ENV] = "1"


@contextlib.contextmanager
def no_teardown() -> Iterator[None]:
    """Within the block, a profiler that stops leaves CUPTI attached: for the window the process's end closes."""
    previous = os.environ.get(TEARDOWN_ENV)
    os.environ[TEARDOWN_ENV] = "0"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(TEARDOWN_ENV, None)
        else:
            os.environ[TEARDOWN_ENV] = previous


def _tasks() -> set[int]:
    """The process's native threads (Linux); an empty set where the kernel does not list them."""
    try:
        return {int(name) for name in os.listdir(_TASKS)}
    except (OSError, ValueError):
        return set()


class Detach:
    """Follows the threads a profiler's stop leaves behind, and sees them through to their end."""

    def __init__(self) -> None:
        self._waiting: set[int] = set()

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Around a profiler's stop: the threads it starts are the ones that detach CUPTI."""
        before = _tasks()
        try:
            yield
        finally:
            self._waiting |= _tasks() - before

    @property
    def pending(self) -> bool:
        self._waiting &= _tasks()
        return bool(self._waiting)

    def complete(self, deadline_s: float = DETACH_DEADLINE_S) -> bool:
        """Make CUDA calls until the detaching threads are gone, for at most `deadline_s`; whether they are."""
        deadline = time.monotonic() + deadline_s
        while self.pending:
            if time.monotonic() >= deadline or not _poke_cuda():
                return False
            time.sleep(POKE_INTERVAL_S)
        return True


def _poke_cuda() -> bool:
    """One CUDA runtime call, whose exit callback is where Kineto runs cuptiFinalize; False if CUDA cannot be called."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        if not torch.cuda.is_initialized():
            return False
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - a CUDA context that is gone cannot be poked; the caller stops waiting
        return False
    return True
