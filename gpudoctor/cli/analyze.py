"""`gpudoctor analyze` and `gpudoctor diff`: analyse a run again, or compare two."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from gpudoctor.cli.app import (
    ANALYZE_HELP,
    FailOnOption,
    FormatOption,
    IgnoreOption,
    RuleOptionOption,
    RulesOption,
    RuleTimeoutOption,
    SelectOption,
    _check_fail_on,
    _Command,
    _fails,
    _formats,
    _prepare,
    _say,
    _say_each,
    _selection,
    _write,
    app,
)
from gpudoctor.errors import EXIT_FINDINGS, BundleError, InputNotFoundError
from gpudoctor.ui.terminal import terminal_safe
from gpudoctor.vocabulary import DIFF_FORMATS

# The commands import the analysis, the engine and the report when they run, not here: `gpudoctor --help` and a
# usage error answer without them.


@app.command(cls=_Command, help=ANALYZE_HELP,
             short_help="Analyse a run directory, a profiler trace or a TensorBoard log.")
def analyze(
    paths: Annotated[list[Path], typer.Argument(
        metavar="PATH...", help="A run directory, a torch.profiler trace (.json or .json.gz), or a TensorBoard "
                                "profiler directory; or the run directories of a torchrun job, one per node.")],
    out: Annotated[Path | None, typer.Option(
        "--out", metavar="DIR", help="Where to write findings.json and report.html.")] = None,
    rules: RulesOption = None, select: SelectOption = None, ignore: IgnoreOption = None,
    rule_option: RuleOptionOption = None, rule_timeout: RuleTimeoutOption = None, fail_on: FailOnOption = None,
    output_formats: FormatOption = None,
) -> None:
    """Re-analyse a run directory, or a Chrome trace that torch.profiler wrote anywhere."""
    from gpudoctor import pipeline

    _check_fail_on(fail_on)
    formats = _formats(output_formats)
    for path in paths:
        if not path.exists():
            raise InputNotFoundError(f"{path} does not exist.")
        _refuse_if_recording(path)
    pipeline.refuse_project_inside(paths)
    prepared = _prepare(_selection(rules, select, ignore, rule_option, rule_timeout))
    inputs, chosen = pipeline.analysis_inputs(paths)  # a TensorBoard directory's newest trace, said in one sentence
    _say_each(chosen)
    diagnosis = pipeline.diagnose(inputs, prepared, progress=sys.stderr)
    _write(diagnosis, out or diagnosis.out_dir, formats)
    if _fails(diagnosis, fail_on):
        raise typer.Exit(EXIT_FINDINGS)


def _refuse_if_recording(path: Path) -> None:
    """A run directory (or a job's rank) a `gpudoctor profile` still records into: its report comes when it ends."""
    from gpudoctor.launch.recording import recorder

    for run_dir in (path, *sorted(path.glob("rank-*"))) if path.is_dir() else ():
        found = recorder(run_dir)
        if found is not None:
            raise BundleError(f"{run_dir} is still being recorded by gpudoctor profile (pid {found[0]}, started "
                              f"{found[1]}): its report is written when that run ends; analyze it then.")


DIFF_HELP = """Did the fix work? Compare two runs: the median step of each, the speed-up (before / after), and each
finding resolved (in BEFORE only), new (in AFTER only) or remaining (in both). BEFORE and AFTER are run directories
or their findings.json; a run directory without findings.json is analysed first.

\b
Exit status:
  0    the runs were compared
  2    bad usage, a rule file that cannot be used
  65   a run that cannot be read (a corrupt findings.json or bundle); 66 a path that does not exist
  73   --out cannot be written"""


def _diff_format(value: str | None, out: Path | None) -> str:
    """--format; without it, the extension of --out (.json, .html), else text."""
    if value is None:
        suffix = out.suffix.lower().lstrip(".") if out is not None else ""
        return suffix if suffix in ("json", "html") else "text"
    if value.strip().lower() not in DIFF_FORMATS:
        raise typer.BadParameter(f"--format takes {', '.join(DIFF_FORMATS)}, not {value!r}.")
    return value.strip().lower()


@app.command(help=DIFF_HELP, short_help="Did the fix work? Compare two runs: their steps and their findings.")
def diff(
    before: Annotated[Path, typer.Argument(
        metavar="BEFORE", help="The earlier run: a run directory, or its findings.json.")],
    after: Annotated[Path, typer.Argument(
        metavar="AFTER", help="The later run, after the fix: a run directory, or its findings.json.")],
    output_format: Annotated[str | None, typer.Option(
        "--format", metavar="FORMAT", show_default=False,
        help="text (the default), json or html; with --out and no --format, the file's extension chooses.")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", metavar="FILE", help="Write the comparison to this file, not stdout.")] = None,
    rules: RulesOption = None,
) -> None:
    """Compare two runs: median steps, speed-up, and the findings resolved, new and remaining."""
    from gpudoctor.pipeline.diffing import diff_text, write_file

    chosen = _diff_format(output_format, out)
    text = diff_text(before, after, tuple(rules or ()), chosen, progress=sys.stderr)
    if out is None:  # the text for a reader: no control character of the runs compared reaches the terminal
        print(terminal_safe(text) if chosen == "text" else text, end="")
        return
    write_file(out, text)
    _say(f"wrote the comparison to {out}.")
