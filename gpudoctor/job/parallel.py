"""A job's ranks analysed side by side: one process per core, each rank analysed in one of them, so that a job's
analysis takes about the time of its ranks over the cores rather than their sum.

Each rank is diagnosed where it is analysed, with its own report built there too; what comes back is the rank's
diagnosis (its run, which the job's rules read, pickled) and that report. The processes are forked from this one,
which has already loaded the rules (a project's own among them: nothing is loaded again, nothing needs to pickle).
Where fork is not the platform's way (macOS, Windows), or one process is asked for, the ranks are analysed here,
one after another.

How many processes: GPUDOCTOR_ANALYSIS_PROCESSES where it is a number from 1 (1: in this process), else (unset, 0,
anything else) one per core this process may run on, no more than the ranks, and no more than the memory available
holds at a rank's estimated peak (`rank_peak_bytes`); never more than one where fork is not the platform's way. A
process that ends without an answer (killed, out of memory) leaves to this process, one after another, the ranks
that no process finished; those finished are kept. An error in one rank's analysis, or a Ctrl-C, ends the others
at once (the ranks not begun are not) and is raised here.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import TypeVar

import psutil

from gpudoctor.bundle.layout import trace_names
from gpudoctor.engine.isolation import RULE_THREAD_PREFIX

PROCESSES_VARIABLE = "GPUDOCTOR_ANALYSIS_PROCESSES"
# A rank's analysis at its peak: the interpreter and the rules (about 100 MB), and what its trace's reading keeps,
# which took a 1 GB GPU-heavy trace to 307 MB (docs/performance.md, "Reading limits"); by the gzipped size, whose
# ratio to the JSON varies, a bound rounded up.
BASE_PEAK_BYTES = 128 << 20
PEAK_PER_GZIP_BYTE = 5
# The share of the memory available the processes together may take at their estimated peaks.
MEMORY_SHARE = 0.5

T = TypeVar("T")


def rank_peak_bytes(bundle: Path) -> int:
    """The estimated peak memory of analysing the rank bundle `bundle`, by the size of its largest window's trace
    (its windows are read one after another)."""
    sizes = [(bundle / name).stat().st_size for name in trace_names(bundle)]
    return BASE_PEAK_BYTES + PEAK_PER_GZIP_BYTE * max(sizes, default=0)


def analysis_processes(bundles: Mapping[int, Path]) -> int:
    """How many processes analyse the ranks `bundles` (see the module's docstring)."""
    if not _can_fork():
        return 1
    asked = os.environ.get(PROCESSES_VARIABLE, "").strip()
    if asked.isdigit() and int(asked) >= 1:
        return min(int(asked), max(1, len(bundles)))
    peak = max((rank_peak_bytes(b) for b in bundles.values()), default=BASE_PEAK_BYTES)
    fits = int(psutil.virtual_memory().available * MEMORY_SHARE // peak)
    return max(1, min(usable_cores(), len(bundles), fits))


def usable_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _can_fork() -> bool:
    """Fork is the platform's way, and no rule that timed out is still running on its thread: it may hold a lock
    (its own, the allocator's, a library's) that a forked child would then wait on for ever."""
    return (sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()
            and not any(t.name.startswith(RULE_THREAD_PREFIX) and t.is_alive() for t in threading.enumerate()))


# The work each forked process does, set before the processes are forked (they inherit it, it is not pickled).
_WORK: dict[str, Callable[[int, Path], object]] = {}


def _in_process(number: int, bundle: Path) -> object:
    return _WORK["work"](number, bundle)


def each_rank(bundles: Mapping[int, Path], work: Callable[[int, Path], T], processes: int) -> dict[int, T]:
    """`work(number, bundle)` for each rank of `bundles`, in `processes` forked processes (1: here), by rank. An
    exception `work` raises, or a Ctrl-C, ends the other processes and is raised here as soon as it comes."""
    if processes <= 1 or len(bundles) <= 1 or not _can_fork():
        return {number: work(number, bundle) for number, bundle in bundles.items()}
    _WORK["work"] = work
    done: dict[int, T] = {}
    pool = ProcessPoolExecutor(min(processes, len(bundles)), mp_context=multiprocessing.get_context("fork"))
    try:
        futures: dict[Future[object], int] = {pool.submit(_in_process, n, b): n for n, b in bundles.items()}
        for future in as_completed(futures):
            if isinstance(future.exception(), BrokenProcessPool):
                continue  # its process was killed (out of memory, ...): the rank is analysed here, below
            done[futures[future]] = future.result()  # type: ignore[assignment]  # what `work` returned
    except BaseException:
        _stop(pool)
        raise
    else:
        pool.shutdown()
    finally:
        _WORK.clear()
    return {number: done[number] if number in done else work(number, bundle) for number, bundle in bundles.items()}


def _stop(pool: ProcessPoolExecutor) -> None:
    """The ranks not begun are not, and those being analysed end now: waiting for them would hold an error, or a
    Ctrl-C, for as long as they take. (Python 3.14's terminate_workers(); before it, the pool's own processes.)"""
    processes = list((getattr(pool, "_processes", None) or {}).values())  # shutdown() forgets them
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        with contextlib.suppress(Exception):  # ended already
            process.terminate()
