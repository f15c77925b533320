"""Where the analysed steps' time went: the mean breakdown by host phase, and the per-step bars.

Pure functions of the steps; every figure is in seconds, and a share is of the wall time it is set against.
A phase that no step measured is left out (not measured is never zero).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpudoctor.analysis.views import Step

# The host phases of a step, in the order they are drawn; "other" is the wall time no other phase covers.
PHASES = ("data_wait", "copy", "forward", "backward", "optimizer", "sync", "other")
MAX_STEP_ROWS = 40  # per-step bars; more steps are shown as groups of consecutive steps, averaged


@dataclass(frozen=True, slots=True)
class PhaseTime:
    """Mean seconds per step spent in one host phase, and that mean over the mean step's wall time."""

    phase: str  # one of PHASES
    mean_s: float
    share: float  # 0.0 when the mean wall time is zero


@dataclass(frozen=True, slots=True)
class Breakdown:
    """The analysed steps' mean wall time, and the mean of each phase measured in any of them."""

    mean_step_s: float | None  # None when there is no step
    phases: tuple[PhaseTime, ...]


@dataclass(frozen=True, slots=True)
class GpuTime:
    """Mean GPU busy and idle seconds per step of a bar (busiest device), and idle over the mean wall time."""

    busy_s: float
    idle_s: float
    idle_share: float


@dataclass(frozen=True, slots=True)
class StepBar:
    """One bar of the per-step chart: the steps `first` to `last` (one step, or a group of consecutive ones),
    their mean wall time, their mean host time per phase (adding up to the wall time, "other" included) and,
    when the trace measured it, their mean GPU busy and idle time."""

    first: int
    last: int
    wall_s: float
    phases: tuple[PhaseTime, ...]
    gpu: GpuTime | None


@dataclass(frozen=True, slots=True)
class StepBars:
    """The per-step chart: at most MAX_STEP_ROWS bars of `steps_per_row` consecutive steps each (the last bar
    may hold fewer); `max_s` is the longest bar's wall time, `phases` the phases any bar shows, in PHASES order,
    `has_gpu` whether any bar has GPU time."""

    bars: tuple[StepBar, ...]
    steps_per_row: int
    max_s: float
    phases: tuple[str, ...]
    has_gpu: bool


def phase_seconds(step: Step) -> Mapping[str, float | None]:
    """A step's host seconds in each phase of PHASES; None where the phase was not measured."""
    return {
        "data_wait": step.data_wait_s, "copy": step.copy_s, "forward": step.forward_s, "backward": step.backward_s,
        "optimizer": step.optimizer_s, "sync": step.sync_s, "other": step.other_s,
    }


def median_step_s(steps: Sequence[Step]) -> float | None:
    """The median wall time of the steps, or None when there is none."""
    return statistics.median([s.wall_s for s in steps]) if steps else None


def breakdown(steps: Sequence[Step], wait_share: float | None = None) -> Breakdown:
    """Mean seconds per step in each phase, with each phase's share of the mean step. With `wait_share` (the data
    wait of every step after start-up, when `steps` are a few), the data wait is that share of the mean step and
    the other phases are scaled to fill the rest."""
    if not steps:
        return Breakdown(mean_step_s=None, phases=())
    mean_step = statistics.fmean(s.wall_s for s in steps)
    phases = _phase_means(steps, mean_step)
    if wait_share is not None:
        phases = _with_wait(phases, wait_share, mean_step)
    return Breakdown(mean_step_s=mean_step, phases=phases)


def _with_wait(phases: tuple[PhaseTime, ...], wait_share: float, mean_step: float) -> tuple[PhaseTime, ...]:
    """The phases with the data wait's share set to `wait_share`, the others scaled to fill the rest."""
    old = next((p.share for p in phases if p.phase == "data_wait"), 0.0)
    if old >= 1.0:  # the steps only waited: nothing to scale
        return phases
    scale = (1.0 - wait_share) / (1.0 - old)  # the others filled 1 - old at most (_phase_means): now 1 - wait
    shares = [(p.phase, wait_share if p.phase == "data_wait" else p.share * scale) for p in phases]
    return tuple(PhaseTime(phase, share * mean_step, share) for phase, share in shares)


def step_bars(steps: Sequence[Step], max_rows: int = MAX_STEP_ROWS) -> StepBars | None:
    """Per analysed step (or group of consecutive steps, to keep at most `max_rows` bars): host time by phase
    and GPU busy vs idle; None when there is no step."""
    if not steps:
        return None
    groups = _groups(steps, max_rows)
    bars = tuple(_bar(group) for group in groups)
    shown = {p.phase for bar in bars for p in bar.phases if p.mean_s > 0}
    return StepBars(bars=bars, steps_per_row=len(groups[0]), max_s=max(b.wall_s for b in bars),
                    phases=tuple(p for p in PHASES if p in shown), has_gpu=any(b.gpu is not None for b in bars))


def _groups(steps: Sequence[Step], max_rows: int) -> list[Sequence[Step]]:
    size = max(1, math.ceil(len(steps) / max_rows))
    return [steps[i:i + size] for i in range(0, len(steps), size)]


def _bar(group: Sequence[Step]) -> StepBar:
    wall = statistics.fmean(s.wall_s for s in group)
    return StepBar(first=group[0].index, last=group[-1].index, wall_s=wall, phases=_phase_means(group, wall),
                   gpu=_gpu_time(group, wall))


def _gpu_time(group: Sequence[Step], wall: float) -> GpuTime | None:
    busy, idle = _mean(s.gpu_busy_s for s in group), _mean(s.gpu_idle_s for s in group)
    if busy is None or idle is None:
        return None
    return GpuTime(busy_s=busy, idle_s=idle, idle_share=idle / wall if wall else 0.0)


def _phase_means(steps: Sequence[Step], wall: float) -> tuple[PhaseTime, ...]:
    """The mean of each phase measured in any of `steps`, with its share of `wall`; phases that overlap (a sync
    timed inside the forward pass) fitted into the wall time the data wait leaves, so that no second is shown
    twice and the shares add up to at most the whole step."""
    seconds = [phase_seconds(s) for s in steps]
    means = [(phase, mean) for phase in PHASES if (mean := _mean(values[phase] for values in seconds)) is not None]
    timed = sum(mean for phase, mean in means if phase != "data_wait")
    room = max(0.0, wall - next((mean for phase, mean in means if phase == "data_wait"), 0.0))
    scale = room / timed if timed > room > 0 or (timed > 0 and room == 0) else 1.0
    fitted = [(phase, mean if phase == "data_wait" else mean * scale) for phase, mean in means]
    return tuple(PhaseTime(phase, mean, mean / wall if wall else 0.0) for phase, mean in fitted)


def _mean(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None
