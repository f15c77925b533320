"""The diagnosis of a run or a job: the one choice between them, the rules run once, and the fixes tried on the
findings."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from gpudoctor.analysis import Run
from gpudoctor.bundle.findings import FindingRecord
from gpudoctor.engine import EngineResult, PreparedRules, RunDiagnosis, WindowStats, diagnose_windows
from gpudoctor.errors import GpudoctorError
from gpudoctor.job import Job
from gpudoctor.job.merge import JobDiagnosis, diagnose_job
from gpudoctor.pipeline.inputs import is_job, open_run
from gpudoctor.report.together import LeftAfterTry, lead_try, left_after
from gpudoctor.trying.settings import TrySettings
from gpudoctor.ui.trace_progress import TraceProgress
from gpudoctor.vocabulary import SEVERITIES

if TYPE_CHECKING:
    from gpudoctor.trying.tries import Diagnosed


@dataclass(frozen=True)
class Diagnosis:
    """What the rules found in one run, or in a job of ranks; its report is built when it is written.

    `found` is a run's (the run, as the window its charts show; its rules' result over every window; a row per
    window) or a job's (each rank's own, the job rules', and both merged). `source` is what was analysed: a run
    directory or a trace, or a job's first run directory."""

    found: RunDiagnosis | JobDiagnosis
    docs: Mapping[str, str]  # each rule's full documentation, by code, for the report's cards
    source: Path
    rules: PreparedRules | None = None  # the rules it ran, which diagnose a try's own run alike
    left: LeftAfterTry | None = None  # a run whose fixes were tried: what the fastest measured try leaves

    @property
    def subject(self) -> Run | Job:
        return self.found.run if isinstance(self.found, RunDiagnosis) else self.found.job

    @property
    def result(self) -> EngineResult:
        return self.found.result

    @property
    def findings(self) -> list[FindingRecord]:
        return self.found.result.findings

    @property
    def windows(self) -> list[WindowStats]:
        return self.found.windows if isinstance(self.found, RunDiagnosis) else []

    @property
    def pace_s(self) -> float | None:
        """The step at the run's pace (a job's: its slowest rank's), as findings.json gives it: what savings and
        tries are measured against."""
        return self.found.run.pace.reported_s if isinstance(self.found, RunDiagnosis) else self.found.pace_s

    @property
    def out_dir(self) -> Path:
        """Where its report goes unless told: the run directory, or the folder of the trace analysed."""
        return self.source if self.source.is_dir() else self.source.parent

    def with_findings(self, findings: list[FindingRecord]) -> Diagnosis:
        result = dataclasses.replace(self.found.result, findings=findings)
        return dataclasses.replace(self, found=dataclasses.replace(self.found, result=result))


def diagnose(paths: Sequence[Path], rules: PreparedRules, progress: IO[str] | None = None,
             job: bool = False) -> Diagnosis:
    """The diagnosis of a run directory or a trace, or of a job's run directories (one per node); `progress`, a
    terminal, is shown how far a large trace has been read. `job`: the caller ran a job (torchrun), whatever its
    directory holds."""
    if job or is_job(paths):
        return Diagnosis(diagnose_job(paths, rules), rules.docs, paths[0], rules)
    run = open_run(paths[0])
    if progress is not None:
        run.trace_progress = TraceProgress.on_terminal(progress)  # None unless it is a terminal
    return diagnose_run(run, rules)


def diagnose_run(run: Run, rules: PreparedRules) -> Diagnosis:
    """The diagnosis of a run already open."""
    found = diagnose_windows(run, rules.rules, rules.options, rules.limits)
    return Diagnosis(found, rules.docs, run.path if run.path is not None else Path("."), rules)


# The tries are imported when they are made: they start processes (launch/), which the analysis alone never does.
def try_fixes(diagnosis: Diagnosis, settings: TrySettings, say: Callable[[str], None],
              confirmed: Diagnosed | None = None) -> Diagnosis:
    """The diagnosis with each chosen finding's fix tried (`tried`): the run again with its remedy, into the run
    directory's tries/; `say` is told of each try as it starts. `confirmed`: the run as its user confirmed it
    (`confirm_tries`), else as its directory has it now."""
    from gpudoctor.trying.tries import try_fixes as tried

    findings = tried(diagnosis.findings, diagnosis.pace_s, diagnosis.source, settings, say, confirmed)
    tried_diagnosis = diagnosis.with_findings(findings)
    return dataclasses.replace(tried_diagnosis, left=left_after_lead_try(tried_diagnosis))


def left_after_lead_try(diagnosis: Diagnosis) -> LeftAfterTry | None:
    """What the fastest measured try's own run still shows, diagnosed by the same rules (report.together); None
    for a job, where no try was measured, or where the try's bundle cannot be read."""
    lead = lead_try(diagnosis.findings)
    if lead is None or lead.tried is None or not lead.tried.bundle or diagnosis.rules is None:
        return None
    if not isinstance(diagnosis.found, RunDiagnosis) or not diagnosis.source.is_dir():
        return None
    try:
        run = open_run(diagnosis.source / lead.tried.bundle)
        found = diagnose_run(run, diagnosis.rules)
    except GpudoctorError:
        return None
    step_s = found.pace_s or lead.tried.step_s
    return left_after(lead, found.findings, step_s) if step_s else None


def confirm_tries(diagnosis: Diagnosis, settings: TrySettings, yes: bool) -> Diagnosed | None:
    """The run as its user confirmed it, once shown the command its tries would run (gpudoctor.trying.consent);
    None when no try would run. Raises TryRefusedError or TryNotConfirmedError when nothing is to run."""
    from gpudoctor.trying.consent import confirm_tries as confirmed

    return confirmed(diagnosis.source, diagnosis.findings, diagnosis.pace_s, settings, yes)


def fails(diagnosis: Diagnosis, fail_on: str | None) -> bool:
    """Whether a finding is at least as severe as `fail_on` (--fail-on); never without one."""
    if fail_on is None:
        return False
    threshold = SEVERITIES.index(fail_on)
    return any(SEVERITIES.index(f.severity) >= threshold for f in diagnosis.findings)
