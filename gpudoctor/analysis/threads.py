"""How many of the script's Python threads take turns running the training process's work."""

from __future__ import annotations

from gpudoctor.analysis.views import ProcessInfo


def python_threads_sharing(processes: list[ProcessInfo], python_thread_ids: set[int] | None) -> int | None:
    """Python threads of the main process (among `processes`) that share its work (`ProcessInfo.sharing_among`),
    or None when the run has no process samples or did not record its threads' ids.

    With two or more, the threads interleave on the GIL: per-line host times add up over threads and are no
    longer shares of a step, and the GPU's idle time is the GIL's (GD501) before it is any one line's."""
    main = next((p for p in processes if p.role == "main"), None)
    if main is None or python_thread_ids is None:
        return None
    return main.sharing_among(python_thread_ids)
