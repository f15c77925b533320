"""The command-line application: the typer app, its help layout, the options the commands share, and the few helpers
they share (messages, formats, --fail-on, and the calls into gpudoctor.pipeline that several commands make)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from typer.core import TyperCommand, TyperGroup

from gpudoctor.errors import GpudoctorError
from gpudoctor.ui import terminal
from gpudoctor.vocabulary import SEVERITIES

# The analysis, the rule engine and the report are imported where they are used, not here: `gpudoctor profile`
# starts the script without waiting for them (docs/performance.md).
if TYPE_CHECKING:  # and the click that typer uses, as the type checker sees it in the installed typer
    from typer._click.core import Context as _ClickContext
    from typer._click.core import Parameter as _ClickParameter
    from typer._click.formatting import HelpFormatter as _ClickHelpFormatter

    from gpudoctor.pipeline import Diagnosis, PreparedRules, RuleSelection
    from gpudoctor.trying.settings import TrySettings
    from gpudoctor.trying.tries import Diagnosed


class _Group(TyperGroup):
    """`gpudoctor --help` lists each command with its whole summary; click would cut it to fit with '...'."""

    def format_commands(self, ctx: _ClickContext, formatter: _ClickHelpFormatter) -> None:
        commands = [(name, self.get_command(ctx, name)) for name in self.list_commands(ctx)]
        rows = [(name, command.get_short_help_str(limit=1000)) for name, command in commands
                if command is not None and not command.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _metavar(param: _ClickParameter) -> str:
    return param.metavar or (param.name or "").upper()


class _Command(TyperCommand):
    """Help that names an argument by its metavar alone: typer writes `{PATH}` in the usage, `PATH <path>` below."""

    def collect_usage_pieces(self, ctx: _ClickContext) -> list[str]:
        arguments = [_metavar(p) for p in self.get_params(ctx) if p.param_type_name == "argument"]
        return [self.options_metavar or "[OPTIONS]", *arguments]

    def format_options(self, ctx: _ClickContext, formatter: _ClickHelpFormatter) -> None:
        rows: dict[str, list[tuple[str, str]]] = {"Arguments": [], "Options": []}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                argument = param.param_type_name == "argument"
                rows["Arguments" if argument else "Options"].append((_metavar(param) if argument else record[0],
                                                                     record[1]))
        for title, section in rows.items():
            if section:
                with formatter.section(title):
                    formatter.write_dl(section)


app = typer.Typer(
    cls=_Group, add_completion=False, no_args_is_help=True, rich_markup_mode=None,
    context_settings={"max_content_width": 120},  # help as wide as the terminal, up to 120 columns (click stops at 80)
    help="Find out why a PyTorch script leaves its GPU idle, and what to change.",
)
rules_app = typer.Typer(cls=_Group, no_args_is_help=True, help="List, explain and start rules.")
app.add_typer(rules_app, name="rules")

RulesOption = Annotated[list[str] | None, typer.Option(
    "--rules", metavar="PATH", help="A rule file, directory of them, or module (repeatable).")]
SelectOption = Annotated[list[str] | None, typer.Option(
    "--select", metavar="PREFIX", help="Run only rules whose code starts with PREFIX, e.g. GD1 (repeatable).")]
IgnoreOption = Annotated[list[str] | None, typer.Option(
    "--ignore", metavar="PREFIX", help="Skip rules whose code starts with PREFIX (repeatable).")]
RuleOptionOption = Annotated[list[str] | None, typer.Option(
    "--rule-option", metavar="CODE.OPTION=VALUE",
    help="Set one rule option, e.g. GD101.min_wait_share=0.2 (repeatable).")]
RuleTimeoutOption = Annotated[float | None, typer.Option(
    "--rule-timeout", min=0.1, metavar="SECONDS",
    help="How long one rule may run before it is left behind as an error (default 30; [tool.gpudoctor] rule_timeout).")]
FailOnOption = Annotated[str | None, typer.Option(
    "--fail-on", metavar="SEVERITY",
    help="Exit with status 10 if a finding is at least this severe: info, warning or critical.")]
FormatOption = Annotated[list[str] | None, typer.Option(
    "--format", metavar="FORMATS",
    help="text (the summary, on stderr), json (findings.json), html (report.html): repeatable or "
         "comma-separated. Default: all three.")]
TryFixesOption = Annotated[bool, typer.Option(
    "--try-fixes", help="Then run the script again once per finding whose fix gpudoctor can apply at run time and "
                        "that keeps the computation (DataLoader settings, threads, start method, non-blocking "
                        "copies, a fused optimizer, the allocator's settings), with that fix, and measure its step: "
                        "each try in RUN/tries/CODE/, its speed-up on the finding. --try-fixes=all also tries the "
                        "fixes that change the numerics (TF32, bf16 autocast, torch.compile), each with how far the "
                        "loss moved. A fix predicted to save under 5% of the step is not tried (`gpudoctor try "
                        "RUN_DIR --finding CODE` tries it).")]
# `--try-fixes=all`, as typed, becomes `--try-fixes` and this hidden flag (try_fixes_all_args).
TRY_ALL, TRY_NUMERICS = "--try-fixes=all", "--try-numerics"
TryNumericsOption = Annotated[bool, typer.Option(
    TRY_NUMERICS, hidden=True, help="With --try-fixes, also the fixes that change the numerics.")]


def try_fixes_all_args(args: list[str], takes_value: set[str]) -> list[str]:
    """The command line with `--try-fixes=all` among gpudoctor's own options (before the script) read as
    `--try-fixes --try-numerics`: a flag that takes a value would swallow the script's name."""
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--" or not arg.startswith("-"):
            return out + args[i:]
        if arg == TRY_ALL:
            out += ["--try-fixes", TRY_NUMERICS]
        else:
            out.append(arg)
            if arg in takes_value and i + 1 < len(args):
                out.append(args[i + 1])
                i += 1
        i += 1
    return out
TryStepsOption = Annotated[int | None, typer.Option(
    metavar="N", min=1, help="Steps each try runs (default: as many as the diagnosed run, at most 200 after the "
                             "profiling window).",
    show_default=False)]
TryTimeoutOption = Annotated[float | None, typer.Option(
    metavar="SECONDS", min=1, help="Each try's time limit (default: twice the run's time, at least 60 s).",
    show_default=False)]
FORMATS = ("text", "json", "html")
EXIT_STATUS_HELP = """

\b
Exit status:
  0    no --fail-on threshold met (or none given)
  10   --fail-on SEVERITY: a finding is at least that severe
  2    bad usage, a rule file that cannot be used, a script not found
  65   a run bundle or trace that cannot be read; 66 a path that does not exist
  70   a bug in gpudoctor; 73 the output directory cannot be written"""
PROFILE_HELP = ("Run SCRIPT [ARGS]... (or -m MODULE [ARGS]...) unchanged, profile it, and write a report. "
                "gpudoctor's options go before SCRIPT: everything after it is the script's own. While it runs, a "
                "status line on the terminal (only when stderr is one) shows the steps seen and the profiling window. "
                "A torchrun job (gpudoctor profile [OPTIONS] torchrun [TORCHRUN OPTIONS] SCRIPT [ARGS], or -m "
                "torch.distributed.run) is profiled rank by rank, one bundle each in RUN/rank-K, and merged into one "
                "report; the exit status is torchrun's."
                + EXIT_STATUS_HELP.replace("Exit status:",
                                           "Exit status (the script's own when it fails, a signal N as 128+N):")
                + "\n  124  --timeout stopped the script")
ANALYZE_HELP = ("Re-analyse a run directory, or analyse a Chrome trace that torch.profiler wrote anywhere, or a "
                "TensorBoard profiler directory (the newest of its *.pt.trace.json traces). A torchrun job's run "
                "directory (rank-0/, rank-1/, ...), or one per node (analyze NODE0_DIR NODE1_DIR), is analysed rank "
                "by rank and merged: the merged findings.json and report.html go into the first directory, or --out."
                + EXIT_STATUS_HELP)




def _say(message: str) -> None:
    terminal.write(f"gpudoctor: {message}")


def _say_each(*messages: str | None) -> None:
    for message in messages:
        if message:
            _say(message)


def _formats(values: list[str] | None) -> tuple[str, ...]:
    chosen = [v.strip().lower() for value in values or FORMATS for v in value.split(",") if v.strip()]
    unknown = [v for v in chosen if v not in FORMATS]
    if unknown or not chosen:
        raise typer.BadParameter(f"--format takes {', '.join(FORMATS)} (repeatable or comma-separated), "
                                 f"not {', '.join(unknown) or 'nothing'}.")
    return tuple(dict.fromkeys(chosen))


def _check_fail_on(fail_on: str | None) -> None:
    if fail_on is not None and fail_on not in SEVERITIES:
        raise typer.BadParameter(f"--fail-on must be one of {', '.join(SEVERITIES)}, not {fail_on!r}.")


def _fails(diagnosis: Diagnosis, fail_on: str | None) -> bool:
    from gpudoctor.pipeline import fails

    return fails(diagnosis, fail_on)


def _selection(rules: list[str] | None, select: list[str] | None, ignore: list[str] | None,
               rule_option: list[str] | None, rule_timeout: float | None) -> RuleSelection:
    from gpudoctor.pipeline import RuleSelection

    return RuleSelection(tuple(rules or ()), tuple(select or ()), tuple(ignore or ()), tuple(rule_option or ()),
                         rule_timeout)


def _prepare(selection: RuleSelection) -> PreparedRules:
    from gpudoctor.pipeline import prepare_rules

    return prepare_rules(selection)


def _diagnose_into(run_dir: Path, rules: PreparedRules, formats: tuple[str, ...] = FORMATS,
                   job: bool = False) -> Diagnosis | None:
    """Analyse a run (or a job's ranks; `job`: torchrun's, whatever its directory holds) and write its report into
    its directory; a failure here is said but never hides the script's own status."""
    from gpudoctor import pipeline

    try:
        diagnosis = pipeline.diagnose([run_dir], rules, job=job)
        _write(diagnosis, run_dir, formats)
    except GpudoctorError as exc:
        if job or pipeline.is_job([run_dir]):
            _say(f"the rank bundles were written to {run_dir}, but the merged report could not be made: {exc}")
        else:
            _say(f"the bundle was written to {run_dir}, but the report could not be made: {exc}")
        return None
    return diagnosis


def tried_into(diagnosis: Diagnosis, out_dir: Path, settings: TrySettings, formats: tuple[str, ...],
               confirmed: Diagnosed | None = None) -> Diagnosis:
    """The diagnosis with its fixes tried, its report written into `out_dir`: each try is said as it starts.
    `confirmed`: the run as its user confirmed it (`gpudoctor try`)."""
    from gpudoctor.pipeline import try_fixes

    tried = try_fixes(diagnosis, settings, _say, confirmed)
    _write(tried, out_dir, formats)
    return tried


def _write(diagnosis: Diagnosis, out_dir: Path, formats: tuple[str, ...]) -> None:
    from gpudoctor.pipeline import write

    written = write(diagnosis, out_dir, formats, say=_say)
    if written.summary is not None:
        terminal.write(written.summary, end="")
