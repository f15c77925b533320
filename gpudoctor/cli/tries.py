"""`gpudoctor try`: try the fixes of a run recorded earlier."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpudoctor.cli.app import (
    FormatOption,
    IgnoreOption,
    RuleOptionOption,
    RulesOption,
    RuleTimeoutOption,
    SelectOption,
    TryStepsOption,
    TryTimeoutOption,
    _Command,
    _formats,
    _selection,
    app,
    tried_into,
)
from gpudoctor.errors import BundleError, InputNotFoundError

TRY_HELP = ("Try the fixes of a run that `gpudoctor profile` recorded: analyse it, then run its script again (the "
            "manifest's command, working directory and arguments) once per finding whose fix gpudoctor can apply at "
            "run time, with that fix, and measure the step. Each try goes into RUN_DIR/tries/CODE/; findings.json and "
            "report.html get each finding's measured speed-up (`tried`). The command is shown first, and runs only "
            "once you confirm it: on a terminal, or with --yes for a run directory that gpudoctor recorded as you on "
            "this host. A run directory whose script lies inside it, or whose command was changed since gpudoctor "
            "recorded it, is refused."
            "\n\n\b\nExit status:\n  0    the fixes were tried (or none can be)\n  2    bad usage, a rule file that "
            "cannot be used\n  65   a run directory that cannot be read; 66 a path that does not exist\n  77   "
            "nothing was run: not confirmed, or refused")


@app.command("try", cls=_Command, help=TRY_HELP,
             short_help="Run a recorded run's script again with each fix that can be applied at run time, and "
                        "measure it.")
def try_fixes(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR", help="A run directory of `gpudoctor profile`.")],
    finding: Annotated[str | None, typer.Option(
        "--finding", metavar="CODE", help="Try only this finding's fix (a code, or a prefix of codes).",
        show_default=False)] = None,
    try_steps: TryStepsOption = None, try_timeout: TryTimeoutOption = None,
    rules: RulesOption = None, select: SelectOption = None, ignore: IgnoreOption = None,
    rule_option: RuleOptionOption = None, rule_timeout: RuleTimeoutOption = None,
    output_formats: FormatOption = None,
    yes: Annotated[bool, typer.Option(
        "--yes", "-y", help="Run the command without asking (scripts, CI): only for a run directory that gpudoctor "
                            "recorded as you on this host; one made elsewhere is asked about on a terminal.")] = False,
) -> None:
    """Try the fixes of a recorded run."""
    from gpudoctor.bundle import MANIFEST
    from gpudoctor.bundle.layout import rank_dirs
    from gpudoctor.diagnose import diagnose, open_run, prepare_rules, refuse_project_inside
    from gpudoctor.job.layout import is_job_dir
    from gpudoctor.job.merge import diagnose_job
    from gpudoctor.trying.consent import confirm_tries
    from gpudoctor.trying.settings import TrySettings

    formats = _formats(output_formats)
    if not run_dir.exists():
        raise InputNotFoundError(f"{run_dir} does not exist.")
    if not (run_dir / MANIFEST).is_file() and not is_job_dir(run_dir):
        raise BundleError(f"{run_dir} is not a run directory of gpudoctor profile: it has no {MANIFEST}.")
    refuse_project_inside([run_dir])
    prepared = prepare_rules(_selection(rules, select, ignore, rule_option, rule_timeout))
    # A torchrun job, or one whose ranks the script started (Lightning, mp.spawn): its ranks' bundles, merged
    report = diagnose_job([run_dir], prepared) if rank_dirs(run_dir) else diagnose(open_run(run_dir), prepared)
    settings = TrySettings(try_steps, try_timeout, finding)
    confirmed = confirm_tries(run_dir, report, settings, yes)  # raises unless its user said yes, or nothing runs
    tried_into(report, run_dir, settings, formats, confirmed)
