"""Steps that stall now and then, and what stalled them: a checkpoint written, a garbage collection, an evaluation loop
(collect.pauses), at the user's line.

A step stalls when it takes more than STALL_FACTOR times the usual step (the median of the steady steps outside the
profiler's warm-up and active steps, which it slows), or a pause recorded in it (a save, a collection) took as long
as a usual step, and it is at least MIN_EXCESS_S longer than that step, in a run where at most MAX_STALLED_SHARE of
the steps do (beyond that, slow steps are how the run steps). Its excess over the usual step
is what the stall costs; an excess that is mostly a wait for data is the input pipeline's (a loader restarting its
workers, or falling behind), not a stall's. Each stalled step is given to the evaluation that began in it, else to
the pause that took most of its excess, else to no known cause; stalls of one cause at one line are counted
together, with their period when they come every N steps. What ran in a stall is told apart (`Stall.parts`): an
evaluation loop and the torch.save after it, each with its seconds (the evaluation's the excess the timed pauses
leave).

A stall that comes after the last step (a script that evaluates and saves at the end of its loop) is no step's:
`Stalls.after_last` is its time, the pauses' seconds and, for an evaluation, the evaluations' mean untimed part
in the steps, so that the job's share of time in the stall (`Stalls.job_share`) counts it too (eval_checkpoint_bad:
three evaluations and saves in 300 steps, the third after the last step).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from gpudoctor.analysis.views import Location, Step
from gpudoctor.bundle.events import LoaderStartEvent, PauseEvent

STALL_FACTOR = 3.0
MIN_EXCESS_S = 0.005
# A step slow this often is the step, not a stall of it (a host short of CPU makes every other step slow).
MAX_STALLED_SHARE = 1 / 3
PROFILED = ("warmup", "active")  # the steps the profiler records, which it slows
EXPLAINS = 0.3  # a pause that took this share of a stall's excess is its cause
PERIODIC = 0.75  # stalls come every N steps when this share of the gaps between them is N, give or take one
CAUSES = ("save", "checkpoint", "gc", "eval", "unknown")


@dataclass(frozen=True)
class StallPart:
    """What ran in a stall, by cause and line, and its seconds over the stalls."""

    cause: str  # one of CAUSES
    location: Location | None
    seconds: float


@dataclass(frozen=True)
class Stall:
    """Stalls of one cause at one line: the steps that stalled, their excess over the usual step in all, the time
    the cause's own calls took in them (0 for an evaluation or an unknown cause), their period in steps when
    they come every N steps, and what ran in them (`parts`: the evaluation, then the save after it)."""

    cause: str  # one of CAUSES
    location: Location | None
    steps: tuple[int, ...]
    excess_s: float
    cause_s: float
    every: int | None
    parts: tuple[StallPart, ...] = ()


@dataclass(frozen=True)
class Stalls:
    """The steady steps' stalls: `usual_s` the usual step, `wall_s` the steps' time in all, over `steps` steps."""

    usual_s: float
    wall_s: float
    steps: int
    stalls: tuple[Stall, ...]
    # The time after the last step in pauses of a stall's cause and line, by (cause, location)
    after_last: dict[tuple[str, Location | None], float] = field(default_factory=dict)

    def share(self, stall: Stall) -> float:
        """The share of the steps' time the stall costs."""
        return stall.excess_s / self.wall_s if self.wall_s > 0 else 0.0

    def tail_s(self, stall: Stall) -> float:
        """The stall's time after the last step: the same cause at the same line, run once more as the job ends."""
        return self.after_last.get((stall.cause, stall.location), 0.0)

    def job_share(self, stall: Stall) -> float:
        """The share of the job's time from its steady steps to its end that the stall costs: its excess in the
        steps and its time after the last one, over the steps' time and that time."""
        tail = self.tail_s(stall)
        whole = self.wall_s + sum(self.after_last.values())
        return (stall.excess_s + tail) / whole if whole > 0 else 0.0


def stalls(steps: Sequence[Step], pauses: Iterable[PauseEvent],
           loader_starts: Iterable[LoaderStartEvent] = ()) -> Stalls | None:
    """The stalls of `steps` (the steady steps), given to the `pauses` recorded in them; None without enough steps.
    The profiled steps, the first of the detail steps and of those after the window, and the steps in which a
    DataLoader started its workers (`loader_starts`: an epoch's start, the start-up's analysis's) are left out.
    Pauses after the last step are a stall's time at the job's end (`Stalls.after_last`)."""
    pauses = list(pauses)
    restarted = {e.step for e in loader_starts if e.workers > 0}
    left_out = _first_of_each_state(steps) | restarted
    kept = [s for s in steps if s.window not in PROFILED and s.index not in left_out]
    if len(kept) < 3:
        return None
    usual = statistics.median(s.wall_s for s in kept)
    usual_wait = statistics.median(s.data_wait_s for s in kept)
    by_step: dict[int, list[PauseEvent]] = defaultdict(list)
    for pause in pauses:
        by_step[pause.step].append(pause)
    groups: dict[tuple[str, Location | None], list[tuple[Step, float, Caused]]] = defaultdict(list)
    for step in kept:
        excess = step.wall_s - usual
        paused = sum(p.seconds for p in by_step.get(step.index, []))
        if excess < MIN_EXCESS_S or (step.wall_s < STALL_FACTOR * usual and paused < usual):
            continue
        if step.data_wait_s - usual_wait >= 0.5 * excess:
            continue  # the input pipeline's: a loader restarting its workers, or falling behind
        caused = _cause(by_step.get(step.index, []), excess)
        groups[(caused.cause, caused.location)].append((step, excess, caused))
    if sum(len(rows) for rows in groups.values()) > MAX_STALLED_SHARE * len(kept):
        groups.clear()
    found = [Stall(cause, location, tuple(s.index for s, _, _ in rows), sum(e for _, e, _ in rows),
                   sum(c.seconds for _, _, c in rows), _period([s.index for s, _, _ in rows]),
                   _parts([c.parts for _, _, c in rows]))
             for (cause, location), rows in groups.items()]
    found.sort(key=lambda stall: -stall.excess_s)
    last = max(s.index for s in steps)
    return Stalls(usual, sum(s.wall_s for s in kept), len(kept), tuple(found),
                  _after_last([p for p in pauses if p.step > last], found))


def _first_of_each_state(steps: Sequence[Step]) -> set[int]:
    """The first detail step and the first step after the window: gpudoctor's own work begins there (its hooks
    put on, the profiler stopped), which no stall of the script's is."""
    firsts: dict[str, int] = {}
    for step in steps:
        firsts.setdefault(step.window, step.index)
    return {firsts[state] for state in ("detail", "closed") if state in firsts}


@dataclass(frozen=True)
class Caused:
    """What stalled one step: its cause and line, that cause's timed seconds, and what ran in it."""

    cause: str
    location: Location | None
    seconds: float
    parts: tuple[StallPart, ...]


def _cause(pauses: list[PauseEvent], excess: float) -> Caused:
    """What stalled a step: the evaluation that began in it, which holds the pauses after it (a save); else the
    pause (by cause and line) that took the most of its `excess`, if it took at least EXPLAINS of it; else no known
    cause. The parts: the evaluation (the excess the timed pauses leave), then each timed pause."""
    timed: dict[tuple[str, Location | None], float] = defaultdict(float)
    for pause in pauses:
        if pause.cause != "eval":
            timed[(pause.cause, Location.from_site(pause.site))] += pause.seconds
    parts = tuple(StallPart(cause, location, seconds)
                  for (cause, location), seconds in sorted(timed.items(), key=lambda item: -item[1]))
    evaluation = next((p for p in pauses if p.cause == "eval"), None)
    if evaluation is not None:
        where = Location.from_site(evaluation.site)
        untimed = max(0.0, excess - sum(timed.values()))
        return Caused("eval", where, 0.0, (StallPart("eval", where, untimed), *parts))
    if timed:
        (cause, location), seconds = max(timed.items(), key=lambda item: item[1])
        if seconds >= EXPLAINS * excess:
            return Caused(cause, location, seconds, parts)
    return Caused("unknown", None, 0.0, ())


def _parts(each: list[tuple[StallPart, ...]]) -> tuple[StallPart, ...]:
    """What ran in a group's stalls, by cause and line, in the order they ran, seconds summed over the stalls."""
    seconds: dict[tuple[str, Location | None], float] = {}
    for parts in each:
        for part in parts:
            seconds[(part.cause, part.location)] = seconds.get((part.cause, part.location), 0.0) + part.seconds
    return tuple(StallPart(cause, location, s) for (cause, location), s in seconds.items())


def _after_last(pauses: list[PauseEvent], found: list[Stall]) -> dict[tuple[str, Location | None], float]:
    """The time after the last step in the stalls found: the pauses there that one of them ran (its cause, or a
    pause among its parts, at the same line), and for an evaluation its mean untimed part in the steps."""
    tail: dict[tuple[str, Location | None], float] = {}
    evaluated = {Location.from_site(p.site) for p in pauses if p.cause == "eval"}
    for stall in found:
        key = (stall.cause, stall.location)
        places = {(part.cause, part.location) for part in stall.parts} | {key}
        seconds = sum(p.seconds for p in pauses if p.cause != "eval"
                      and (p.cause, Location.from_site(p.site)) in places)
        if stall.cause == "eval" and stall.location in evaluated:
            untimed = sum(part.seconds for part in stall.parts if part.cause == "eval")
            seconds += untimed / len(stall.steps)
        if seconds > 0:
            tail[key] = seconds
    return tail


def _period(indices: list[int]) -> int | None:
    """N when the stalls come every N steps (PERIODIC of the gaps between them are N or a multiple of it, give or
    take one from N = 5, and N at least 2); else None."""
    if len(indices) < 2:
        return None
    gaps = [b - a for a, b in pairwise(indices)]
    common, _ = Counter(gaps).most_common(1)[0]
    if common < 2:
        return None
    # A gap of two or more periods is one stall too short to tell from a step (a save the page cache took fast).
    # Give or take one step only for periods of five and more: with a short one, every gap would be near.
    slack = 1 if common >= 5 else 0
    near = sum(1 for gap in gaps if abs(gap - common * max(1, round(gap / common))) <= slack)
    return common if near >= PERIODIC * len(gaps) else None


def stalled_share(steps: Sequence[Step], found: Stalls | None, restarted: Iterable[int]) -> float:
    """The share of `steps` (those the run's pace is the mean of: analysis.timebase.paced_steps) that their stalls
    of a known cause (`found`: a save, a collection, an evaluation) and a loader's later worker starts (the steps in
    `restarted`) took beyond the usual step, past their own wait for data beyond the usual wait, which the wait's
    share holds already: the step budget's `stall` slice (analysis.budget). A slow step of no known cause stays in
    the step's other slices, as the profiled steps split it; a rare stall the pace leaves out is in none."""
    known = [stall for stall in (found.stalls if found else ()) if stall.cause != "unknown"]
    stalled = {index for stall in known for index in stall.steps} | set(restarted)
    wall = sum(s.wall_s for s in steps)
    if wall <= 0 or not stalled:
        return 0.0
    usual_steps = [s for s in steps if s.index not in stalled] or list(steps)
    usual = found.usual_s if found is not None else statistics.median(s.wall_s for s in usual_steps)
    usual_wait = statistics.median(s.data_wait_s for s in usual_steps)
    excess = sum(max(0.0, s.wall_s - usual - max(0.0, s.data_wait_s - usual_wait))
                 for s in steps if s.index in stalled)
    return min(1.0, excess / wall)
