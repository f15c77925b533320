"""What torch.compile compiled while the script ran, from torch._dynamo's own records: each frame compiled (a
recompilation with its reason; a graph break's resumed frame, named for the broken line), with its compile time and
the step it happened in; and, at the end, dynamo's counters of graph breaks by reason.

gpudoctor never imports torch._dynamo: in a script that has not (no torch.compile), this reads nothing. Where it
has, each step's end looks at dynamo's list of compilation metrics (a bounded deque) for records it has not seen.
"""

from __future__ import annotations

import sys
from typing import Any

from gpudoctor.bundle.events import CompileEvent, DynamoEvent
from gpudoctor.collect.recorder import ExceptionDetails, Recorder

DYNAMO_UTILS = "torch._dynamo.utils"
MAX_REASON = 400  # characters of a reason kept: dynamo's explanations run to a paragraph


class CompileWatch:
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self._seen: set[tuple[Any, Any]] = set()
        self._last: Any = None

    def install(self) -> None:
        self.recorder.on_step_end(self.poll)
        self.recorder.on_finishing(self._finish)

    def poll(self, step: int) -> None:
        """Write what dynamo compiled since the last look, as compiled in `step`."""
        utils = sys.modules.get(DYNAMO_UTILS)
        getter = getattr(utils, "get_compilation_metrics", None)
        if getter is None:
            return
        metrics = getter()
        if not metrics or metrics[-1] is self._last:
            return
        self._last = metrics[-1]
        for record in metrics:
            key = (getattr(record, "compile_id", None), getattr(record, "start_time_us", None))
            if key in self._seen or getattr(record, "co_name", None) is None:
                continue  # seen, or a backward graph's record (compiled with its forward)
            self._seen.add(key)
            self.recorder.emit(compile_event(record, step))

    def _finish(self, exception: ExceptionDetails | None) -> None:
        self.poll(self.recorder.completed)
        utils = sys.modules.get(DYNAMO_UTILS)
        counters = getattr(utils, "counters", None)
        if counters is None:
            return
        breaks = {_short(str(reason)): int(count) for reason, count in dict(counters.get("graph_break", {})).items()}
        graphs = dict(counters.get("stats", {})).get("unique_graphs")
        if breaks or graphs:
            self.recorder.emit(DynamoEvent(graph_breaks=breaks, unique_graphs=graphs if type(graphs) is int else None))


def compile_event(record: Any, step: int) -> CompileEvent:
    seconds = getattr(record, "entire_frame_compile_time_s", None)
    restarts = getattr(record, "restart_reasons", None) or ()
    line = getattr(record, "co_firstlineno", None)
    reason = getattr(record, "recompile_reason", None)
    return CompileEvent(
        step=step, compile_id=_text(getattr(record, "compile_id", None)), function=_text(record.co_name),
        file=_text(getattr(record, "co_filename", None)), line=line if type(line) is int else None,
        seconds=seconds if isinstance(seconds, float | int) and seconds >= 0 else 0.0,
        recompile_reason=_short(reason) if isinstance(reason, str) else None,
        restart_reasons=sorted(_short(str(r)) for r in restarts if not str(r).startswith("<class")),
    )


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _short(reason: str) -> str:
    """A reason's first paragraph, at most MAX_REASON characters."""
    first = reason.strip().split("\n\n")[0].strip()
    return first if len(first) <= MAX_REASON else first[:MAX_REASON - 1] + "…"
