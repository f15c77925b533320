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
    _prepare,
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
        "--finding", metavar="CODE", help="Try only this finding's fix (a code, or a prefix of codes), even one "
                                          "predicted to save under 5% of the step, which is otherwise not tried.",
        show_default=False)] = None,
    try_steps: TryStepsOption = None, try_timeout: TryTimeoutOption = None,
    try_all: Annotated[bool, typer.Option(
        "--all", help="Also the fixes that change the numerics (TF32, bf16 autocast, torch.compile), each with how "
                      "far the loss moved.")] = False,
    rules: RulesOption = None, select: SelectOption = None, ignore: IgnoreOption = None,
    rule_option: RuleOptionOption = None, rule_timeout: RuleTimeoutOption = None,
    output_formats: FormatOption = None,
    yes: Annotated[bool, typer.Option(
        "--yes", "-y", help="Run the command without asking (scripts, CI): only for a run directory that gpudoctor "
                            "recorded as you on this host; one made elsewhere is asked about on a terminal.")] = False,
) -> None:
    """Try the fixes of a recorded run."""
    from gpudoctor import pipeline
    from gpudoctor.bundle import MANIFEST
    from gpudoctor.trying.settings import TrySettings

    formats = _formats(output_formats)
    if not run_dir.exists():
        raise InputNotFoundError(f"{run_dir} does not exist.")
    if not (run_dir / MANIFEST).is_file() and not pipeline.is_job([run_dir]):
        raise BundleError(f"{run_dir} is not a run directory of gpudoctor profile: it has no {MANIFEST}.")
    pipeline.refuse_project_inside([run_dir])
    prepared = _prepare(_selection(rules, select, ignore, rule_option, rule_timeout))
    diagnosis = pipeline.diagnose([run_dir], prepared)  # a job (torchrun's, or ranks the script started): merged
    settings = TrySettings(try_steps, try_timeout, finding, numerics=try_all)
    confirmed = pipeline.confirm_tries(diagnosis, settings, yes)  # raises unless its user said yes, or nothing runs
    tried_into(diagnosis, run_dir, settings, formats, confirmed)
