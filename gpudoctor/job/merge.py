"""A torchrun job's diagnosis: every rank analysed once, on its own, then the job's rules over the ranks together.

The merged findings list the job's findings (a straggler first) and every rank's, one finding per cause: a finding
seen on several ranks is listed once with the ranks it was seen on, and a slow rank's finding whose time is the
others' wait is counted in the straggler's finding, not again. The reports, each rank's own and the job's, are
built from the diagnosis when they are written (gpudoctor.job.report).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import msgspec

from gpudoctor.analysis import Run
from gpudoctor.bundle.findings import FindingRecord
from gpudoctor.bundle.layout import ranks_linked_out
from gpudoctor.engine import EngineResult, PreparedRules, RunDiagnosis, diagnose_windows
from gpudoctor.engine.runner import evaluate_rules, rank, sized
from gpudoctor.engine.windows import across_windows
from gpudoctor.errors import BundleError
from gpudoctor.job.figures import rank_figures, with_waits
from gpudoctor.job.layout import job_bundles
from gpudoctor.job.model import Job, RankRun
from gpudoctor.job.parallel import analysis_processes, each_rank
from gpudoctor.report import build_report
from gpudoctor.report.document import NotMeasuredRow, Report


@dataclass(frozen=True)
class RankDiagnosis:
    rank: RankRun
    found: RunDiagnosis  # its own rules' findings, not-evaluated rows and errors, over its windows
    report: Report  # its own report, built where it was analysed; the job's waits are said in it when written
    # Of a rank profiled with --every, the rank seen through each of its windows, by window (the job's rules run
    # in each window every rank recorded); empty for a rank of one window.
    windows: Mapping[int, RankRun] = field(default_factory=dict)


@dataclass(frozen=True)
class JobDiagnosis:
    """What the rules found in a job: each rank's own diagnosis, the job rules' findings, and both merged."""

    job: Job
    ranks: list[RankDiagnosis]  # by rank, each with the job's figures (its wait for the others)
    job_result: EngineResult  # the job rules' own (scope "job")
    result: EngineResult  # the job's findings first, then every rank's, one per cause
    unreadable: list[NotMeasuredRow]  # the ranks whose bundle could not be read, and why

    @property
    def pace_s(self) -> float | None:
        return self.job.pace_s


def diagnose_job(paths: Sequence[Path], prepared: PreparedRules, processes: int | None = None) -> JobDiagnosis:
    """The diagnosis of the rank bundles in `paths` (one run directory per node), the ranks analysed in `processes`
    processes side by side (None: as many as gpudoctor.job.parallel says). A rank-K/ that is a link out of its run
    directory is not read: the report says so.

    Raises BundleError when no rank bundle can be read at all.
    """
    diagnosed: list[RankDiagnosis] = []
    unreadable = [_linked_out(link, path) for path in paths for link in ranks_linked_out(path)]
    bundles = job_bundles(paths)
    analysed = each_rank(bundles, partial(_diagnose_rank, prepared=prepared),
                         analysis_processes(bundles) if processes is None else processes)
    for number, found in analysed.items():
        if isinstance(found, str):  # the other ranks are still worth their report
            unreadable.append({"what": f"rank {number}", "reason": f"its bundle cannot be read: {found}"})
        else:
            diagnosed.append(found)
    if not diagnosed:
        raise BundleError(f"no rank bundle of {', '.join(map(str, paths))} can be read: "
                          + "; ".join(row["reason"] for row in unreadable))
    unreadable += _missing_ranks(diagnosed, paths)
    job = _with_waits(Job([d.rank for d in diagnosed]))
    result = _job_rules_over_windows(job, {d.rank.rank: d.windows for d in diagnosed}, prepared)
    merged = merged_findings(job, result, [d.found.result for d in diagnosed])
    ranks = [replace(d, rank=waiting) for d, waiting in zip(diagnosed, job.ranks)]
    return JobDiagnosis(job, ranks, result, merged, unreadable)


def _missing_ranks(diagnosed: list[RankDiagnosis], paths: Sequence[Path]) -> list[NotMeasuredRow]:
    """The job's ranks, as its launcher counted them, whose bundle is in none of `paths`: another node's, written
    into its own directory, or a rank that never wrote one."""
    worlds = [d.found.run.manifest.launch.world_size for d in diagnosed if d.found.run.manifest.launch is not None]
    if not worlds:
        return []
    found = {d.rank.rank for d in diagnosed}
    missing = sorted(set(range(max(worlds))) - found)
    if not missing:
        return []
    given = " ".join(str(p) for p in paths)
    return [{"what": f"rank{'s' if len(missing) > 1 else ''} {_ranges(missing)} of {max(worlds)}",
             "reason": f"no bundle of {'theirs' if len(missing) > 1 else 'its'} is in {given}: another node's, "
                       "written where that node ran, or a rank that never wrote one; `gpudoctor analyze "
                       f"{given} OTHER_NODE_DIR ...` merges every node's ranks into the job's report"}]


def _ranges(numbers: list[int]) -> str:
    """'0-3, 6' for [0, 1, 2, 3, 6]."""
    parts, start = [], numbers[0]
    for previous, number in zip(numbers, [*numbers[1:], None]):
        if number != previous + 1 if number is not None else True:
            parts.append(str(start) if start == previous else f"{start}-{previous}")
            start = number if number is not None else start
    return ", ".join(parts)


def _linked_out(link: Path, run_dir: Path) -> NotMeasuredRow:
    return {"what": link.name.replace("-", " "),
            "reason": f"it is a link to {os.path.realpath(link)}, outside the run directory {run_dir}: not read"}


def _diagnose_rank(number: int, bundle: Path, prepared: PreparedRules) -> RankDiagnosis | str:
    """The rank's diagnosis and its own report, or why its bundle cannot be read."""
    try:
        found = diagnose_windows(Run.from_bundle(bundle), prepared.rules, prepared.options, prepared.limits)
    except BundleError as exc:
        return str(exc)
    figures = rank_figures(number, found.run, os.fspath(bundle))
    report = build_report(found.run, found.result, prepared.docs, found.windows)
    findings = found.result.findings
    return RankDiagnosis(RankRun(number, found.run, figures, findings), found, report,
                         _in_windows(number, found.window_runs, os.fspath(bundle), findings))


def _with_waits(job: Job) -> Job:
    figures = with_waits([r.figures for r in job.ranks])
    return Job([replace(r, figures=f) for r, f in zip(job.ranks, figures)])


def _job_rules_over_windows(job: Job, windows: Mapping[int, Mapping[int, RankRun]],
                            prepared: PreparedRules) -> EngineResult:
    """The job's rules on the job as its reports show it; for a job profiled with --every, on the job in each
    window every rank recorded (`windows`: each rank's, by rank), as one result whose findings say the windows they
    fired in."""
    common = _common_windows(windows)
    if len(common) < 2:
        return run_job_rules(job, prepared)
    results = [(index, run_job_rules(_with_waits(Job([windows[r.rank][index] for r in job.ranks])), prepared))
               for index in common]
    return across_windows(results)


def _common_windows(windows: Mapping[int, Mapping[int, RankRun]]) -> list[int]:
    indices = [set(of_rank) for of_rank in windows.values()]
    return sorted(set.intersection(*indices)) if indices else []


def _in_windows(number: int, window_runs: Mapping[int, Run], bundle: str,
                findings: list[FindingRecord]) -> dict[int, RankRun]:
    """The rank seen through each of its profiling windows (the runs its rules read, each window's trace read once),
    by window; none for a run of one window."""
    return {index: RankRun(number, window, rank_figures(number, window, bundle), findings)
            for index, window in window_runs.items()}


def run_job_rules(job: Job, prepared: PreparedRules) -> EngineResult:
    """The job's rules (scope "job"), each in isolation as a run's rules are, their savings of the job's step."""
    found = evaluate_rules(job, [r for r in prepared.rules if r.scope == "job"], prepared.options, prepared.limits)
    return EngineResult(sized(found.findings, job.pace_s), found.not_evaluated, found.errors)


def merged_findings(job: Job, result: EngineResult, rank_results: Sequence[EngineResult]) -> EngineResult:
    """The job's findings first, then every rank's, one per cause (see the module's docstring); the rules not
    evaluated or failed on any rank, once each."""
    per_cause: dict[tuple[str, str | None, int | None], FindingRecord] = {}
    for rank_run in job.ranks:
        for record in rank_run.findings:
            loc = record.location
            key = (record.code, loc.file if loc else None, loc.line if loc else None)
            seen = per_cause.get(key)
            if seen is None:
                per_cause[key] = msgspec.structs.replace(record, ranks=[rank_run.rank])
                continue
            larger = record if (record.impact or 0.0) > (seen.impact or 0.0) else seen
            per_cause[key] = msgspec.structs.replace(larger, ranks=[*(seen.ranks or []), rank_run.rank])
    ranks_found = _one_claim_with_the_job(rank(list(per_cause.values())), result.findings)
    not_evaluated = {row.code: row for row in result.not_evaluated}
    errors = {(row.code, row.error): row for row in result.errors}
    for rank_result in rank_results:
        for row in rank_result.not_evaluated:
            not_evaluated.setdefault(row.code, row)
        for error in rank_result.errors:
            errors.setdefault((error.code, error.error), error)
    return EngineResult([*rank(result.findings), *ranks_found], list(not_evaluated.values()), list(errors.values()))


def _one_claim_with_the_job(records: list[FindingRecord], job_findings: list[FindingRecord]) -> list[FindingRecord]:
    """A slow rank's finding at the line a straggler finding points to is the same time: counted there."""
    claimed = {(f.location.file, f.location.line): f for f in job_findings  # a straggler's with a cost of its own
               if f.category == "straggler" and f.location is not None and f.impact is not None}
    out = []
    for record in records:
        loc = record.location
        holder = claimed.get((loc.file, loc.line)) if loc is not None else None
        if holder is None or record.impact is None:
            out.append(record)
            continue
        out.append(msgspec.structs.replace(
            record, impact=None, saving_s=None, counted_in=holder.code,
            impact_reason=f"counted in {holder.code}'s finding: this rank's delay is the others' wait"))
    return out
