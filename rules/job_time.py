"""GD7xx: the job's time outside its steady steps: steps that stall every N steps, and the start-up."""

from __future__ import annotations

from collections.abc import Iterator

from gpudoctor import Finding, LoaderRemedy, NotEvaluated, Remedy, Run, rule
from gpudoctor.analysis import PHASE_NAMES, LoaderInfo, Location, Stall, Stalls, Startup, paced_steps

UNKNOWN_STALLS = 4  # stalls of no known cause are told of when at least this many come every N steps
CAUSE_NAMES = {"save": "torch.save", "checkpoint": "a checkpoint", "gc": "garbage collection",
               "eval": "an evaluation", "unknown": "a cause gpudoctor does not watch"}
STALL_FIXES = {
    "save": "save less often, or in the background: torch.distributed.checkpoint.async_save(state_dict, "
            "checkpoint_id=...) (Lightning: Trainer(plugins=[AsyncCheckpointIO()])), so that the step goes on "
            "while the checkpoint is written",
    "checkpoint": "save less often, or with torch.distributed.checkpoint.async_save",
    "gc": "gc.freeze() once set-up is done (what was made before it is never scanned again), or gc.disable() in "
          "the loop with gc.collect() every N steps at a moment of your choosing",
    "eval": "evaluate less often or on fewer batches (Lightning: val_check_interval, limit_val_batches)",
    "unknown": "find what the script does on those steps (logging, a metric, a file written): do it less often, "
               "or in the background",
}


@rule("GD701", "periodic-stall", category="periodic_stall")
def periodic_stall(run: Run, min_share: float = 0.05, min_stalls: int = 2) -> Iterator[Finding]:
    """Some steps stall, every N steps: a checkpoint written, an evaluation, a garbage collection.

    What it detects: at least `min_stalls` steps after start-up that take over three times the usual step (the
    median step outside the profiled ones) and whose excess is not a wait for data, costing together at least
    `min_share` of the steps' time; each given to what held it up (collect.pauses): a `torch.save` (the line
    that calls it), the model put in eval mode for an evaluation (the line that does), a garbage collection,
    or, when none of those took the time, a cause gpudoctor does not watch (logging, a metric, a file: told of
    when at least four come every N steps). Steps in which a DataLoader starts its workers (an epoch's start)
    are GD702's.

    Why it matters: a profiler window of a few steps between two checkpoints sees none of it, yet a model and
    its Adam state written with torch.save every 10 steps can take more of the job than the steps themselves:
    the state is copied to the host and written before the next step can launch.

    Example: `torch.save({"model": net.state_dict(), "optimizer": optimizer.state_dict()}, path)` every 10
    steps, 1.2 GB each time.

    Fix: save (or evaluate) less often, or in the background: `torch.distributed.checkpoint.async_save`, or
    Lightning's `AsyncCheckpointIO`; for garbage collection, `gc.freeze()` after set-up.

    Where Python threads take turns on the GIL, a step of no known cause that runs long has waited for it: that
    is GD501's time, and no stall is told of.

    Impact: the stalled steps' excess over the usual step, as a share of the steps' time after start-up: the
    budget's `stall` slice. Stalls rarer than one step in fifty and over 20 times the usual step are left out of
    the run's pace (analysis.timebase), and then out of the impact: the finding gives their share of the steps'
    time, not a saving of each step.
    """
    run.require_steps()
    found = run.job_time.stalls
    if found is None:
        raise NotEvaluated("too few steps after start-up to tell a stall from a step")
    paced = {s.index for s in paced_steps(run.step_view)}
    threads = (run.host.python_threads_sharing or len([t for t in run.host.user_threads if not t.daemon])) > 1
    for stall in found.stalls:
        in_pace = bool(paced & set(stall.steps))
        # A rare stall the pace leaves out is no saving of each step: it costs its share of the job's time.
        share = found.share(stall) if in_pace else found.job_share(stall)
        if stall.cause == "unknown" and (stall.every is None or len(stall.steps) < UNKNOWN_STALLS or threads):
            # slow steps now and then with nothing seen in them: no cause to name, no period to show; or, where
            # Python threads take turns on the GIL, the steps that waited longest for it (GD501's time)
            continue
        if len(stall.steps) >= min_stalls and share >= min_share:
            yield _stall_finding(stall, found, share, in_pace)


def _stall_finding(stall: Stall, found: Stalls, share: float, in_pace: bool) -> Finding:
    count, excess_ms = len(stall.steps), stall.excess_s / len(stall.steps) * 1e3
    cause_ms = stall.cause_s / count * 1e3
    when = f"Every {_ordinal(stall.every)} step" if stall.every else f"{count} of {found.steps} steps"
    of = "the steps' time" if in_pace else "the job's time"
    tail = found.tail_s(stall)
    evidence: dict[str, object] = {
        "stalled steps": count, "every": stall.every, "usual step": (round(found.usual_s * 1e3, 2), "ms"),
        "excess per stall": (round(excess_ms, 1), "ms"),
        f"time in {CAUSE_NAMES[stall.cause]} per stall": (round(cause_ms, 1), "ms") if stall.cause_s else None}
    for part in stall.parts if len(stall.parts) > 1 else ():
        at = f" at {part.location.file.rsplit('/', 1)[-1]}:{part.location.line}" if part.location else ""
        evidence[f"{CAUSE_NAMES[part.cause]}{at}, per stall"] = (round(part.seconds / count * 1e3, 1), "ms")
    if tail:
        evidence["once more after the last step"] = (round(tail * 1e3, 1), "ms")
    evidence["first stalled steps"] = ", ".join(map(str, stall.steps[:6]))
    if not in_pace:
        evidence["share of the job's time"] = (round(share * 100, 1), "%")
    return Finding(
        f"{when} stalls {excess_ms:.0f} ms{_what_ran(stall)}: {share:.0%} of {of}",
        impact=share if in_pace else None,
        impact_reason=None if in_pace else "the stalls are rarer than one step in fifty, and the step at the run's "
        f"pace leaves them out: they cost {share:.0%} of the job's time, not of each step",
        location=stall.location, severity="critical" if share >= 0.3 else None, count=count,
        evidence=evidence, fix=_stall_fix(stall),
    )


def _what_ran(stall: Stall) -> str:
    """'in torch.save'; ': an evaluation 500 ms, then torch.save 300 ms' (each per stall) where more than one thing
    ran in the stalls."""
    parts = [part for part in stall.parts if part.seconds > 0]
    if len(parts) < 2:
        return f" in {CAUSE_NAMES[stall.cause]}"
    count = len(stall.steps)
    return ": " + ", then ".join(f"{CAUSE_NAMES[part.cause]} {part.seconds / count * 1e3:.0f} ms" for part in parts)


def _stall_fix(stall: Stall) -> str:
    """The fix of what ran in the stall, each part's where there are several."""
    causes = list(dict.fromkeys(part.cause for part in stall.parts if part.seconds > 0)) or [stall.cause]
    return "; ".join(STALL_FIXES[cause] for cause in causes)


@rule("GD702", "slow-startup", category="startup")
def slow_startup(run: Run, min_share: float = 0.2, dominates: float = 0.5,
                 min_fewer_workers_share: float = 0.05) -> Iterator[Finding]:
    """The job spends a large share of its time starting up: before its first step, and again at each epoch.

    What it detects: the time from the job's launch to the end of its first step, beyond one step at the run's
    pace, split into its causes (collect.startup): the interpreter's start, `import torch` and the script's
    other imports, CUDA's initialization, the loader workers' start and first batches, torch.compile, the first
    step's own start, and the script's own set-up (the lines its main thread was seen in: dataset indexing,
    model building, downloads); plus the DataLoader workers started again at each later epoch (a loader
    without persistent workers). It fires when what a change to the script shortens (its own set-up, the workers'
    starts, compilation) takes at least `min_share` of the job, or the epochs' worker starts at least `min_share` of
    the steps' time, or when a loader starts more than twice as many workers as the host has cores and one per
    core would save at least `min_fewer_workers_share` of the job; it is critical when start-up takes `dominates`
    of the job or more. Every job's fixed costs (the interpreter, imports, CUDA) count in the share it gives, not
    in what makes it fire: a short benchmark is not told to run longer.

    Why it matters: a short job, or one cut into many short epochs, can spend most of its time on work that is
    not training: 128 workers started anew at every epoch of 15 steps, each importing torch, take longer than
    the epoch's steps; a dataset indexed at every launch costs each job its minutes.

    Example: `DataLoader(dataset, batch_size=64, num_workers=128)` on a 32-core host, 10 epochs of 15 steps.

    Fix: what its largest cause needs: `persistent_workers=True` (workers started once) and as many workers as
    the cores allow; the set-up's result cached on disk (an index, a preprocessed dataset); compilation caches
    kept between jobs. `gpudoctor profile --try-fixes` tries persistent workers where the loader restarts them, and
    one worker per core where it starts too many, timing their start in the try's run beside its steps.

    Impact: the per-epoch worker starts, as a share of the steps' time after start-up: what persistent workers
    save every step. The start-up before the first step is paid once, so it is given as a share of the job, in
    the title and the evidence, not as a saving per step. Workers beyond the cores start in turn, each its own
    process: what one per core (less the training process's) saves is their starts in proportion
    (`FEWER_WORKERS_SAVE`). On an H200 of 16 cores, 128 workers started in 1.62 s and 16 in 0.31 s
    (oversubscribed_workers_bad and _fixed): 1.42 s predicted for 15 workers, 1.31 s measured for 16.
    """
    run.require_steps()
    found = run.job_time.startup
    if found is None:
        raise NotEvaluated("the start-up was not watched (a bundle recorded before gpudoctor watched it), or its "
                           "launch or first step is not known")
    steady = sum(s.wall_s for s in run.step_view.steady_steps)
    impact = min(1.0, found.restart_s / steady) if found.restarts and steady > 0 else None
    loader = run.sites.loader.main
    fewer = _fewer_workers_save(found, loader, run.host.env.cores)
    fewer_share = fewer / found.job_s if fewer is not None and found.job_s > 0 else 0.0
    if found.changeable_share < min_share and (impact or 0.0) < min_share and fewer_share < min_fewer_workers_share:
        return
    evidence = _startup_evidence(found)
    if fewer is not None and loader is not None:
        evidence[FEWER_WORKERS_SAVE] = (round(fewer, 2), "s")
        evidence["of the workers' starts (est.)"] = (round(fewer / _worker_starts(found) * 100), "%")
        evidence["of the job (est.)"] = (round(fewer_share * 100), "%")
    yield Finding(
        _startup_title(found, loader, run.host.env.cores),
        impact=impact,
        impact_reason=None if impact is not None else
        f"start-up is paid once, not at each step: {found.share:.0%} of this job",
        location=_startup_location(found, loader), severity="critical" if found.share >= dominates else None,
        evidence=evidence,
        fix=_startup_fix(run, found, loader, fewer),
        remedy=_startup_remedy(run, found, loader, fewer),
    )


# Workers this many times the cores start in turn; a few more than the cores start about as fast (each forks
# and waits for its first batch's samples more than it computes).
OVERSUBSCRIBED = 2
# The evidence of what one worker per core saves of the workers' starts (bench/validate_impacts.py reads its share).
FEWER_WORKERS_SAVE = "one worker per core saves (est.)"


def _worker_starts(found: Startup) -> float:
    """The seconds the loaders' workers took to start: before the first step and at each later epoch."""
    return found.phases.get("loader_workers", 0.0) + found.restart_s


def _fewer_workers_save(found: Startup, loader: LoaderInfo | None, cores: int | None) -> float | None:
    """What the workers' starts would take less with one worker per core, in seconds; None where the loader has
    no more workers than cores."""
    if loader is None or not cores or loader.num_workers <= OVERSUBSCRIBED * cores or _worker_starts(found) <= 0:
        return None
    return _worker_starts(found) * (1 - _workers(loader, cores) / loader.num_workers)


def _startup_title(found: Startup, loader: LoaderInfo | None, cores: int | None) -> str:
    largest = found.largest_changeable
    title = f"Start-up takes {found.share:.0%} of the job: {found.seconds:.1f} s before the first step ends"
    if largest == "loader_workers" and loader is not None and cores and loader.num_workers > cores:
        title += f", {found.phases[largest]:.1f} s of it starting {loader.num_workers} loader workers on {cores} cores"
    elif largest is not None and largest != "restarts":
        title += f", {found.phases[largest]:.1f} s of it in {PHASE_NAMES[largest]}"
    if found.restarts:
        workers = max(r.workers for r in found.restarts)
        title += f"; {len(found.restarts)} later epochs start {workers} workers again ({found.restart_s:.1f} s)"
    return title


def _startup_evidence(found: Startup) -> dict[str, object]:
    evidence: dict[str, object] = {"job": (round(found.job_s, 2), "s"), "start-up": (round(found.seconds, 2), "s"),
                                   "share of the job": (round(found.share * 100), "%")}
    for name, seconds in sorted(found.phases.items(), key=lambda item: -item[1]):
        if seconds >= 0.005:
            evidence[PHASE_NAMES[name]] = (round(seconds, 2), "s")
    if found.restarts:
        evidence["workers started again"] = len(found.restarts)
        evidence["their time"] = (round(found.restart_s, 2), "s")
    if found.lines:
        where, part = found.lines[0]
        evidence["set-up line seen most"] = f"{where} ({part:.0%} of the looks)"
    return evidence


def _startup_location(found: Startup, loader: LoaderInfo | None) -> Location | None:
    largest = found.largest_changeable
    if largest in ("restarts", "loader_workers") and loader is not None:
        return loader.location
    if largest == "setup" and found.lines:
        return found.lines[0][0]
    return None


def _startup_fix(run: Run, found: Startup, loader: LoaderInfo | None, fewer_s: float | None) -> str:
    parts = []
    cores = run.host.env.cores
    largest = found.largest_changeable
    if loader is not None and (found.restarts or largest == "loader_workers" or fewer_s is not None):
        workers = _workers(loader, cores)
        fewer = (f"no more workers than the {cores} cores" + (f" (~{fewer_s:.1f} s less, est.)" if fewer_s else "")
                 if cores and loader.num_workers > cores else "")
        once = found.restarts or (largest == "loader_workers" and not fewer)
        where = f" at {loader.built_at}" if loader.built_at else ""
        if once:
            parts.append(f"DataLoader(..., num_workers={workers}, persistent_workers=True){where}: its workers "
                         f"start once{', and ' + fewer if fewer else ''}")
        else:
            parts.append(f"DataLoader(..., num_workers={workers}){where}: {fewer}")
    if largest == "setup" and found.lines:
        parts.append(f"the set-up at {found.lines[0][0]} takes {found.phases['setup']:.1f} s: cache its result on "
                     "disk (an index, a preprocessed dataset) and load it")
    elif largest == "compile":
        parts.append("torch.compile's time is paid once per job: a job this short gains little from it; keep its "
                     "caches between jobs (torch.compiler.save_cache_artifacts) or train longer")
    return "; ".join(parts) or "run more steps per job: start-up is paid once"


def _startup_remedy(run: Run, found: Startup, loader: LoaderInfo | None, fewer_s: float | None) -> Remedy | None:
    """Persistent workers for a loader that starts them again at each epoch; one worker per core for one that
    starts too many (the try times their start: gpudoctor.trying)."""
    if loader is None:
        return None
    workers = _workers(loader, run.host.env.cores)
    if found.restarts and not loader.persistent_workers:
        return Remedy(loader=LoaderRemedy(at=loader.built_at, num_workers=workers, persistent_workers=True))
    if fewer_s is not None:
        return Remedy(loader=LoaderRemedy(at=loader.built_at, num_workers=workers))
    return None


def _workers(loader: LoaderInfo, cores: int | None) -> int:
    """The loader's workers, at most one per core but the training process's."""
    if not cores or cores < 2:
        return max(1, loader.num_workers)
    return max(1, min(loader.num_workers, cores - 1))


def _ordinal(n: int) -> str:
    """2nd, 3rd, 10th, 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
