"""The step time budget: each analysed step's wall time split once, every second given to exactly one slice.

The GPU is busy computing, in a collective, or copying with no kernel beside the copy (`copy`, on the step's
critical path); or it idles, and each idle gap is given to one cause, in order:

1. `data_wait`: the host was waiting for the next batch (the recorder times it at the top of the step);
2. `sync`: a synchronizing call overlaps the gap: the host was blocked, the GPU drained its queue and waited
   for the host to launch again (`idle_in_syncs`; GD211 sizes its findings on the slice). A drained queue also
   leaves the GPU waiting on the launches after the call, in gaps no call overlaps: up to the host's time
   blocked in the calls (timed in the detail steps), those host-side gaps (4 and 5) are the syncs' as well,
   since a host not held up would have launched that much earlier (`_with_drain_after_syncs`);
3. `copy`: a blocking host-to-device copy from pageable memory overlaps it (cudaMemcpy on the host);
4. `host`: the host was launching work (CUDA runtime calls inside the gap): Python and launch overhead;
5. `unexplained`: nothing the trace shows: the host ran Python that launched nothing, or waited on something
   gpudoctor does not see (a lock, a file, another process).

A trace too large to keep every runtime call (analysis.trace.DETAIL_MAX_BYTES) cannot tell 4 from 5: its
remaining idle is `host`. Steps without GPU activity in the trace have no budget.

The split is measured on the profiled steps, but a window of a few steps may catch the loader ahead or behind:
the data wait is timed cheaply in every step, so the budget's `data_wait` is the share of every step after
start-up (as the input-pipeline rules size their savings), the other slices scaled to fill the rest, and its
seconds are of the step the report's savings are given against (analysis.timebase.step_time).

Nor does a window of a few steps see the steps that stall now and then: a checkpoint written every 10 steps, a
loader that starts its workers again at each epoch. Their time beyond the usual step, past their own wait for
data, is `stall`, a share of the steps the run's pace is the mean of (analysis.stalls.stalled_share), so that the
time they take is claimed by the rules that name them (GD701, GD702), not by the host-side slices the window's
steps split into: startup_workers_bad's 128 workers started at each epoch of 15 steps make its mean step 145 ms
against a usual 2.5 ms, and scaling the window's launch-bound split to 145 ms had GD301 claim 85% of it.

The profiler slows the steps it records: CUPTI's records cost every CUDA call on the host, 1.3x to 1.7x on a
launch-bound step for as long as it is on (bench/window_warmup.py, docs/performance.md), and the GPU idles the
longer between launches. When that step is the mean of the steps after the window, the profiled steps' excess
over it, past their wait for data, is that cost (`profiler_s`): it is taken out of the host-side slices
(PROFILER_COST_FROM, in order) before the rest is scaled to the step, so that no slice, and no finding made of
one, describes the profiler.
"""

from __future__ import annotations

import statistics
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpudoctor import intervals
from gpudoctor.analysis.collectives import collective_spans
from gpudoctor.analysis.gpu import GpuView
from gpudoctor.analysis.trace import SYNC_CALLS, HostSpan, TraceData
from gpudoctor.analysis.views import Step

SLICES = ("gpu_busy", "collective", "data_wait", "stall", "sync", "copy", "host", "unexplained")
SLICE_LABELS = {
    "gpu_busy": "GPU computing", "collective": "GPU in collectives (waiting for other ranks included)",
    "data_wait": "GPU idle: host waiting for data",
    "stall": "GPU idle: steps that stall now and then (a save, an evaluation, workers started again)",
    "sync": "GPU idle around a sync: the host waits for the GPU, then the GPU for the host's next launches",
    "copy": "Copies not overlapped, and GPU idle in a blocking copy",
    "host": "GPU idle: host-side work (Python, launches)",
    "unexplained": "GPU idle: unexplained",
}


# The slices of the budget a finding's saving is made of, by its category: a blocking device-to-host copy is a
# sync too; threads that serialize on the GIL, or a host short of CPU, slow whatever the host does.
SLICES_OF_CATEGORY: dict[str, tuple[str, ...]] = {
    "data_starvation": ("data_wait",), "cpu_oversubscription": ("data_wait",), "blocking_copy": ("copy", "sync"),
    "sync_point": ("sync",), "small_batch": ("host", "unexplained"),
    "gil_contention": ("host", "sync", "unexplained"), "cpu_contention": ("data_wait", "host", "unexplained"),
    "straggler": ("collective",), "communication": ("collective",), "precision": ("gpu_busy",),
    "optimizer": ("host", "unexplained"), "gpu_memory": ("host", "unexplained"),
    # A graph break that reads a value waits for the GPU as a sync does (GD314).
    "compile": ("host", "unexplained", "sync"),
    # A periodic stall's excess over the usual step; the start-up's later worker starts, with the first batch's
    # wait after each (GD702's impact counts both).
    "periodic_stall": ("stall",), "startup": ("stall", "data_wait"),
}
# Categories whose findings name a cause of the time another category's claim also holds: the GPU idles while the
# host launches a per-tensor optimizer loop or unfused elementwise kernels, or waits in cudaMalloc and cudaFree,
# idle that a launch-bound step's finding (small_batch) claims as a whole. They draw on that category's share
# first, so that no ms is counted twice and the cause named keeps its time (engine.runner.within_slices).
CLAIMED_WITHIN: dict[str, str] = {"optimizer": "small_batch", "compile": "small_batch", "gpu_memory": "small_batch"}
# Categories whose fixes shrink the step's own work rather than a wait: on a run without GPU activity, whose budget
# is the host's time (`host_budget`), they claim its floor, the host's own work, as well as the rest of the step (a
# CPU optimizer's per-tensor loop is the main thread's work; its fused kernel does less of it).
SHRINKS_THE_WORK = ("precision", "optimizer", "compile")


# The slices in which the GPU idles (a blocking copy's slice also holds copies with no kernel beside them).
IDLE_SLICES = ("data_wait", "stall", "sync", "host", "unexplained")

# The slices the profiler's own cost is taken from, in order: CUPTI slows the host's CUDA calls, so the GPU idles
# longer while the host launches; then the other idle the host's pace decides.
PROFILER_COST_FROM = ("host", "unexplained", "sync", "copy")


@dataclass(frozen=True)
class Slice:
    name: str  # one of SLICES
    seconds: float  # mean per analysed step
    share: float  # of the mean step


@dataclass(frozen=True)
class Budget:
    """Where the run's step goes: the step at its pace split into slices (GPU computing, waiting for data, copies,
    syncs, host-side work, ...) that add up to it, each idle gap given to one cause (`run.budget`)."""

    step_s: float  # the run's step time (analysis.timebase.step_time)
    steps: int
    slices: tuple[Slice, ...]  # every slice of SLICES, in order, zero ones included
    # How much longer each profiled step ran, past its wait for data, than a step at the run's pace: the
    # profiler's own cost, left out of the slices (0 when the step is not timed outside the window).
    profiler_s: float = 0.0

    def seconds(self, name: str) -> float:
        return next(s.seconds for s in self.slices if s.name == name)

    @property
    def idle_share(self) -> float:
        """The share of the step the GPU idles (IDLE_SLICES)."""
        return sum(s.share for s in self.slices if s.name in IDLE_SLICES)

    def share_of(self, category: str) -> float:
        """The share of the step in the slices a finding of `category` claims (SLICES_OF_CATEGORY)."""
        names = SLICES_OF_CATEGORY.get(category, ())
        return sum(s.share for s in self.slices if s.name in names)


def step_splits(steps: Sequence[Step], gpu: GpuView | None, trace: TraceData | None) -> list[dict[str, float]] | None:
    """Each step that lies on the trace with GPU activity split into the slices, in seconds; None without GPU
    activity. The budget and the syncs' idle (`idle_in_syncs`) are both made of these: split once a run."""
    if gpu is None or trace is None:
        return None
    splitter = _Splitter(gpu, trace)
    return [splitter.split(step) for step in steps if step.gpu_busy_s is not None]


def step_budget(steps: Sequence[Step], splits: list[dict[str, float]] | None,
                steady_wait_share: float | None = None, step_s: float | None = None,
                outside_window: bool = False, sync_blocked_s: float | None = None,
                stall_share: float | None = None) -> Budget | None:
    """The budget of the steps that lie on the trace with GPU activity (their `splits`; None when there is none),
    with the data wait of every step after start-up (`steady_wait_share`) and in seconds of `step_s` when given;
    when `step_s` was timed on the steps outside the profiling window (`outside_window`), without the profiler's
    own cost; with the share of every step after start-up that stalls took (`stall_share`); with the host's time
    blocked in synchronizing calls per step (`sync_blocked_s`), the drain they leave counted as theirs."""
    if splits is None:
        return None
    placed = [s for s in steps if s.gpu_busy_s is not None]
    mean_step = statistics.fmean(s.wall_s for s in placed) if placed else 0.0
    if mean_step <= 0:
        return None
    per_step = splits
    shares = {name: statistics.fmean(split.get(name, 0.0) for split in per_step) / mean_step for name in SLICES}
    if steady_wait_share is not None:
        shares = _with_wait_share(shares, steady_wait_share)
    step = step_s or mean_step
    profiler_s = 0.0
    if outside_window and step < mean_step:
        shares, profiler_s = _without_profiler_cost(shares, mean_step, step)
    if stall_share:
        shares = _with_stall_share(shares, stall_share)
    if sync_blocked_s:
        shares = _with_drain_after_syncs(shares, sync_blocked_s / step)
    return Budget(step, len(placed), tuple(Slice(name, shares[name] * step, shares[name]) for name in SLICES),
                  profiler_s)


def host_budget(step_s: float, floor_s: float | None, steps: int, stall_share: float = 0.0) -> Budget:
    """The budget of a run without GPU activity, for sharing out savings: the host's own work (`floor_s`, in
    `gpu_busy`: the part of the step no fix of a wait removes), and the rest of the step (`host`: the waits for
    data and for a core, computing slowed by what the findings name, the stalls' excess), which the findings
    share. A save's CPU time is the main thread's, yet saving less often removes it: the stalls' excess
    (`stall_share`) leaves the floor."""
    floor = min(1.0, max(0.0, (floor_s or 0.0) / step_s - max(0.0, stall_share)))
    shares = dict.fromkeys(SLICES, 0.0) | {"gpu_busy": floor, "host": 1.0 - floor}
    return Budget(step_s, steps, tuple(Slice(name, shares[name] * step_s, shares[name]) for name in SLICES))


def idle_in_syncs(splits: list[dict[str, float]]) -> float:
    """GPU idle summed over the steps split, past each step's data wait, that a synchronizing call overlaps: the
    budget's `sync` slice before the drain after the calls is added to it (`_with_drain_after_syncs`)."""
    return sum(split.get("sync", 0.0) for split in splits)


def _with_wait_share(shares: dict[str, float], wait: float) -> dict[str, float]:
    """The window's shares with the data wait set to `wait`, the other slices scaled to fill the rest."""
    rest = 1.0 - shares["data_wait"]
    if rest <= 0:  # the window only waited: nothing to scale
        return shares
    scale = (1.0 - wait) / rest
    return {name: wait if name == "data_wait" else share * scale for name, share in shares.items()}


def _with_stall_share(shares: dict[str, float], stall: float) -> dict[str, float]:
    """The shares with `stall` given to the stalls, out of what the data wait leaves, the slices other than the
    wait scaled to fill the rest."""
    wait = shares["data_wait"]
    stall = min(stall, 1.0 - wait)
    rest = sum(share for name, share in shares.items() if name not in ("data_wait", "stall"))
    if rest <= 0:
        return shares
    scale = (1.0 - wait - stall) / rest
    return {name: share if name == "data_wait" else stall if name == "stall" else share * scale
            for name, share in shares.items()}


def _with_drain_after_syncs(shares: dict[str, float], blocked: float) -> dict[str, float]:
    """The shares with the host-side idle a sync's drain leaves moved into `sync`: of `host`, then `unexplained`,
    as much as the host's time blocked in the calls (`blocked`, a share of the step) exceeds the gaps the calls
    overlap. amp_scaler_bad (GradScaler's .item() every step, H100): gaps overlapping the call 5% of the step,
    the host blocked 20%, host-side gaps 16%: 20% is the syncs'. Its twin without the read (a fused optimizer)
    ran 15% faster over 20 plain runs in four sessions; the three recordings' own estimates were 15%, 14% and
    20%."""
    move = max(0.0, blocked - shares["sync"])
    out = dict(shares)
    for name in ("host", "unexplained"):
        take = min(move, out[name])
        out[name] -= take
        out["sync"] += take
        move -= take
    return out


def _without_profiler_cost(shares: dict[str, float], profiled_s: float,
                           step_s: float) -> tuple[dict[str, float], float]:
    """The shares of a step at the run's pace (`step_s`) from those of the longer profiled step (`profiled_s`), and
    the seconds of each profiled step taken out as the profiler's own: the excess past the data wait, out of the
    slices of PROFILER_COST_FROM in order; what is left of the other slices is scaled to fill the step."""
    wait = shares["data_wait"]
    seconds = {name: share * profiled_s for name, share in shares.items()}
    excess = (1.0 - wait) * (profiled_s - step_s)
    taken = 0.0
    for name in PROFILER_COST_FROM:
        take = min(excess - taken, seconds[name])
        seconds[name] -= take
        taken += take
    if sum(seconds.values()) - seconds["data_wait"] <= 0:
        return shares, 0.0
    total = sum(seconds.values())
    return _with_wait_share({name: value / total for name, value in seconds.items()}, wait), taken


class _Splitter:
    def __init__(self, gpu: GpuView, trace: TraceData) -> None:
        self.gpu, self.detail = gpu, trace.detail
        self.collectives = collective_spans(trace)
        self.blocking = _spans(r for r in trace.runtime if r.name in SYNC_CALLS)
        self.copies = _spans(r for r in trace.runtime if r.name == "cudaMemcpy")
        self.runtime_starts = sorted(r.start for r in trace.runtime)

    def split(self, step: Step) -> dict[str, float]:
        start, end = step.start, step.end
        busy = step.gpu_busy_s or 0.0
        collective = min(busy, self.collectives.covered(start, end) if self.collectives is not None else 0.0)
        copying = min(busy - collective, self.gpu.exposed_copy_s(start, end))  # on the critical path
        parts = {"gpu_busy": busy - collective - copying, "collective": collective, "copy": copying}
        data_end = start + step.data_wait_s
        for gap_start, gap_end in self.gpu.idle_gaps(start, end):
            waited = max(0.0, min(gap_end, data_end) - gap_start)
            _add(parts, "data_wait", waited)
            rest_start = gap_start + waited
            if rest_start >= gap_end:
                continue
            _add(parts, self._cause(rest_start, gap_end), gap_end - rest_start)
        return parts

    def _cause(self, lo: float, hi: float) -> str:
        if self.blocking.overlaps(lo, hi):  # a call overlapping the gap
            return "sync"
        if self.copies.overlaps(lo, hi):
            return "copy"
        if not self.detail:
            return "host"
        launched = bisect_left(self.runtime_starts, hi) > bisect_left(self.runtime_starts, lo)
        return "host" if launched else "unexplained"


def _spans(calls: Iterable[HostSpan]) -> intervals.Disjoint:
    """The union of host calls, as intervals."""
    pairs = sorted((c.start, c.end) for c in calls)
    return intervals.union_of([p[0] for p in pairs], [p[1] for p in pairs])


def _add(parts: dict[str, float], name: str, seconds: float) -> None:
    parts[name] = parts.get(name, 0.0) + seconds
