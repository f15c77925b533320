"""What torch.compile compiled while the script ran (collect.compile_watch): the graph breaks, at the lines they
broke, with their reasons; the recompilations of each compiled function, with theirs; and the time they cost.

Dynamo compiles the code after a graph break as a frame of its own, named `torch_dynamo_resume_in_<function>_at_<line>`:
its line is the line that broke the graph. A frame compiled again says why in its `recompile_reason` (a guard that
failed: a size, a dtype, a Python value).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from gpudoctor.analysis.views import Location
from gpudoctor.bundle.events import CompileEvent, DynamoEvent

_RESUME = re.compile(r"^torch_dynamo_resume_in_(?P<function>.+)_at_(?P<line>\d+)$")


@dataclass(frozen=True)
class GraphBreak:
    """Graphs broken at one line: the break's reason (dynamo's first sentence of it), how many times the code after
    it was compiled, and the seconds that took."""

    location: Location | None
    reason: str | None
    compiles: int
    seconds: float


@dataclass(frozen=True)
class Recompiles:
    """One compiled function compiled again: how many times, why (the distinct reasons, most frequent first), the
    seconds those compilations took, and in which steps (each one's seconds in `each_s`)."""

    location: Location | None
    function: str
    count: int
    reasons: tuple[str, ...]
    seconds: float
    steps: tuple[int, ...]
    each_s: tuple[float, ...]

    def seconds_from(self, step: int) -> float:
        """The seconds of the recompilations in `step` and after."""
        return sum(s for s, at in zip(self.each_s, self.steps, strict=True) if at >= step)


@dataclass(frozen=True)
class Compiles:
    """What torch.compile compiled: `frames` compilations taking `seconds`, the graph breaks and the functions
    compiled again."""

    frames: int
    seconds: float
    breaks: tuple[GraphBreak, ...]
    recompiles: tuple[Recompiles, ...]
    graph_breaks: dict[str, int]  # dynamo's own count of breaks, by reason (a break hit at each call counts each)


def compiles(events: Iterable[CompileEvent], counters: Iterable[DynamoEvent]) -> Compiles | None:
    """What was compiled, from the compile events and dynamo's counters; None when nothing was."""
    compiled = list(events)
    counted = next(iter(counters), None)
    if not compiled and counted is None:
        return None
    return Compiles(len(compiled), sum(e.seconds for e in compiled), _breaks(compiled), _recompiles(compiled),
                    dict(counted.graph_breaks) if counted is not None else {})


def _breaks(compiled: list[CompileEvent]) -> tuple[GraphBreak, ...]:
    reasons = _restart_reasons(compiled)
    rows: dict[tuple[str | None, int, str], list[CompileEvent]] = defaultdict(list)
    for event in compiled:
        found = _RESUME.match(event.function or "")
        if found:
            rows[(event.file, int(found.group("line")), found.group("function"))].append(event)
    return tuple(GraphBreak(Location(file, line, function) if file else None,
                            reasons.get((file, function)), len(events), sum(e.seconds for e in events))
                 for (file, line, function), events in rows.items())


def _restart_reasons(compiled: list[CompileEvent]) -> dict[tuple[str | None, str], str]:
    """The first graph-break reason dynamo gave while compiling each function (by file and name)."""
    reasons: dict[tuple[str | None, str], str] = {}
    for event in compiled:
        if event.restart_reasons and event.function:
            reasons.setdefault((event.file, event.function), event.restart_reasons[0])
    return reasons


def _recompiles(compiled: list[CompileEvent]) -> tuple[Recompiles, ...]:
    rows: dict[tuple[str | None, str, int | None], list[CompileEvent]] = defaultdict(list)
    for event in compiled:
        if event.recompile_reason and event.function:
            rows[(event.file, event.function, event.line)].append(event)
    found = []
    for (file, function, line), events in rows.items():
        counts: dict[str, int] = defaultdict(int)
        for event in events:
            counts[_reason(event.recompile_reason or "")] += 1
        reasons = tuple(sorted(counts, key=lambda r: -counts[r]))
        found.append(Recompiles(Location(file, line or 0, function) if file else None, function, len(events),
                                reasons, sum(e.seconds for e in events), tuple(e.step for e in events),
                                tuple(e.seconds for e in events)))
    return tuple(found)


def _reason(reason: str) -> str:
    """A recompile reason without the compile id it names ("0/0: tensor 'x' size mismatch ..." -> "tensor 'x' ...")."""
    return re.sub(r"^\d+/\d+:\s*", "", reason.strip().splitlines()[0])
