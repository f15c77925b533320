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
            "report.html get each finding's measured speed-up (`tried`).")


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
) -> None:
    """Try the fixes of a recorded run."""
    from gpudoctor.bundle import MANIFEST
    from gpudoctor.bundle.layout import rank_dirs
    from gpudoctor.diagnose import diagnose, open_run, prepare_rules
    from gpudoctor.job.layout import is_job_dir
    from gpudoctor.job.merge import diagnose_job
    from gpudoctor.trying.settings import TrySettings

    formats = _formats(output_formats)
    if not run_dir.exists():
        raise InputNotFoundError(f"{run_dir} does not exist.")
    if not (run_dir / MANIFEST).is_file() and not is_job_dir(run_dir):
        raise BundleError(f"{run_dir} is not a run directory of gpudoctor profile: it has no {MANIFEST}.")
    prepared = prepare_rules(_selection(rules, select, ignore, rule_option, rule_timeout))
    # A torchrun job, or one whose ranks the script started (Lightning, mp.spawn): its ranks' bundles, merged
    report = diagnose_job([run_dir], prepared) if rank_dirs(run_dir) else diagnose(open_run(run_dir), prepared)
    tried_into(report, run_dir, TrySettings(try_steps, try_timeout, finding), formats)
