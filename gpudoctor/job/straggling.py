"""The rank a job's other ranks wait for, step by step, and what the job's step becomes once it no longer makes
them wait.

Under DDP every rank meets the others in the gradients' all-reduce each step; a late rank makes the others wait
there. Which rank is late, and by how much, comes from each rank's time in collectives per step (`RankFigures.
collective_by_step`): the late one spends the least there.

Once the late rank's own cause is fixed, the others no longer wait, but the job's step does not fall to what
they compute: their own limits were hidden behind the wait. A rank's loader workers deliver a batch no faster
than their CPU per batch over the workers with a core of their own (`RankFigures.loader_limit_s`), and the late
rank, given the others' loader settings, is held to the same. The job's step after the fix is the longest of
those limits and of the ranks' steps without their wait.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from gpudoctor.analysis import NotEvaluated
from gpudoctor.job.figures import RankFigures
from gpudoctor.job.model import Job, RankRun


@dataclass(frozen=True)
class Straggling:
    """The rank the others wait for, step by step: `slow` spends the least time in collectives in `slow_steps` of
    the `steps` every rank analysed, and the others wait `wait_s` for it (median over those steps of the least
    wait among them) in steps of `step_s` (the median of those steps on the waiting ranks)."""

    slow: RankRun
    others: list[RankFigures]
    slow_steps: int
    steps: int
    wait_s: float
    step_s: float

    @property
    def consistency(self) -> float:
        return self.slow_steps / self.steps


def _in_common(job: Job, min_steps: int) -> tuple[list[RankRun], list[int]]:
    """The ranks whose traces show collectives, and the steps they all analysed, in order."""
    measured = [r for r in job.ranks if r.figures.collective_by_step]
    if len(measured) < 2:
        raise NotEvaluated("fewer than two ranks show collectives in their traces")
    common = sorted(set.intersection(*(set(r.figures.collective_by_step) for r in measured)))
    if len(common) < min_steps:
        raise NotEvaluated(f"the ranks analysed fewer than {min_steps} steps in common")
    return measured, common


def straggling(job: Job, min_steps: int = 3) -> Straggling:
    measured, common = _in_common(job, min_steps)
    least = [min(measured, key=lambda r: r.figures.collective_by_step[step]) for step in common]
    slow = max(measured, key=least.count)  # the rank that is most often the last to arrive
    others = [r.figures for r in measured if r is not slow]
    waits = [min(f.collective_by_step[step] for f in others) - slow.figures.collective_by_step[step]
             for step in common]
    # The same steps' wall time on the waiting ranks: a wait is a share of these, not of a median taken over
    # other steps (those outside a window that slowed its steps are shorter).
    in_common = set(common)
    walls = [[s.wall_s for s in r.run.steps if s.index in in_common] for r in measured if r is not slow]
    step_s = statistics.median(statistics.median(w) for w in walls if w) if any(walls) else 0.0
    return Straggling(slow, others, least.count(slow), len(common), max(0.0, statistics.median(waits)), step_s)


@dataclass(frozen=True)
class Turns:
    """Ranks that wait for each other in turns: in `steps` steps every rank analysed, the last to reach the
    collective changes (`late`: how many steps each rank was last), the others waiting `wait_s` for it (median over
    the steps) in steps of `step_s`; in `explained` of them the last rank's data wait is longer than the others' by
    at least half that wait (its loader delivered late), and `data_wait_s` is the ranks' median data wait."""

    late: dict[int, int]
    steps: int
    wait_s: float
    step_s: float
    explained: int
    data_wait_s: float


def taking_turns(job: Job, min_steps: int = 3) -> Turns:
    """How the ranks wait for each other step by step, whichever is last (see Turns)."""
    measured, common = _in_common(job, min_steps)
    steps = {r.rank: {s.index: s for s in r.run.steps} for r in measured}
    late: dict[int, int] = {}
    waits, walls, explained = [], [], 0
    for index in common:
        last = min(measured, key=lambda r: r.figures.collective_by_step[index])
        others = [r for r in measured if r is not last]
        wait = max(0.0, min(r.figures.collective_by_step[index] for r in others)
                   - last.figures.collective_by_step[index])
        late[last.rank] = late.get(last.rank, 0) + 1
        waits.append(wait)
        walls.append(statistics.median(steps[r.rank][index].wall_s for r in others if index in steps[r.rank]))
        extra = steps[last.rank][index].data_wait_s - statistics.median(
            steps[r.rank][index].data_wait_s for r in others if index in steps[r.rank])
        explained += wait > 0 and extra >= 0.5 * wait
    data = statistics.median(steps[r.rank][i].data_wait_s for r in measured for i in common if i in steps[r.rank])
    return Turns(late, len(common), statistics.median(waits), statistics.median(walls), explained, data)


@dataclass(frozen=True)
class JobAfterFix:
    """The job's step once the late rank no longer makes the others wait: `step_s`, set by `limited_by`
    ("rank 0's loader: 6 workers, 81 ms of CPU per batch", "rank 1's own work", "the others' own work")."""

    step_s: float
    limited_by: str


def job_after_fix(found: Straggling, pace_s: float, slow_extra_s: float) -> JobAfterFix:
    """The job's step, now `pace_s`, once the late rank's cause is gone: the late rank then takes `slow_extra_s`
    less per step (its extra data wait, when that is the cause; else the others' wait); the others step without
    their wait (as far as the profiled steps show it: a rank whose host runs ahead of its GPU times none of it),
    their GPU's own work, and what their loaders can feed (the late rank, given the same settings, as well)."""
    bounds = [(max(0.0, pace_s - slow_extra_s), f"rank {found.slow.rank}'s own work"),
              (max(0.0, found.step_s - found.wait_s), "the others' own work")]
    for figures in found.others:
        if figures.gpu_compute_s is not None:
            bounds.append((figures.gpu_compute_s, f"rank {figures.rank}'s GPU work"))
        if figures.loader_limit_s is not None:
            cpu_ms = (figures.worker_cpu_per_batch_s or 0.0) * 1e3
            said = f"rank {figures.rank}'s loader: {figures.num_workers} workers, {cpu_ms:.0f} ms of CPU per batch"
            bounds.append((figures.loader_limit_s, said))
    step_s, limited_by = max(bounds, key=lambda bound: bound[0])
    return JobAfterFix(min(step_s, pace_s), limited_by)
