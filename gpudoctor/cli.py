"""The command line: `gpudoctor profile`, `gpudoctor analyze`, `gpudoctor diff`, `gpudoctor rules`.

Each command is a few calls into the library. GpudoctorError is caught once, in `main`, and printed as
its one-sentence message with its exit status.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from typer.core import TyperCommand, TyperGroup, TyperOption

from gpudoctor import __version__
from gpudoctor.collect.config import WindowConfig
from gpudoctor.diagnose import (
    PreparedRules,
    RuleSelection,
    analysis_input,
    diagnose,
    load_project_rules,
    open_run,
    prepare_rules,
    write_outputs,
)
from gpudoctor.diffing import compare_runs, write_file
from gpudoctor.engine import CATEGORIES, SEVERITIES, Rule, find_rule, retired_codes
from gpudoctor.engine.scaffold import DEFAULT_NAME, new_rule
from gpudoctor.errors import EXIT_FINDINGS, EXIT_INTERNAL, GpudoctorError, InputNotFoundError
from gpudoctor.launcher import ProfileOutcome, ProfileRequest
from gpudoctor.launcher import profile as run_profile
from gpudoctor.report.diff_render import DIFF_FORMATS, render_diff
from gpudoctor.report.document import Report
from gpudoctor.report.render import to_text
from gpudoctor.ui.trace_progress import TraceProgress

if TYPE_CHECKING:  # the click that typer uses, as the type checker sees it in the installed typer
    from typer._click.core import Command as _ClickCommand
    from typer._click.core import Context as _ClickContext
    from typer._click.core import Parameter as _ClickParameter
    from typer._click.exceptions import ClickException as _ClickException
    from typer._click.formatting import HelpFormatter as _ClickHelpFormatter
else:
    # Usage errors are raised by the click that typer uses, which recent typer versions vendor as typer._click.
    _ClickException = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")



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
                "status line on the terminal (only when stderr is one) shows the steps seen and the profiling window."
                + EXIT_STATUS_HELP.replace("Exit status:",
                                           "Exit status (the script's own when it fails, a signal N as 128+N):")
                + "\n  124  --timeout stopped the script")
ANALYZE_HELP = ("Re-analyse a run directory, or analyse a Chrome trace that torch.profiler wrote anywhere, or a "
                "TensorBoard profiler directory (the newest of its *.pt.trace.json traces)." + EXIT_STATUS_HELP)


def _say(message: str) -> None:
    print(f"gpudoctor: {message}", file=sys.stderr)


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


def _fails(report: Report, fail_on: str | None) -> bool:
    """Whether a finding (findings.json's, in the report) is at least as severe as --fail-on."""
    if fail_on is None:
        return False
    threshold = SEVERITIES.index(fail_on)
    return any(SEVERITIES.index(f["severity"]) >= threshold for f in report["findings"])


def _end_options_after_module(args: list[str], takes_value: set[str]) -> list[str]:
    """Insert `--` after `-m MODULE`, so that the module's own arguments are not read as gpudoctor's options."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--" or not arg.startswith("-"):
            return args  # the script comes first, and click stops reading options there by itself
        if arg in ("-m", "--module"):
            return args if i + 1 == len(args) else [*args[:i + 2], "--", *args[i + 2:]]
        if arg.startswith("--module=") or (arg.startswith("-m") and not arg.startswith("--")):
            return [*args[:i + 1], "--", *args[i + 1:]]
        i += 2 if arg in takes_value else 1
    return args


def _profile_options(command: _ClickCommand) -> dict[str, bool]:
    """Each of profile's option names (--out, -m, ...) and whether it takes a value."""
    return {name: not p.is_flag for p in command.params if isinstance(p, TyperOption) for name in p.opts}


class _ProfileCommand(_Command):
    """`profile -m MODULE ARGS...` gives every argument after MODULE to the module, as `python -m` does."""

    def parse_args(self, ctx: _ClickContext, args: list[str]) -> list[str]:
        ctx.meta[PROFILE_ARGS] = list(args)  # as typed: a misplaced option is shown moved within them
        takes_value = {name for name, takes in _profile_options(self).items() if takes}
        return super().parse_args(ctx, _end_options_after_module(args, takes_value))

    def collect_usage_pieces(self, ctx: _ClickContext) -> list[str]:
        return ["[OPTIONS]", "SCRIPT", "[ARGS]..."]


PROFILE_ARGS = "gpudoctor.profile_args"


@app.command(cls=_ProfileCommand, help=PROFILE_HELP,
             short_help="Run a script unchanged, profile it, and report why its GPU idles.",
             context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                               "allow_interspersed_args": False})
def profile(
    ctx: typer.Context,
    script: Annotated[str | None, typer.Argument(
        metavar="SCRIPT", help="The script to run; everything after it is the script's own arguments.",
        show_default=False)] = None,
    module: Annotated[str | None, typer.Option(
        "-m", "--module", metavar="MODULE", help="Run a module, as `python -m`.")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", metavar="DIR", help="Run directory (default ./gpudoctor-runs/<script>-<time>).")] = None,
    wait_steps: Annotated[int, typer.Option(
        metavar="N", help="Steps to skip before profiling.", min=0)] = WindowConfig.wait,
    warmup_steps: Annotated[int, typer.Option(
        metavar="N", help="Profiler warm-up steps (recorded, not analysed).", min=0)] = WindowConfig.warmup,
    active_steps: Annotated[int, typer.Option(
        metavar="N", help="Steps recorded and analysed.", min=1)] = WindowConfig.active,
    max_steps: Annotated[int | None, typer.Option(
        metavar="N", help="Stop the script cleanly after N steps.", min=1)] = None,
    timeout: Annotated[float | None, typer.Option(
        metavar="SECONDS", help="Stop the script after this many seconds.", min=0.1)] = None,
    with_stack: Annotated[bool, typer.Option(
        "--with-stack", help="Record Python call stacks in the trace (slower, larger).")] = False,
    every: Annotated[str | None, typer.Option(
        help="Profile again every DURATION (e.g. 10m, 90s, 1h) while the script runs; the report compares the windows.",
        metavar="DURATION", show_default=False)] = None,
    rules: RulesOption = None, select: SelectOption = None, ignore: IgnoreOption = None,
    rule_option: RuleOptionOption = None, rule_timeout: RuleTimeoutOption = None, fail_on: FailOnOption = None,
    output_formats: FormatOption = None,
) -> None:
    """Run SCRIPT [ARGS]... (or -m MODULE [ARGS]...) unchanged, profile it, and write a report."""
    _check_fail_on(fail_on)
    formats = _formats(output_formats)
    args = list(ctx.args)
    if module is None and script is None:
        raise typer.BadParameter("give a script to run, or -m MODULE.")
    if module is not None and script is not None:
        args.insert(0, script)
        script = None
    request = ProfileRequest(
        script=script, module=module, args=args, out=out,
        window=WindowConfig(wait_steps, warmup_steps, active_steps, _duration_s(every)), max_steps=max_steps,
        timeout_s=timeout, with_stack=with_stack,
    )
    # The rules are loaded and checked before the script runs, so that a bad rule file costs no run.
    prepared = prepare_rules(_selection(rules, select, ignore, rule_option, rule_timeout))
    outcome = run_profile(request)
    ending = _misplaced_options(ctx, request, outcome) or outcome.message
    in_verdict = outcome.ending == "exception" and "text" in formats  # the summary's first sentence names it
    _say_each(None if in_verdict else ending, outcome.note)
    report = _diagnose_into(outcome.run_dir, outcome.run_dir, prepared, formats)
    _say_each(ending if in_verdict and report is None else None)
    status = outcome.exit_status
    if status == 0 and report is not None and _fails(report, fail_on):
        status = EXIT_FINDINGS
    raise typer.Exit(status)


def _misplaced_options(ctx: typer.Context, request: ProfileRequest, outcome: ProfileOutcome) -> str | None:
    """When the script refused its arguments (status 2) and gpudoctor's options are among them: where they go."""
    if outcome.ending != "exit" or outcome.exit_status != 2:
        return None
    options = _profile_options(ctx.command)
    for name in ("-m", "--module"):  # a module is not an option of the script's run: it replaces the script
        options.pop(name)
    own, kept = _split_options(request.args, options)
    if not own:
        return None
    typed = ctx.meta[PROFILE_ARGS]
    before_args = typed[:len(typed) - len(request.args)]  # the script's arguments are the end of what was typed
    target = _target_start(before_args)  # the moved options go last before it, so that they win over earlier ones
    names = list(dict.fromkeys(option[0].split("=", 1)[0] for option in own))
    which = "is a gpudoctor option, which goes" if len(names) == 1 else "are gpudoctor options, which go"
    moved = [arg for option in own for arg in option]
    fixed = shlex.join(["gpudoctor", "profile", *before_args[:target], *moved, *before_args[target:], *kept])
    target_kind = "module" if request.module else "script"
    return (f"{request.module or request.script} exited with status 2; {_and(names)} {which} before the "
            f"{target_kind}: {fixed}")


def _target_start(before_args: list[str]) -> int:
    """Where SCRIPT, `-- SCRIPT` or `-m MODULE` starts among the arguments typed before the script's own."""
    last = len(before_args) - 1
    return last - 1 if last > 0 and before_args[last - 1] in ("--", "-m", "--module") else last


def _split_options(args: list[str], options: dict[str, bool]) -> tuple[list[list[str]], list[str]]:
    """gpudoctor's options among `args`, each with its value, and the arguments left."""
    own: list[list[str]] = []
    kept: list[str] = []
    i = 0
    while i < len(args):
        name = args[i].split("=", 1)[0]
        width = (2 if options[name] and "=" not in args[i] else 1) if name in options else 0
        if width:
            own.append(args[i:i + width])
        else:
            kept.append(args[i])
        i += width or 1
    return own, kept


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def _duration_s(text: str | None) -> float | None:
    """'90', '90s', '10m', '1.5h' in seconds."""
    if text is None:
        return None
    number, unit = (text[:-1], text[-1]) if text and text[-1] in DURATION_UNITS else (text, "s")
    try:
        seconds = float(number) * DURATION_UNITS[unit]
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a duration: write a number of seconds, or e.g. 90s, 10m, 1h.",
                                 param_hint="--every") from None
    if not seconds > 0:
        raise typer.BadParameter(f"{text!r} must be longer than zero.", param_hint="--every")
    return seconds


def _selection(rules: list[str] | None, select: list[str] | None, ignore: list[str] | None,
               rule_option: list[str] | None, rule_timeout: float | None) -> RuleSelection:
    return RuleSelection(tuple(rules or ()), tuple(select or ()), tuple(ignore or ()), tuple(rule_option or ()),
                         rule_timeout)


def _diagnose_into(source: Path, out_dir: Path, rules: PreparedRules,
                   formats: tuple[str, ...] = FORMATS) -> Report | None:
    """Analyse and write the report; a failure here is reported but never hides the script's own status."""
    try:
        report = diagnose(open_run(source), rules)
        _write(report, out_dir, formats)
    except GpudoctorError as exc:
        _say(f"the bundle was written to {out_dir}, but the report could not be made: {exc}")
        return None
    return report


def _write(report: Report, out_dir: Path, formats: tuple[str, ...]) -> None:
    written = write_outputs(report, out_dir, formats)
    if "text" in formats:
        shown = written.get("html") or written.get("json")
        print(to_text(report, str(shown) if shown else None), file=sys.stderr, end="")


@app.command(cls=_Command, help=ANALYZE_HELP,
             short_help="Analyse a run directory, a profiler trace or a TensorBoard log.")
def analyze(
    path: Annotated[Path, typer.Argument(
        metavar="PATH", help="A run directory, a torch.profiler trace (.json or .json.gz), or a TensorBoard "
                             "profiler directory.")],
    out: Annotated[Path | None, typer.Option(
        "--out", metavar="DIR", help="Where to write findings.json and report.html.")] = None,
    rules: RulesOption = None, select: SelectOption = None, ignore: IgnoreOption = None,
    rule_option: RuleOptionOption = None, rule_timeout: RuleTimeoutOption = None, fail_on: FailOnOption = None,
    output_formats: FormatOption = None,
) -> None:
    """Re-analyse a run directory, or a Chrome trace that torch.profiler wrote anywhere."""
    _check_fail_on(fail_on)
    formats = _formats(output_formats)
    if not path.exists():
        raise InputNotFoundError(f"{path} does not exist.")
    prepared = prepare_rules(_selection(rules, select, ignore, rule_option, rule_timeout))
    source, chosen = analysis_input(path)  # a TensorBoard directory's newest trace, said in one sentence
    if chosen:
        _say(chosen)
    out_dir = out or (source if source.is_dir() else source.parent)
    run = open_run(source)
    run.trace_progress = TraceProgress.on_terminal(sys.stderr)  # None unless stderr is a terminal
    report = diagnose(run, prepared)
    _write(report, out_dir, formats)
    if _fails(report, fail_on):
        raise typer.Exit(EXIT_FINDINGS)


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


@app.command(help=DIFF_HELP)
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
    chosen = _diff_format(output_format, out)
    text = render_diff(compare_runs(before, after, tuple(rules or ()), progress=sys.stderr), chosen)
    if out is None:
        print(text, end="")
        return
    write_file(out, text)
    _say(f"wrote the comparison to {out}.")


@rules_app.command("list", cls=_Command, short_help="List the rules, where each comes from, and the retired codes.")
def rules_list(rules: RulesOption = None) -> None:
    """List every rule: code, name, category and where it comes from (built-in, package:, file:, module:); then the
    retired codes, with why."""
    project = load_project_rules(rules or ())
    selected = {r.code for r in project.selected(RuleSelection())}
    for r in sorted(project.rules, key=lambda r: (r.source != "built-in", r.code)):
        off = "" if r.code in selected else "  (off: [tool.gpudoctor] select/ignore)"
        print(f"{r.code:<9} {r.name:<34} {r.category:<22} {r.source}{off}{_formerly(r)}")
    for code, why in sorted(retired_codes().items()):
        print(f"{code:<9} {'(retired)':<34} {why}")


def _formerly(r: Rule) -> str:
    return f"  (formerly {', '.join(r.aliases)})" if r.aliases else ""


@rules_app.command("explain", cls=_Command, short_help="Show a rule's documentation and its options.")
def rules_explain(
    code: Annotated[str, typer.Argument(metavar="CODE", help="The rule's code or name, e.g. GD101.")],
    rules: RulesOption = None,
) -> None:
    """Show a rule's documentation, its options with their defaults, and the values pyproject.toml sets."""
    project = load_project_rules(rules or ())
    r = find_rule(project.rules, code, "rules explain")
    if r is None:
        raise InputNotFoundError(f"no rule has the code or name {code!r}; `gpudoctor rules list` shows them all.")
    severity = f"{r.severity} by default, see Severity below" if "Severity:" in r.doc else r.severity
    print(f"{r.code} {r.name} ({r.category}, {severity}) from {r.source}{_formerly(r)}\n\n{r.doc}")
    if r.options:
        print("\nOptions (default):")
        project_sets = project.options.get(r.code, {})
        for name, default in r.options.items():
            note = f"  # {project.config.source} sets {project_sets[name]!r}" if name in project_sets else ""
            print(f"  {name} = {default!r}{note}")


@rules_app.command("new", cls=_Command, short_help="Write a starter rule and its test.")
def rules_new(
    code: Annotated[str, typer.Argument(
        metavar="CODE", help="The rule's code: your team's prefix and three digits, e.g. ACME101.")],
    name: Annotated[str, typer.Option("--name", metavar="NAME", help="The rule's kebab-case name.")] = DEFAULT_NAME,
    category: Annotated[str, typer.Option(
        "--category", metavar="CATEGORY", help=f"One of: {', '.join(CATEGORIES)}.")] = "data_starvation",
    directory: Annotated[Path, typer.Option(
        "--dir", metavar="DIR", help="Where to write the rule and its test.")] = Path("."),
) -> None:
    """Write a starter rule, DIR/<code>.py, and its test, DIR/test_<code>.py."""
    rule_file, test_file = new_rule(code, name, category, directory)
    print(f"wrote {rule_file} and {test_file}\n"
          f"  list it:  gpudoctor rules list --rules {rule_file}\n"
          f"  test it:  python -m pytest {test_file}\n"
          f"  run it:   gpudoctor analyze RUN_DIR --rules {rule_file}")


def _version(value: bool) -> None:
    if value:
        print(f"gpudoctor {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Show the version.")] = False) -> None:
    pass


def main() -> None:
    try:
        # Outside standalone mode click returns a typer.Exit's code instead of exiting with it.
        status = app(standalone_mode=False)
    except GpudoctorError as exc:
        _say(str(exc))
        sys.exit(exc.exit_status)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        _say("aborted.")
        sys.exit(130)
    except _ClickException as exc:  # usage errors
        exc.show()
        sys.exit(exc.exit_code)
    except Exception as exc:  # noqa: BLE001 - a bug in gpudoctor: one line, the traceback and EXIT_INTERNAL
        _say(f"internal error: {type(exc).__name__}: {exc}. Please report it with the traceback below.")
        import traceback

        traceback.print_exc()
        sys.exit(EXIT_INTERNAL)
    sys.exit(status if isinstance(status, int) else 0)
