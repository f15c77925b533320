"""A torchrun job's diagnosis: every rank analysed on its own, then the job's rules over the ranks together.

Each rank's bundle gets its own findings.json and report.html again (its own rules, its own steps); the merged
report lists the job's findings (a straggler first) and every rank's, one finding per cause: a finding seen on
several ranks is listed once with the ranks it was seen on, and a slow rank's finding whose time is the others'
wait is counted in the straggler's finding, not again.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import msgspec

from gpudoctor.analysis import Run
from gpudoctor.bundle.findings import FindingRecord
from gpudoctor.bundle.layout import ranks_linked_out
from gpudoctor.diagnose import PreparedRules, write_outputs
from gpudoctor.engine import EngineResult, diagnose_windows
from gpudoctor.engine.runner import evaluate_rules, rank, sized
from gpudoctor.errors import BundleError
from gpudoctor.job.figures import rank_figures, with_waits
from gpudoctor.job.layout import job_bundles
from gpudoctor.job.model import Job, RankRun
from gpudoctor.job.report import build_job_report, with_wait
from gpudoctor.report import build_report
from gpudoctor.report.document import NotMeasuredRow, Report


@dataclass(frozen=True)
class RankDiagnosis:
    rank: RankRun
    result: EngineResult  # its own rules' findings, not-evaluated rows and errors
    report: Report  # the rank's own report, before the job's wait is said in it


def diagnose_job(paths: Sequence[Path], prepared: PreparedRules, out_dir: Path | None = None,
                 write_ranks: bool = True) -> Report:
    """The merged report of the rank bundles in `paths` (one run directory per node), to be written into
    `out_dir` (default: the first path). Each rank's own findings.json and report.html are written again (unless
    `write_ranks` is False), a rank that waits for another saying so first. A rank-K/ that is a link out of its
    run directory is not read: the report says so.

    Raises BundleError when no rank bundle can be read at all.
    """
    bundles = job_bundles(paths)
    out_dir = out_dir or paths[0]
    diagnosed: list[RankDiagnosis] = []
    unreadable = [_linked_out(link, path) for path in paths for link in ranks_linked_out(path)]
    for number, bundle in bundles.items():
        try:
            diagnosed.append(_diagnose_rank(number, bundle, prepared))
        except BundleError as exc:  # the other ranks are still worth their report
            unreadable.append({"what": f"rank {number}", "reason": f"its bundle cannot be read: {exc}"})
    if not diagnosed:
        raise BundleError(f"no rank bundle of {', '.join(map(str, paths))} can be read: "
                          + "; ".join(row["reason"] for row in unreadable))
    job = _with_waits(Job([d.rank for d in diagnosed]))
    result = run_job_rules(job, prepared)
    docs = {r.code: r.doc for r in prepared.rules}
    merged = merged_findings(job, result, [d.result for d in diagnosed])
    reports = {d.rank.rank: with_wait(d.report, job, result.findings, d.rank.rank) for d in diagnosed}
    for d in diagnosed if write_ranks else ():
        write_outputs(reports[d.rank.rank], Path(d.rank.figures.bundle))
    return build_job_report(job, reports, merged, docs, out_dir, unreadable)


def _linked_out(link: Path, run_dir: Path) -> NotMeasuredRow:
    return {"what": link.name.replace("-", " "),
            "reason": f"it is a link to {os.path.realpath(link)}, outside the run directory {run_dir}: not read"}


def _diagnose_rank(number: int, bundle: Path, prepared: PreparedRules) -> RankDiagnosis:
    run = Run.from_bundle(bundle)
    diagnosis = diagnose_windows(run, prepared.rules, prepared.options, prepared.limits)
    report = build_report(diagnosis.run, diagnosis.result, {r.code: r.doc for r in prepared.rules},
                          diagnosis.windows)
    figures = rank_figures(number, diagnosis.run, report["run"]["median_step_s"], report["run"]["step_s"],
                           os.fspath(bundle))
    return RankDiagnosis(RankRun(number, diagnosis.run, figures, diagnosis.result.findings), diagnosis.result, report)


def _with_waits(job: Job) -> Job:
    figures = with_waits([r.figures for r in job.ranks])
    return Job([replace(r, figures=f) for r, f in zip(job.ranks, figures)])


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
    claimed = {(f.location.file, f.location.line): f for f in job_findings
               if f.category == "straggler" and f.location is not None}
    out = []
    for record in records:
        loc = record.location
        holder = claimed.get((loc.file, loc.line)) if loc is not None else None
        if holder is None or record.impact is None:
            out.append(record)
            continue
        out.append(msgspec.structs.replace(
            record, impact=None, saving_s=None,
            impact_reason=f"counted in {holder.code}'s finding: this rank's delay is the others' wait"))
    return out
