"""`gpudoctor profile`: run a script unchanged, profile it, and write its report."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NamedTuple, NoReturn

import typer
from typer.core import TyperOption

from gpudoctor.collect.config import WindowConfig
from gpudoctor.errors import EXIT_FINDINGS, GpudoctorError
from gpudoctor.launch.supervisor import EXIT_GRACE_S
from gpudoctor.paths import find_pyproject
from gpudoctor.vocabulary import ENTRY_POINT_GROUP

if TYPE_CHECKING:  # and the click that typer uses, as the type checker sees it in the installed typer
    from typer._click.core import Command as _ClickCommand
    from typer._click.core import Context as _ClickContext

    from gpudoctor.diagnose import PreparedRules
    from gpudoctor.launch.profile import ProfileOutcome
    from gpudoctor.launch.request import ProfileRequest
    from gpudoctor.launch.torchrun import TorchrunJob
    from gpudoctor.remedy import Remedy
    from gpudoctor.report.document import Report
    from gpudoctor.trying.settings import TrySettings

from gpudoctor.cli.app import (
    PROFILE_HELP,
    FailOnOption,
    FormatOption,
    IgnoreOption,
    RuleOptionOption,
    RulesOption,
    RuleTimeoutOption,
    SelectOption,
    TryFixesOption,
    TryStepsOption,
    TryTimeoutOption,
    _check_fail_on,
    _Command,
    _diagnose_into,
    _fails,
    _formats,
    _say,
    _say_each,
    _selection,
    _write,
    app,
    tried_into,
)


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
        metavar="SCRIPT", help="The script to run; everything after it is the script's own arguments. "
                               "`torchrun [TORCHRUN OPTIONS] SCRIPT [ARGS]` (or -m torch.distributed.run ...) "
                               "profiles every rank of the job: RUN/rank-K/ each, and one merged report.",
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
        metavar="N", help="Steps timed and analysed (GPU activity only, at full speed).", min=1)] = WindowConfig.active,
    detail_steps: Annotated[int, typer.Option(
        metavar="N", help="Steps after those with call-site and phase hooks, for the lines of code to blame.",
        min=0)] = WindowConfig.detail,
    max_steps: Annotated[int | None, typer.Option(
        metavar="N", help="Stop the script cleanly after N steps.", min=1)] = None,
    timeout: Annotated[float | None, typer.Option(
        metavar="SECONDS", help="Stop the script after this many seconds.", min=0.1)] = None,
    exit_grace: Annotated[float, typer.Option(
        metavar="SECONDS", help="How long the script's process may take to exit once its script and atexit "
                                "handlers are done, before gpudoctor stops it.", min=0.1)] = EXIT_GRACE_S,
    with_stack: Annotated[bool, typer.Option(
        "--with-stack", help="Record operators and Python call stacks in the trace (slows the timed steps).")] = False,
    every: Annotated[str | None, typer.Option(
        help="Profile again every DURATION (e.g. 10m, 90s, 1h) while the script runs; the report compares the windows.",
        metavar="DURATION", show_default=False)] = None,
    rules: RulesOption = None, select: SelectOption = None, ignore: IgnoreOption = None,
    rule_option: RuleOptionOption = None, rule_timeout: RuleTimeoutOption = None, fail_on: FailOnOption = None,
    output_formats: FormatOption = None,
    try_fixes: TryFixesOption = False, try_steps: TryStepsOption = None, try_timeout: TryTimeoutOption = None,
    remedy: Annotated[str | None, typer.Option(
        hidden=True, help="A try's fix, as JSON (gpudoctor.remedy.Remedy): how a torchrun job's tries reach its "
                          "ranks.")] = None,
) -> None:
    """Run SCRIPT [ARGS]... (or -m MODULE [ARGS]...) unchanged, profile it, and write a report."""
    # Imported here, not with the module: `gpudoctor --help` and the other commands answer without them.
    from gpudoctor.launch import inner_job
    from gpudoctor.launch.profile import profile as run_profile
    from gpudoctor.launch.request import ProfileRequest
    from gpudoctor.launch.run_dir import python_program
    from gpudoctor.launch.torchrun import is_torchrun
    from gpudoctor.trying.settings import TrySettings

    _check_fail_on(fail_on)
    formats = _formats(output_formats)
    args = list(ctx.args)
    if module is None and script is None:
        raise typer.BadParameter("give a script to run, or -m MODULE.")
    if module is not None and script is not None:
        args.insert(0, script)
        script = None
    selection = _RuleArgs(rules, select, ignore, rule_option, rule_timeout)
    if script is not None and not is_torchrun(script, module):
        script = python_program(script) or script  # `gpudoctor profile accelerate launch ...`
    if is_torchrun(script, module):
        _duration_s(every)  # checked here as well as in each rank, so that a bad value costs no job
        job = _torchrun_job(args)
        tries = TrySettings(try_steps, try_timeout) if try_fixes else None
        _profile_job(job, out, _rank_options(ctx), _prepare(selection), formats, fail_on, tries)
    request = ProfileRequest(
        script=script, module=module, args=args, out=out,
        window=WindowConfig(wait=wait_steps, warmup=warmup_steps, active=active_steps, detail=detail_steps,
                            every_s=_duration_s(every)),
        max_steps=max_steps,
        timeout_s=timeout, exit_grace_s=exit_grace, with_stack=with_stack, remedy=_remedy(remedy),
    )
    if _rules_beyond_the_builtins(selection):
        # Loaded and checked before the script runs, so that a bad rule file or setting costs no run.
        prepared: PreparedRules | BaseException = _prepare(selection)
        outcome = run_profile(request)
    else:  # the built-in rules alone: loaded while the script runs, which starts without waiting for them
        loaded: list[PreparedRules | BaseException] = []
        outcome = run_profile(request, meanwhile=lambda: loaded.append(_prepare_or_error(selection)))
        prepared = loaded[0]
    ending = _misplaced_options(ctx, request, outcome) or outcome.message
    in_verdict = outcome.ending == "exception" and "text" in formats  # the summary's first sentence names it
    _say_each(None if in_verdict else ending, outcome.note)
    if isinstance(prepared, BaseException):
        _say(f"the bundle was written to {outcome.run_dir}, but the rules could not be loaded: {prepared}")
        if not isinstance(prepared, GpudoctorError):
            raise prepared
        raise typer.Exit(outcome.exit_status)
    _say_each(_stopped_ranks(outcome))
    # With --try-fixes, the report is written first without its summary, so that it is whole whatever the tries do.
    first = _without_summary(formats) if try_fixes else formats
    if outcome.ranks:
        report = _merge_into(outcome.run_dir, prepared, first)
    elif inner_job.merges_itself():
        report = _merge_inner_job(outcome.run_dir, prepared, first)
    else:
        report = _diagnose_into(outcome.run_dir, outcome.run_dir, prepared, first)
    if try_fixes and report is not None:
        report = tried_into(report, outcome.run_dir, TrySettings(try_steps, try_timeout), formats)
    _say_each(ending if in_verdict and report is None else None)
    status = outcome.exit_status
    if status == 0 and report is not None and _fails(report, fail_on):
        status = EXIT_FINDINGS
    raise typer.Exit(status)


class _RuleArgs(NamedTuple):
    """The rule options as given: --rules, --select, --ignore, --rule-option, --rule-timeout."""
    rules: list[str] | None
    select: list[str] | None
    ignore: list[str] | None
    rule_option: list[str] | None
    rule_timeout: float | None


def _prepare(selection: _RuleArgs) -> PreparedRules:
    from gpudoctor.diagnose import prepare_rules

    return prepare_rules(_selection(*selection))


def _prepare_or_error(selection: _RuleArgs) -> PreparedRules | BaseException:
    """The rules, or what stopped them loading: it is said once the script has ended, never while it runs."""
    try:
        return _prepare(selection)
    except Exception as exc:  # noqa: BLE001 - the script runs on; the error is reported after it
        return exc


def _rules_beyond_the_builtins(selection: _RuleArgs) -> bool:
    """Whether anything but the built-in rules with their defaults may come into this run: a rule option on the
    command line, [tool.gpudoctor] in the project's pyproject.toml, or an installed package's rules."""
    from importlib.metadata import entry_points

    if any(value is not None for value in selection):
        return True
    pyproject = find_pyproject(Path.cwd().resolve())
    if pyproject is not None and _sets_gpudoctor(pyproject):
        return True
    return bool(entry_points(group=ENTRY_POINT_GROUP))


def _sets_gpudoctor(pyproject: Path) -> bool:
    """Whether pyproject.toml has a [tool.gpudoctor] table; one that cannot be read counts, to be checked first."""
    import tomllib

    try:
        return "gpudoctor" in tomllib.loads(pyproject.read_text(encoding="utf-8")).get("tool", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, AttributeError):
        return True


# The options each rank's `gpudoctor profile` takes as they were given; --out, --format and --fail-on are the job's.
RANK_OPTIONS = ("wait_steps", "warmup_steps", "active_steps", "detail_steps", "max_steps", "timeout", "with_stack",
                "every", "rules", "select", "ignore", "rule_option", "rule_timeout")


def _torchrun_job(args: list[str]) -> TorchrunJob:
    from gpudoctor.launch.torchrun import TorchrunUsageError, parse_torchrun

    try:
        return parse_torchrun(args)
    except TorchrunUsageError as exc:
        raise typer.BadParameter(str(exc)) from None


def _rank_options(ctx: typer.Context) -> list[str]:
    """The rank options the user gave on the command line, as each rank's `gpudoctor profile` takes them."""
    passed: list[str] = []
    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name or "")
        if param.name not in RANK_OPTIONS or source is None or source.name != "COMMANDLINE":
            continue
        name, value = max(param.opts, key=len), ctx.params[param.name]
        for one in value if isinstance(value, (list, tuple)) else [value]:
            passed += [name] if isinstance(one, bool) else [name, str(one)]
    return passed


def _remedy(text: str | None) -> Remedy | None:
    from gpudoctor.remedy import Remedy

    if text is None:
        return None
    try:
        return Remedy.from_json(json.loads(text))
    except (ValueError, TypeError) as exc:
        raise typer.BadParameter(f"not a remedy: {exc}", param_hint="--remedy") from None


def _profile_job(job: TorchrunJob, out: Path | None, rank_options: list[str], prepared: PreparedRules,
                 formats: tuple[str, ...], fail_on: str | None, tries: TrySettings | None) -> NoReturn:
    """Run torchrun with `gpudoctor profile` as each rank, then merge the rank bundles into one report (and, with
    `tries`, try its fixes, each a run of the whole job)."""
    from gpudoctor.launch.torchrun import run_job

    outcome = run_job(job, out, rank_options)
    _say_each(outcome.message)
    first = _without_summary(formats) if tries is not None else formats
    report = _merge_into(outcome.run_dir, prepared, first)
    if tries is not None and report is not None:
        report = tried_into(report, outcome.run_dir, tries, formats)
    status = outcome.exit_status
    if status == 0 and report is not None and _fails(report, fail_on):
        status = EXIT_FINDINGS
    raise typer.Exit(status)


def _merge_into(run_dir: Path, prepared: PreparedRules, formats: tuple[str, ...]) -> Report | None:
    """The job's merged report, written into run_dir; a failure is said but never hides torchrun's status."""
    from gpudoctor.job.merge import diagnose_job

    try:
        report = diagnose_job([run_dir], prepared)
        _write(report, run_dir, formats)
    except GpudoctorError as exc:
        _say(f"the rank bundles were written to {run_dir}, but the merged report could not be made: {exc}")
        return None
    return report


def _merge_inner_job(rank_dir: Path, prepared: PreparedRules, formats: tuple[str, ...]) -> Report | None:
    """A rank of `torchrun ... -m gpudoctor profile`: its own report (no summary of its own on the terminal), then
    the job's, merged by the last rank of the node to finish."""
    from gpudoctor.launch import inner_job

    own = _diagnose_into(rank_dir, rank_dir, prepared, _without_summary(formats))
    inner_job.mark_done(rank_dir)
    if not inner_job.take_merge(rank_dir.parent):
        return own
    try:
        return _merge_into(rank_dir.parent, prepared, formats)
    finally:
        inner_job.merged(rank_dir.parent)


def _without_summary(formats: tuple[str, ...]) -> tuple[str, ...]:
    """The formats but the text summary: a report written before another that the terminal shows."""
    return tuple(f for f in formats if f != "text")


def _stopped_ranks(outcome: ProfileOutcome) -> str | None:
    from gpudoctor.launch import followed  # its samplers' imports are the profile's own, made on use

    count = len(outcome.stopped_ranks)
    if not count:
        return None
    which = "a rank" if count == 1 else f"{count} ranks"
    return (f"{which} of the job still ran {followed.RANKS_GRACE_S:g} s after the script's own process ended, "
            "so gpudoctor stopped them.")


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
