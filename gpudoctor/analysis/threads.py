"""How many of the script's Python threads take turns running the training process's work."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpudoctor.analysis.run import Run


def python_threads_sharing(run: Run) -> int | None:
    """Python threads of the main process that share its work (`ProcessInfo.sharing_among`), or None when the
    run has no process samples or did not record its threads' ids.

    With two or more, the threads interleave on the GIL: per-line host times add up over threads and are no
    longer shares of a step, and the GPU's idle time is the GIL's (GD501) before it is any one line's."""
    main = next((p for p in run.processes if p.role == "main"), None)
    ids = run.python_thread_ids
    if main is None or ids is None:
        return None
    return main.sharing_among(ids)
