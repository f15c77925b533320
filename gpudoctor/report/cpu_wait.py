"""How the CPU side of the step reads, on the terminal and the page: 'waiting for a core: the main thread 3%, the
loader's 8 workers 25% (median); the host's CPU pressure 40%; throttled by a CPU limit: not measured here'.
Formatting only (analysis.cpu_wait)."""

from __future__ import annotations

from gpudoctor.report.document import CpuWaitJson

NOTABLE = 0.05  # the terminal gives the line only where some thread, the host or the limit held this much back


def cpu_wait_text(found: CpuWaitJson | None) -> str | None:
    """The line; None for a document without it, or where nothing of it was measured."""
    if found is None:
        return None
    if all(v is None for v in _shares(found)):
        return None
    threads = [f"the main thread {_share(found['main_thread'])}"]
    workers = found["workers"]
    if workers:
        median = " (median)" if workers > 1 and found["loader_workers"] is not None else ""
        threads.append(f"the loader's {workers} worker{'s' if workers > 1 else ''} "
                       f"{_share(found['loader_workers'])}{median}")
    if found["pin_memory_thread"] is not None:
        threads.append(f"the pin-memory thread {_share(found['pin_memory_thread'])}")
    return (f"waiting for a core: {', '.join(threads)}; the host's CPU pressure {_share(found['host_pressure'])}; "
            f"throttled by a CPU limit {_share(found['throttled'])}")


def notable(found: CpuWaitJson | None) -> bool:
    """Whether some share of it held the step back enough to say on the terminal."""
    if found is None:
        return False
    return any(v is not None and v >= NOTABLE for v in _shares(found))


def _shares(found: CpuWaitJson) -> tuple[float | None, ...]:
    return (found["main_thread"], found["loader_workers"], found["pin_memory_thread"], found["host_pressure"],
            found["throttled"])


def _share(value: float | None) -> str:
    if value is None:
        return "not measured here"
    return "under 1%" if 0 < value < 0.005 else f"{value:.0%}"
