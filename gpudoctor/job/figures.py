"""Each rank's figures per step, side by side: what the ranks table shows and the job's rules compare.

Every figure is the median over the rank's analysed steps. Under DDP every rank's step lasts as long as the
slowest rank's, so step times alone cannot tell which rank holds the others back: the time each spends in
collectives can. The rank that spends the least there is the one the others wait for; what each spends
beyond that least is its wait (`collective_wait_s`).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpudoctor.analysis import Run, loader_limit_s, worker_cpu_per_batch_s
from gpudoctor.analysis.collectives import collective_ends, collective_s_per_step, exposed_per_step
from gpudoctor.analysis.shares import gpu_idle_share
from gpudoctor.bundle.events import RankEvent
from gpudoctor.job.clocks import ClockOffset, clock_offsets
from gpudoctor.report.document import RankJson, RankTimeJson


@dataclass(frozen=True)
class RankTime:
    """A rank's step at its pace, split as its own report's budget splits it (each slice a time per step, adding
    up to `step_s`): the GPU computing (copies with nothing beside them included), in collectives (communicating,
    and waiting for the other ranks), idle while the host waits for data, and idle for the rest of the host's work
    (syncs, launches, Python). Without GPU activity (gloo on CPUs), the wait for data is every step's after
    start-up, the collectives' share is the analysed steps', and the rest is the host's work, computing included.
    `gpu_idle_share` is what its own report says."""

    step_s: float
    computing_s: float
    collective_s: float
    data_wait_s: float
    other_s: float
    gpu_idle_share: float | None
    waiting_s: float = 0.0  # of collective_s, beyond the least of any rank's: the wait for the others (with_waits)

    @property
    def communicating_s(self) -> float:
        return self.collective_s - self.waiting_s

    def to_json(self) -> RankTimeJson:
        return {"step_s": self.step_s, "computing_s": self.computing_s, "communicating_s": self.communicating_s,
                "waiting_for_ranks_s": self.waiting_s, "data_wait_s": self.data_wait_s, "other_host_s": self.other_s}


def rank_time(run: Run, collective_by_step: Mapping[int, float]) -> RankTime | None:
    """The rank's step split (see RankTime); None without a step time."""
    budget, step = run.budget, run.pace.seconds
    if budget is not None:
        seconds = {s.name: s.seconds for s in budget.slices}
        return RankTime(budget.step_s, seconds["gpu_busy"] + seconds["copy"], seconds["collective"],
                        seconds["data_wait"],
                        seconds["stall"] + seconds["sync"] + seconds["host"] + seconds["unexplained"],
                        gpu_idle_share(run))
    if not step or not run.steps:
        return None
    wait = min(1.0, run.steady_wait_share or 0.0)
    walls = {s.index: s.wall_s for s in run.steps}
    shares = [c / walls[i] for i, c in collective_by_step.items() if walls.get(i)]
    collective = min(1.0 - wait, statistics.median(shares)) if shares else 0.0
    return RankTime(step, 0.0, collective * step, wait * step, (1.0 - wait - collective) * step, gpu_idle_share(run))


@dataclass(frozen=True)
class RankFigures:
    rank: int
    median_step_s: float | None  # its median step (its report's)
    data_wait_s: float | None
    collective_s: float | None  # None: the trace shows no collective
    gpu_idle_s: float | None  # None: no GPU activity measured
    gpu_compute_s: float | None  # kernels other than collectives, per step; None: no GPU activity measured
    steps_analysed: int
    ending: str | None
    exit_status: int | None
    bundle: str
    collective_wait_s: float | None = None  # set across ranks, by with_waits
    # Seconds in collectives in each analysed step, by step index: under DDP, step k is the same iteration on
    # every rank, so the ranks can be compared step by step.
    collective_by_step: Mapping[int, float] = field(default_factory=dict)
    exposed_s: float | None = None  # of collective_s, the seconds no compute ran beside (median per step)
    # Of exposed_s, what started before the step's last backward() call (gradient accumulation's all-reduces)
    exposed_before_last_backward_s: float | None = None
    collective_before_last_backward_s: float | None = None  # those all-reduces whole, overlapped or not
    backwards: int = 0  # backward() calls per step (median)
    step_s: float | None = None  # the rank's step at its pace, which its savings are of (its report's step_s)
    num_workers: int | None = None  # its main DataLoader's workers (None: no DataLoader)
    worker_cpu_per_batch_s: float | None = None  # the CPU its loader's workers spend on one batch
    loader_limit_s: float | None = None  # the shortest step its loader's workers can feed (analysis.loader_cpu)
    time: RankTime | None = None  # its step at its pace, split as its own report's budget
    host: str | None = None  # the host it ran on
    node_rank: int | None = None  # its node's rank, as its launcher numbered the nodes
    run_delay_share: float | None = None  # its main thread's wait for a core, a share of the time (analysis.cpu_wait)
    # the script's lines its main thread was seen at in the detail steps: (file, line, share of the looks)
    host_lines: tuple[tuple[str, int, float], ...] = ()
    # When each analysed step's last collective ended, on the rank's own clock, by step index
    collective_end_by_step: Mapping[int, float] = field(default_factory=dict)
    clock: ClockOffset | None = None  # its clock against the job's first rank's (set across ranks, by with_waits)
    # How gpudoctor came to record it (its RankEvents' sources) and the frameworks its script ran on: what tells the
    # job's launcher (gpudoctor.job.launcher)
    recorded_as: frozenset[str] = frozenset()
    frameworks: frozenset[str] = frozenset()

    def to_json(self) -> RankJson:
        row: RankJson = {
            "rank": self.rank, "median_step_s": self.median_step_s, "step_s": self.step_s,
            "data_wait_s": self.data_wait_s,
            "collective_s": self.collective_s, "collective_wait_s": self.collective_wait_s,
            "exposed_collective_s": self.exposed_s,
            "gpu_idle_s": self.gpu_idle_s, "num_workers": self.num_workers,
            "worker_cpu_per_batch_s": self.worker_cpu_per_batch_s, "loader_limit_s": self.loader_limit_s,
            "steps_analysed": self.steps_analysed, "ending": self.ending,
            "exit_status": self.exit_status, "bundle": self.bundle,
            "host": self.host, "node_rank": self.node_rank,
            "clock_offset_s": self.clock.offset_s if self.clock else None,
            "clock_residual_s": self.clock.residual_s if self.clock else None,
        }
        if self.time is not None:
            row["gpu_idle_share"] = self.time.gpu_idle_share
            row["time"] = self.time.to_json()
        return row


def rank_figures(rank: int, run: Run, bundle: str) -> RankFigures:
    """One rank's figures, from its run: `run` the window its report shows, for a run profiled with --every."""
    steps = run.steps
    exit_info = run.manifest.exit
    collective = collective_s_per_step(run.trace, steps)
    exposed = exposed_per_step(run.trace, steps) or []
    by_step = {s.index: c for s, c in zip(steps, collective)} if collective else {}
    ends = {s.index: end for s, end in zip(steps, collective_ends(run.trace, steps) or []) if end is not None}
    return RankFigures(
        rank=rank, median_step_s=run.reference_step.seconds, step_s=run.pace.reported_s,
        data_wait_s=_median([s.data_wait_s for s in steps]),
        collective_s=_median(collective or []),
        collective_by_step=by_step, collective_end_by_step=ends, time=rank_time(run, by_step),
        exposed_s=_median([e.seconds for e in exposed]),
        exposed_before_last_backward_s=_median([e.before_last_backward for e in exposed]),
        collective_before_last_backward_s=_median([e.all_before_last_backward for e in exposed]),
        backwards=round(statistics.median(s.backwards for s in steps)) if steps else 0,
        gpu_idle_s=_median([s.gpu_idle_s for s in steps if s.gpu_idle_s is not None]),
        gpu_compute_s=_median([max(0.0, s.gpu_compute_s - c) for s, c in zip(steps, collective or [0.0] * len(steps))
                               if s.gpu_compute_s is not None]),  # the collectives' kernels left out
        num_workers=run.sites.loader.main.num_workers if run.sites.loader.main is not None else None,
        worker_cpu_per_batch_s=worker_cpu_per_batch_s(run), loader_limit_s=loader_limit_s(run),
        steps_analysed=len(steps), ending=exit_info.ending if exit_info else _without_end(run),
        exit_status=exit_info.status if exit_info else None, bundle=bundle,
        host=run.manifest.host.hostname,
        node_rank=run.manifest.launch.node_rank if run.manifest.launch is not None else None,
        run_delay_share=run.host.cpu_wait.main_thread,
        host_lines=tuple((where.file, where.line, share) for where, share in run.sites.host_lines[:10]
                         if where.file is not None and where.line is not None),
        recorded_as=frozenset(event.source for event in run.events(RankEvent)),
        frameworks=frozenset(run.host.env.frameworks),
    )


# A rank whose process ended without gpudoctor writing its end: killed (SIGKILL, the OOM killer, its node lost)
LOST = "lost"


def _without_end(run: Run) -> str | None:
    return LOST if run.manifest.status == "running" else None


def with_waits(figures: Sequence[RankFigures]) -> list[RankFigures]:
    """The ranks' figures with `collective_wait_s`: each one's collective time beyond the least of any rank; the
    same of their steps at their pace (`RankTime.waiting_s`); and each one's clock against the first rank's."""
    figures = _with_clocks(_with_time_waits(figures))
    measured = [f.collective_s for f in figures if f.collective_s is not None]
    if len(measured) < 2:
        return list(figures)
    least = min(measured)
    return [f if f.collective_s is None else replace(f, collective_wait_s=f.collective_s - least) for f in figures]


def _with_time_waits(figures: Sequence[RankFigures]) -> list[RankFigures]:
    timed = [f.time.collective_s for f in figures if f.time is not None and f.time.collective_s > 0]
    if len(timed) < 2:
        return list(figures)
    least = min(timed)
    return [replace(f, time=replace(f.time, waiting_s=max(0.0, f.time.collective_s - least)))
            if f.time is not None and f.time.collective_s > 0 else f for f in figures]


def _with_clocks(figures: Sequence[RankFigures]) -> list[RankFigures]:
    offsets = clock_offsets({f.rank: f.collective_end_by_step for f in figures if f.collective_end_by_step})
    return [replace(f, clock=offsets[f.rank]) if f.rank in offsets else f for f in figures]


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None
