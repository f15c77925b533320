"""GD6xx: a job's ranks (torchrun's, Lightning's, mp.spawn's, accelerate's), together: one holds the others back."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import dataclass

from gpudoctor import Finding, Job, NotEvaluated, RankFigures, RankRun, rule
from gpudoctor.analysis.views import Location
from gpudoctor.job import job_after_fix, straggling, taking_turns

# A data wait explains the straggling when the slow rank waits for data at least this share of what the others
# wait for it: the rest of the difference is then within what one more finding could name.
DATA_CAUSE_SHARE = 0.5


@dataclass(frozen=True)
class Cause:
    """What the slow rank does that the others do not, as far as its own figures and findings tell."""

    said: str  # "its input pipeline: it waits 11.2 ms a step for data, the others 0.1 ms"
    fix: str
    location: Location | None
    code: str | None  # the slow rank's own finding that names the cause, if any
    extra_s: float  # what the slow rank spends on it a step, beyond the others: its fix takes that off its step


@rule("GD601", "straggler", category="straggler", scope="job")
def straggler(job: Job, min_wait_share: float = 0.2, min_wait_ms: float = 1.5, min_consistency: float = 0.85,
              critical_wait_share: float = 0.5) -> Iterator[Finding]:
    """One rank holds back the others: they wait for it in every collective.

    What it detects: the ranks of a job (DDP, FSDP, whatever launched it) meet in a collective every step (the
    gradients' all-reduce). A rank that reaches it late, because its loader, its host or its GPU is slower, makes
    every other rank wait: their NCCL kernels (or gloo's collectives) last longer than its own by the time they
    wait. The rule names the rank that spends the least time in collectives in at least `min_consistency` of the
    steps while the others wait at least `min_wait_share` of the step (and `min_wait_ms`) for it, and says what the
    slow rank does differently: its data wait, or its own largest finding. Where no rank is last that often, but the
    ranks wait for each other in turns (at least `min_wait_share` of the profiled step, and `min_wait_ms`) and the
    rank that is last waited longer for its data than the others in at least half the steps, the rule says so: their
    loaders deliver late in turns (whatever launched the job: torchrun, mp.spawn, Lightning or accelerate), and the
    ranks' own input-pipeline findings hold the cost.

    Why it matters: the whole job runs at the slowest rank's speed. Every other GPU idles while it waits, so the
    cost is paid once per rank: one slow loader on rank 1 of 8 idles 7 GPUs.

    Fix: give the slow rank what the others have (the same DataLoader workers and pinning, no extra logging or
    `.item()` calls on rank 0 only, the same GPU model and clocks, its own cores), then profile again. The finding
    on that rank names the line.

    Impact: the job's step after the fix (gpudoctor.job.straggling), as a share of its step at the run's pace (the
    slowest rank's): the slow rank's step without its cause (its extra data wait, or GPU work, or the others'
    wait), but not shorter than the others' own limits, which the wait hid: their steps without the wait, their
    GPU's work, and what their loaders' workers can feed (their CPU per batch over the workers with a core of
    their own), which the slow rank, given the same loader settings, is held to as well. The rule fires when that
    saving is at least `min_wait_share` of the step: with ranks whose hosts run ahead of their GPUs, the wait in
    the profiled steps alone can read larger than the job's step will shrink (balanced ranks on two H200s waited
    4.4-5.2 ms of 7.2-7.4 ms profiled steps for each other, in 14.3 ms steps their loaders could feed no faster
    than 12.6 ms). Where the slow rank's own finding explains that wait, its saving is counted here once, not
    again on that rank.
    """
    if job.missing_ranks:
        yield from _waiting_elsewhere(job, min_wait_share, min_wait_ms)
        return
    found = straggling(job)
    wait_s, step_s, slow, others = found.wait_s, found.step_s, found.slow, found.others
    pace = job.pace_s
    if found.consistency < min_consistency:
        yield from _in_turns(job, min_wait_share, min_wait_ms)
        return
    if not step_s or not pace or wait_s * 1e3 < min_wait_ms:
        return
    cause = straggler_cause(slow, others, wait_s)
    after = job_after_fix(found, pace, cause.extra_s)
    share = min(1.0, max(0.0, 1 - after.step_s / pace))
    if share < min_wait_share:
        return
    waiting = ", ".join(str(f.rank) for f in others)
    yield Finding(
        title=(f"Rank {slow.rank} holds back the others: rank{'s' if len(others) > 1 else ''} {waiting} "
               f"wait{'' if len(others) > 1 else 's'} for it in every collective"),
        impact=share,
        severity="critical" if share >= critical_wait_share else None,
        location=cause.location,
        evidence={
            "slow rank": slow.rank,
            "the job's step": (round(pace * 1e3, 2), "ms"),
            "the others' wait per profiled step": (round(wait_s * 1e3, 2), "ms"),
            "the others' profiled step": (round(step_s * 1e3, 2), "ms"),
            f"steps where rank {slow.rank} arrived last": f"{found.slow_steps} of {found.steps}",
            f"rank {slow.rank}'s profiled step": (_ms(slow.figures.median_step_s), "ms"),
            f"rank {slow.rank} data wait per profiled step": (_ms(slow.figures.data_wait_s), "ms"),
            "the others' data wait per profiled step": (_ms(_median_of(f.data_wait_s for f in others)), "ms"),
            "cause": cause.said,
            "the job's step after the fix": (round(after.step_s * 1e3, 2), "ms"),
            "then limited by": after.limited_by,
        },
        fix=cause.fix,
    )


def missing_text(job: Job) -> str:
    """'ranks 2-3 of 4 are not in this run directory'."""
    missing = job.missing_ranks
    names = ", ".join(str(r) for r in missing) if len(missing) < 4 else f"{missing[0]}-{missing[-1]}"
    world = len(missing) + len(job.ranks)
    return f"rank{'s' if len(missing) > 1 else ''} {names} of {world} {'are' if len(missing) > 1 else 'is'} not here"


MERGE_FIX = ("merge every node's run directory into the job's report: `gpudoctor analyze RUN_NODE0 RUN_NODE1 ...` "
             "(one shared --out on every node writes it by itself); the straggler and its cause are named there")


def _waiting_elsewhere(job: Job, min_wait_share: float, min_wait_ms: float) -> Iterator[Finding]:
    """Some of the job's ranks are not in these directories (another node's), and every rank here spends much of
    its step in collectives: the rank they wait for may be one of those, which no rank here shows."""
    measured = [r.figures for r in job.ranks if r.figures.collective_s is not None and r.figures.median_step_s]
    if not measured:
        return
    least = min(measured, key=lambda f: f.collective_s or 0.0)
    waited, step = least.collective_s or 0.0, least.median_step_s or 0.0
    if waited < min_wait_share * step or waited * 1e3 < min_wait_ms:
        return
    yield Finding(
        title=(f"Every rank here spends at least {waited * 1e3:.1f} ms of its {step * 1e3:.1f} ms step in collectives, "
               f"and {missing_text(job)}: the rank they wait for may be on another node"),
        impact=None,
        impact_reason="sized once every node's ranks are merged: a wait and slow communication read alike on one "
                      "node's ranks",
        evidence={"in collectives per step, the least of the ranks here": (_ms(waited), "ms"),
                  "its profiled step": (_ms(step), "ms"), "measured on rank": least.rank,
                  "ranks here": ", ".join(str(r.rank) for r in job.ranks),
                  "ranks elsewhere": ", ".join(str(r) for r in job.missing_ranks)},
        fix=MERGE_FIX,
    )


# Ranks that wait for each other in turns are named when their loaders explain the wait in at least this share of
# the steps: ranks whose hosts run ahead of their GPUs also wait for each other in the profiled steps, with no
# data wait behind it (balanced twins on two H200s: 4.4-5.2 ms of 7.2-7.4 ms profiled steps).
TURNS_EXPLAINED = 0.5


def _in_turns(job: Job, min_wait_share: float, min_wait_ms: float) -> Iterator[Finding]:
    """No one rank is last: the ranks wait for each other in turns, as their loaders deliver late in turns (both
    of pytorch/examples' ImageNet ranks under mp.spawn, -j 4 on two GPUs: rank 0 waited 243 ms a step)."""
    turns = taking_turns(job)
    if (not turns.step_s or turns.wait_s < min_wait_share * turns.step_s or turns.wait_s * 1e3 < min_wait_ms
            or turns.explained < TURNS_EXPLAINED * turns.steps):
        return
    late = sorted(turns.late.items(), key=lambda item: (-item[1], item[0]))
    ranks = [str(rank) for rank in sorted(turns.late)]
    names = f"{', '.join(ranks[:-1])} and {ranks[-1]}"
    who = ", ".join(f"rank {rank} in {count}" for rank, count in late)
    first = job.rank(late[0][0])
    loader = first.run.sites.loader.main
    yield Finding(
        title=(f"Ranks {names} wait for each other in turns: {turns.wait_s * 1e3:.1f} ms of each "
               f"{turns.step_s * 1e3:.1f} ms profiled step, the last to arrive changing from step to step"),
        impact=None,
        impact_reason="the ranks' own input-pipeline findings count this time: each one's loader makes the others "
                      "wait in its turn",
        location=loader.location if loader is not None else None,
        evidence={
            "the others' wait per profiled step": (round(turns.wait_s * 1e3, 2), "ms"),
            "profiled step": (round(turns.step_s * 1e3, 2), "ms"),
            "last to arrive": f"{who} of {turns.steps} steps",
            "steps whose last rank waited longer for data": f"{turns.explained} of {turns.steps}",
            "data wait per profiled step": (round(turns.data_wait_s * 1e3, 2), "ms"),
        },
        fix=("make every rank's loader keep up (the input-pipeline finding on each rank names the line and the "
             "workers); no rank is then late, and none waits for another"),
    )


def straggler_cause(slow: RankRun, others: list[RankFigures], wait_s: float) -> Cause:
    """Why `slow` is late: its data wait, or its GPU's compute, when that explains at least half the others' wait;
    else its own largest finding."""
    extra_wait = (slow.figures.data_wait_s or 0.0) - (_median_of(f.data_wait_s for f in others) or 0.0)
    loader = slow.run.sites.loader.main
    if extra_wait >= DATA_CAUSE_SHARE * wait_s:
        workers = f" ({loader.num_workers} workers)" if loader is not None else ""
        said = (f"its input pipeline{workers}: it waits {_ms(slow.figures.data_wait_s)} ms a step for data, the "
                f"others {_ms(_median_of(f.data_wait_s for f in others))} ms")
        own = next((f for f in slow.findings if f.category in ("data_starvation", "cpu_oversubscription")), None)
        fix = (f"load rank {slow.rank}'s data as fast as the others': the same DataLoader settings (num_workers, "
               "pin_memory, persistent_workers) and the same per-sample work on every rank")
        return Cause(said, fix + (f"; {own.code} on rank {slow.rank} names the line." if own else "."),
                     loader.location if loader is not None else _location(own), own.code if own else None,
                     extra_wait)
    extra_compute = (slow.figures.gpu_compute_s or 0.0) - (_median_of(f.gpu_compute_s for f in others) or 0.0)
    if extra_compute >= DATA_CAUSE_SHARE * wait_s:
        said = (f"its GPU: it computes {_ms(slow.figures.gpu_compute_s)} ms a step, the others "
                f"{_ms(_median_of(f.gpu_compute_s for f in others))} ms")
        return Cause(said, f"find why rank {slow.rank}'s GPU is slower: a different or throttled GPU (nvidia-smi -q -d "
                           "CLOCK,PERFORMANCE), more work on this rank (uneven batches or sequence lengths), or a "
                           "neighbour on the same GPU.", None, None, extra_compute)
    host = _host_cause(slow, others, wait_s)
    if host is not None:
        return host
    line = _line_cause(slow, others, wait_s)
    if line is not None:
        return line
    named = _own_cause(slow, wait_s)
    if named is not None:
        return named
    return Cause("not found in its data wait or its own findings (compare its host, GPU and code path with "
                 "the others')",
                 f"find what rank {slow.rank} does that the others do not: rank-specific work (logging, evaluation, "
                 "checkpointing on one rank), a slower GPU or host, or uneven inputs.", None, None, wait_s)


def _host_cause(slow: RankRun, others: list[RankFigures], wait_s: float) -> Cause | None:
    """The slow rank's host: its main thread waits for a core (other programs, or its own threads, take them) more
    than the others' by at least half their wait."""
    mine, theirs = slow.figures.run_delay_share, _median_of(f.run_delay_share for f in others)
    step = slow.figures.median_step_s
    if mine is None or step is None:
        return None
    extra = (mine - (theirs or 0.0)) * step
    if extra < DATA_CAUSE_SHARE * wait_s:
        return None
    where = f" on {slow.figures.host}" if slow.figures.host else ""
    said = (f"its host{where}: its main thread waits for a core {mine:.0%} of the time, the others' "
            f"{(theirs or 0.0):.0%}")
    return Cause(said, f"give rank {slow.rank}'s host its cores back: stop or move the other programs there (GD504 on "
                       "that rank names them), or pin each rank to cores of its own", None, None, extra)


def _line_cause(slow: RankRun, others: list[RankFigures], wait_s: float) -> Cause | None:
    """A line of the script the slow rank's main thread spends longer at than the others', by at least half their
    wait (a sleep, a log, a rank-specific branch), from the host samples of each rank's detail steps."""
    step = slow.figures.median_step_s
    if step is None or not slow.figures.host_lines:
        return None
    function = {(w.file, w.line): w.function for w, _ in slow.run.sites.host_lines}
    theirs: dict[tuple[str, int], list[float]] = {}
    for figures in others:
        seen = {(file, line): share for file, line, share in figures.host_lines}
        for file, line, _ in slow.figures.host_lines:
            theirs.setdefault((file, line), []).append(seen.get((file, line), 0.0))
    best = max(slow.figures.host_lines, key=lambda item: item[2] - statistics.median(theirs[(item[0], item[1])]))
    file, line, share = best
    other_share = statistics.median(theirs[(file, line)])
    extra = (share - other_share) * step
    if extra < DATA_CAUSE_SHARE * wait_s:
        return None
    said = (f"a line of the script: rank {slow.rank} spends {share * step * 1e3:.1f} ms a step at {file}:{line}, "
            f"the others {other_share * step * 1e3:.1f} ms")
    return Cause(said, f"see what {file}:{line} does on rank {slow.rank} that it does not on the others (rank-specific "
                       "logging, evaluation, a sleep, uneven work), and make it as quick there, or move it off the "
                       "step", Location(file, line, function.get((file, line)) or ""), None, extra)


def _own_cause(slow: RankRun, wait_s: float) -> Cause | None:
    """The slow rank's own largest finding, where its saving would take at least half the others' wait off its
    step: a finding whose saving is smaller explains none of the lateness, whatever its size elsewhere."""
    for own in slow.findings:
        if own.severity == "info" or not own.impact or own.saving_s is None:
            continue
        if own.saving_s >= DATA_CAUSE_SHARE * wait_s:
            return Cause(f"its own largest problem: {own.code}, {own.title}",
                         f"fix {own.code} on rank {slow.rank} ({own.fix.rstrip('.')}), the cost of every rank's "
                         "wait.", _location(own), own.code, min(wait_s, own.saving_s))
    return None


def _location(finding: object) -> Location | None:
    where = getattr(finding, "location", None)
    return None if where is None else Location(where.file, where.line, where.function)


def _median_of(values: Iterator[float | None] | list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 2)


@rule("GD602", "communication-exposed", category="communication", scope="job")
def communication_exposed(job: Job, min_accumulation_share: float = 0.15, min_exposed_share: float = 0.3,
                          min_exposed_ms: float = 1.0) -> Iterator[Finding]:
    """The ranks' collectives sit on the step's critical path: nothing computes while they run.

    What it detects: the time in collectives (NCCL kernels; gloo's collectives on the CPU) while no compute
    ran beside them, per step, on the rank with the least of it (the others add their wait for it, which is
    GD601's). With gradient accumulation (several `backward()` calls per optimizer step) it looks at the
    all-reduces that start before the step's last `backward()`: DDP all-reduces every micro-batch's gradients
    unless the first ones run under `model.no_sync()`, and those all-reduces are wasted (at least
    `min_accumulation_share` of the step). Otherwise it reports communication exposed after the backward pass
    (at least `min_exposed_share` of the step, and `min_exposed_ms`).

    Why it matters: DDP overlaps each bucket's all-reduce with the rest of the backward pass; what it cannot
    overlap (the last bucket, a model whose gradients are large for its compute, all-reduces of gradients that
    are accumulated anyway) adds to every step on every rank.

    Fix: with gradient accumulation, run all micro-batches but the last under `with model.no_sync():`. Otherwise:
    `DistributedDataParallel(..., gradient_as_bucket_view=True)`, a `bucket_cap_mb` that lets more buckets
    overlap the backward pass, compressed gradients (`model.register_comm_hook(None, default_hooks.
    fp16_compress_hook)`), or more work per step (a larger batch per rank).

    Impact: with accumulation, the all-reduce time before the last `backward()`, overlapped or not: `no_sync()`
    removes those all-reduces whole, and one that overlaps compute still takes the cores (gloo) or the SMs and
    memory bandwidth (NCCL) the compute needs. Otherwise half the exposed time: fp16 compression halves the bytes
    each all-reduce moves, and better overlap can save at most all of it.
    """
    measured = [r.figures for r in job.ranks if r.figures.exposed_s is not None]
    if len(measured) < 2:
        raise NotEvaluated("fewer than two ranks show collectives in their traces")
    least = min(measured, key=lambda f: f.exposed_s or 0.0)
    step_s = job.step_s
    if not step_s:
        return
    exposed, early = least.exposed_s or 0.0, least.exposed_before_last_backward_s or 0.0
    removable = max(early, least.collective_before_last_backward_s or 0.0)  # what no_sync() takes out whole
    evidence: dict[str, object] = {
        "exposed communication per step": (_ms(exposed), "ms"), "median step": (_ms(step_s), "ms"),
        "in collectives per step": (_ms(least.collective_s), "ms"), "backward() calls per step": least.backwards,
        "measured on rank": least.rank,
    }
    if least.backwards > 1 and early >= max(min_accumulation_share * step_s, min_exposed_ms / 1e3):
        yield Finding(
            title=(f"Gradients are all-reduced at each of the {least.backwards} backward() calls of a step, though "
                   f"only the last one's are used: {removable * 1e3:.1f} ms of each {step_s * 1e3:.1f} ms step"),
            impact=min(1.0, removable / step_s), location=_backward_location(job),
            evidence={**evidence, "exposed before the last backward() per step": (_ms(early), "ms"),
                      "all-reduce before the last backward() per step": (_ms(removable), "ms")},
            fix=(f"run the first {least.backwards - 1} micro-batches of each step under `with model.no_sync():` "
                 "so that only the last backward() all-reduces"),
        )
        return
    own_step = least.median_step_s or step_s
    exposed = min(exposed, own_step)  # medians of two quantities of the same steps: never more than the step
    if exposed >= min_exposed_share * own_step and exposed * 1e3 >= min_exposed_ms:
        elsewhere = job.missing_ranks
        yield Finding(
            title=(f"Communication is exposed for {exposed * 1e3:.1f} ms of each {own_step * 1e3:.1f} ms step: "
                   "nothing computes while the ranks all-reduce"
                   + (f" (or they wait for a rank elsewhere: {missing_text(job)})" if elsewhere else "")),
            impact=None if elsewhere else min(1.0, exposed / 2 / step_s),
            impact_reason=("sized once every node's ranks are merged: their wait for a rank elsewhere reads as "
                           "exposed communication here" if elsewhere else None),
            evidence=evidence,
            fix=(f"{MERGE_FIX}; then, if it is communication, " if elsewhere else "")
            + ("DistributedDataParallel(..., gradient_as_bucket_view=True) and a bucket_cap_mb that overlaps more "
               "of the backward pass; or model.register_comm_hook(None, default_hooks.fp16_compress_hook); or more "
               "work per step (a larger batch per rank)"),
        )


def _backward_location(job: Job) -> Location | None:
    """Where the training loop calls backward(), as the first rank that saw it recorded."""
    return next((r.run.sites.backward_location for r in job.ranks if r.run.sites.backward_location is not None), None)
