"""The reports of a torchrun job: each rank's own, and the merged one, with the lowest rank's report as the frame
(run facts, charts), the job's findings, the ranks table (`run.world_size`, `run.ranks`) and a row per rank linking
its own report."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote

from gpudoctor.bundle import REPORT
from gpudoctor.bundle.findings import FindingRecord
from gpudoctor.bundle.records import first_line
from gpudoctor.engine import EngineResult
from gpudoctor.job.figures import LOST
from gpudoctor.job.groups import FAILED_ENDINGS, rank_groups
from gpudoctor.job.launcher import launcher_of
from gpudoctor.job.merge import JobDiagnosis
from gpudoctor.job.model import Job, RankRun
from gpudoctor.report.budget import budget_json
from gpudoctor.report.cards import finding_cards
from gpudoctor.report.charts import ranks_chart
from gpudoctor.report.document import NotMeasuredRow, RankRow, Report, RunFacts, Status, Summary
from gpudoctor.report.tried import with_tried_lead
from gpudoctor.report.units import seconds


def job_reports(diagnosis: JobDiagnosis, docs: Mapping[str, str], out_dir: Path) -> tuple[Report, dict[Path, Report]]:
    """The job's merged report, to be written into `out_dir`, and each rank's own by its bundle, a rank that waits
    for another saying so first."""
    job, waits = diagnosis.job, diagnosis.job_result.findings
    own = {d.rank.rank: with_wait(d.report, job, waits, d.rank.rank) for d in diagnosis.ranks}
    merged = build_job_report(job, own, diagnosis.result, docs, out_dir, diagnosis.unreadable)
    return merged, {Path(d.rank.figures.bundle): own[d.rank.rank] for d in diagnosis.ranks}


def build_job_report(job: Job, rank_reports: Mapping[int, Report], merged: EngineResult, docs: Mapping[str, str],
                     out_dir: Path, unreadable: list[NotMeasuredRow]) -> Report:
    shown = job.ranks[0]  # the rank whose budget, charts and trace the page shows, each section saying so
    base = rank_reports[shown.rank]
    not_measured = [*unreadable, *base["not_measured"]]
    paced = rank_reports[job.paced_rank.rank]["run"]  # the rank whose step time is the job's
    on_shown = [f for f in merged.findings if f.ranks is None or shown.rank in f.ranks]  # the job's, and its own
    summary = _summary(job, merged.findings, not_measured, rank_reports)
    run: RunFacts = {**base["run"], "median_step_s": job.step_s, "step_s": job.pace_s,
                     "budget": budget_json(shown.run.budget, on_shown), "shown_rank": shown.rank,
                     "step_s_basis": paced["step_s_basis"], "step_s_steps": paced["step_s_steps"],
                     "step_s_evaluations": paced.get("step_s_evaluations", 0),
                     "step_s_stalls": paced.get("step_s_stalls", 0),
                     # said beside the job's step, of the steps it is: those of the rank the others wait for
                     "window_distortion": paced.get("window_distortion"),
                     "window_distortion_reason": paced.get("window_distortion_reason"),
                     "world_size": job.world_size,
                     "ranks": [r.figures.to_json() for r in job.ranks]}
    launcher = launcher_of(job)
    if launcher is not None:
        run["launcher"] = launcher
    idle_rank = _idlest(rank_reports)
    if idle_rank is not None:
        run["gpu_idle_rank"] = idle_rank
    times = [(r.rank, r.figures.time.to_json()) for r in job.ranks if r.figures.time is not None]
    report: Report = {
        **base,
        "run": run,
        "summary": summary,
        "not_measured": not_measured,
        "cards": finding_cards(merged.findings, job.ranks[0].run, docs),
        # One phase table per rank, in each rank's own report: the ranks' phases are not one step's.
        "breakdown": {"phases": [], "mean_step_s": job.pace_s},
        "charts": {**base["charts"], "ranks": ranks_chart(times)},
        "ranks": _rank_rows(job, rank_reports, merged.findings, out_dir),
        "links": {"trace": base["links"]["trace"], "run": os.fspath(out_dir.resolve())},
        "findings": [f.to_json() for f in merged.findings],
        "not_evaluated": [row.to_json() for row in merged.not_evaluated],
        "errors": [row.to_json() for row in merged.errors],
    }
    return report


def _rank_rows(job: Job, rank_reports: Mapping[int, Report], findings: list[FindingRecord],
               out_dir: Path) -> list[RankRow]:
    """The ranks table's rows: a big job's outliers first, then node by node (gpudoctor.job.groups)."""
    straggler = next((f for f in findings if f.category == "straggler"), None)
    slow = _evidence(straggler, "slow rank") if straggler is not None else None
    groups = rank_groups([r.figures for r in job.ranks], slow if isinstance(slow, int) else None)
    return [_rank_row(job.rank(number), rank_reports[number], out_dir, title)
            for title, numbers in groups for number in numbers]


def _rank_row(rank_run: RankRun, own: Report, out_dir: Path, group: str | None) -> RankRow:
    return {
        "figures": rank_run.figures.to_json(), "report_href": _href(Path(rank_run.figures.bundle) / REPORT, out_dir),
        "problems": own["summary"]["problems"], "chart": own["charts"]["steps"], "group": group,
    }


def _href(target: Path, out_dir: Path) -> str | None:
    try:
        return quote(Path(os.path.relpath(target.resolve(), out_dir.resolve())).as_posix())
    except ValueError:  # another drive, on Windows
        return None


def failed_ranks(job: Job) -> list[RankRun]:
    return [r for r in job.ranks if r.figures.ending in FAILED_ENDINGS]


def _summary(job: Job, findings: list[FindingRecord], not_measured: list[NotMeasuredRow],
             rank_reports: Mapping[int, Report]) -> Summary:
    """The job's verdict; its GPU idle share is the idlest rank's, as that rank's own report says it."""
    problems = [f for f in findings if f.severity != "info"]
    stepped = any(r.figures.steps_analysed for r in job.ranks)
    status: Status = ("no_steps" if not stepped else "problems" if problems
                      else "partial" if not_measured else "healthy")
    idlest = _idlest(rank_reports)
    idle = rank_reports[idlest]["summary"]["gpu_idle_share"] if idlest is not None else None
    verdict = with_tried_lead(job_verdict(job, problems, stepped, status), job.pace_s, [f.to_json() for f in findings])
    return {"verdict": verdict, "gpu_idle_share": idle,
            "healthy": not problems, "problems": len(problems), "status": status}


def _idlest(rank_reports: Mapping[int, Report]) -> int | None:
    """The rank whose GPU idles the largest share of its step, as its own report says; None without GPU activity."""
    idle = {rank: report["summary"]["gpu_idle_share"] for rank, report in rank_reports.items()}
    known = {rank: share for rank, share in idle.items() if share is not None}
    return max(known, key=lambda rank: (known[rank], -rank)) if known else None


def job_verdict(job: Job, problems: list[FindingRecord], stepped: bool, status: Status) -> str:
    """The crash first, then the largest problem with what fixing it saves of the job's step, then how many more
    there are. The ranks' savings do not add up as one run's do: a rank's fix speeds the job only where that rank
    sets its pace, so the largest is said alone."""
    ranks = f"{job.world_size} rank{'' if job.world_size == 1 else 's'}"
    # The first to fail first: the others' failures often follow from it (gloo's "Connection closed by peer").
    failed = sorted(failed_ranks(job), key=_ended)
    crash = " ".join(_crash(r) for r in failed)
    if not stepped:
        said = f"{ranks}; no training step was detected, so there is no step time to break down."
    elif not problems:
        said = f"{ranks}; no problems found{'' if status == 'healthy' else ' in what was measured'}."
    else:
        largest = max(problems, key=lambda f: f.impact or 0.0)
        more = f"; {len(problems) - 1} more problem{'s' if len(problems) > 2 else ''}" if len(problems) > 1 else ""
        said = f"{ranks}; {largest.title}{_saving_of(largest, job.pace_s)}{more}."
    return f"{crash} {said}" if crash else said


def _saving_of(finding: FindingRecord, pace_s: float | None) -> str:
    """' (fixing it saves ~85% of each 90.9 ms step, down to ~13.5 ms)', of the job's step at its pace."""
    if not finding.impact or not pace_s:
        return ""
    after = seconds(pace_s * (1 - finding.impact))
    return f" (fixing it saves ~{finding.impact:.0%} of each {seconds(pace_s)} step, down to ~{after})"


def _ended(rank_run: RankRun) -> tuple[float, int]:
    exit_info = rank_run.run.manifest.exit
    ended = exit_info.ended if exit_info is not None else None
    return (ended if ended is not None else float("inf"), rank_run.rank)


def _crash(rank_run: RankRun) -> str:
    exit_info = rank_run.run.manifest.exit
    exception = exit_info.exception if exit_info else None
    status = f" (status {exit_info.status})" if exit_info and exit_info.status is not None else ""
    if exception is not None and exception.exception:
        line = first_line(exception.message)
        said = f": {line}" if line else ""
        return f"Rank {rank_run.rank} raised {exception.exception}{said}".rstrip(".") + "."
    if rank_run.figures.ending == LOST:
        return (f"Rank {rank_run.rank} ended without a word: its process or its node was killed (SIGKILL, the OOM "
                "killer, a node lost); what it recorded until then is kept and analysed.")
    return f"Rank {rank_run.rank} ended by {rank_run.figures.ending}{status}."


def with_wait(report: Report, job: Job, job_findings: list[FindingRecord], rank: int) -> Report:
    """A rank's own report, its verdict first saying whom it waits for in collectives and how long, when the job's
    straggler finding names another rank: a rank that spends its step waiting is not healthy. Its own figures
    follow in words of its own: how much of its step it waits, and, where its rules found nothing, that this is
    all there is (never "no problems found" beside a wait)."""
    straggler = next((f for f in job_findings if f.category == "straggler"), None)
    slow = _evidence(straggler, "slow rank") if straggler is not None else None
    if straggler is None or slow is None:
        return report
    step, after = _evidence(straggler, "the job's step"), _evidence(straggler, "the job's step after the fix")
    if slow == rank:
        return _holding_back(report, straggler, step, after)
    would = (f": the job's {step:.1f} ms step would take ~{after:.1f} ms without the wait"
             if isinstance(step, (int, float)) and isinstance(after, (int, float)) else "")
    said = f"This rank waits for rank {slow} in every collective{would} ({straggler.code} in the job's report)."
    summary = report["summary"]
    own = summary["verdict"] if summary["problems"] else _waiting_alone(job.rank(rank), summary["gpu_idle_share"])
    status: Status = "problems" if summary["status"] in ("healthy", "partial", "unexplained") else summary["status"]
    waiting: Summary = {**summary, "verdict": f"{said} {own}".strip(), "healthy": False, "status": status}
    if isinstance(slow, int):
        waiting["waits_for"] = slow
    return {**report, "summary": waiting}


def _holding_back(report: Report, straggler: FindingRecord, step: object, after: object) -> Report:
    """The slow rank's own report, its verdict first saying that the others wait for it and what fixing it makes of
    the job's step: its own findings' savings are of its own step, which the others' limits then bound."""
    if not isinstance(step, (int, float)) or not isinstance(after, (int, float)):
        return report
    limited = _evidence(straggler, "then limited by")
    then = f", then limited by {limited}" if isinstance(limited, str) else ""
    said = (f"The other ranks wait for this one in every collective: fixing it brings the job's {step:.1f} ms step "
            f"to ~{after:.1f} ms{then} ({straggler.code} in the job's report).")
    summary = report["summary"]
    return {**report, "summary": {**summary, "verdict": f"{said} {summary['verdict']}"}}


def _waiting_alone(rank_run: RankRun, idle: float | None) -> str:
    """'Its GPU waits in collectives 84.0 ms of each 89.0 ms step (94%); besides, it idles 5%, and its own rules
    found nothing else.' for a waiting rank whose own rules found no problem."""
    time = rank_run.figures.time
    if time is None or not time.step_s:
        return "Its own rules found nothing else."
    waits = (f"Its GPU waits in collectives {seconds(time.waiting_s)} of each {seconds(time.step_s)} step "
             f"({time.waiting_s / time.step_s:.0%}); besides, " if time.waiting_s > 0 else "Besides the wait, ")
    idles = f"it idles {idle:.0%} of the step, and " if idle is not None else ""
    return f"{waits}{idles}its own rules found nothing else."


def _evidence(finding: FindingRecord, name: str) -> object:
    return next((e.value for e in finding.evidence if e.name == name), None)
