"""`gpudoctor profile`: run a script unchanged, or torchrun's job, profile it, and write its report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NamedTuple

import typer

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
    TryNumericsOption,
    TryStepsOption,
    TryTimeoutOption,
    _check_fail_on,
    _Command,
    _diagnose_into,
    _fails,
    _formats,
    _prepare,
    _say,
    _say_each,
    _selection,
    app,
    tried_into,
    try_fixes_all_args,
)
from gpudoctor.cli.misplaced import PROFILE_ARGS, end_options_after_module, misplaced_options, profile_options
from gpudoctor.collect.config import WindowConfig
from gpudoctor.errors import EXIT_FINDINGS, GpudoctorError
from gpudoctor.launch.supervisor import EXIT_GRACE_S
from gpudoctor.paths import find_pyproject
from gpudoctor.vocabulary import ENTRY_POINT_GROUP

if TYPE_CHECKING:  # and the click that typer uses, as the type checker sees it in the installed typer
    from typer._click.core import Context as _ClickContext

    from gpudoctor.launch.profile import ProfileOutcome
    from gpudoctor.launch.request import ProfileRequest
    from gpudoctor.launch.torchrun import TorchrunJob
    from gpudoctor.pipeline import Diagnosis, PreparedRules
    from gpudoctor.remedy import Remedy
    from gpudoctor.trying.settings import TrySettings


class _ProfileCommand(_Command):
    """`profile -m MODULE ARGS...` gives every argument after MODULE to the module, as `python -m` does."""

    def parse_args(self, ctx: _ClickContext, args: list[str]) -> list[str]:
        ctx.meta[PROFILE_ARGS] = list(args)  # as typed: a misplaced option is shown moved within them
        takes_value = {name for name, takes in profile_options(self).items() if takes}
        return super().parse_args(ctx, end_options_after_module(try_fixes_all_args(args, takes_value), takes_value))

    def collect_usage_pieces(self, ctx: _ClickContext) -> list[str]:
        return ["[OPTIONS]", "SCRIPT", "[ARGS]..."]


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
    try_numerics: TryNumericsOption = False,
    remedy: Annotated[str | None, typer.Option(
        hidden=True, help="A try's fix, as JSON (gpudoctor.remedy.Remedy): how a torchrun job's tries reach its "
                          "ranks.")] = None,
) -> None:
    """Run SCRIPT [ARGS]... (or -m MODULE [ARGS]...) unchanged, profile it, and write a report."""
    # Imported here, not with the module: `gpudoctor --help` and the other commands answer without them.
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
    tries = TrySettings(try_steps, try_timeout, numerics=try_numerics) if try_fixes else None
    if is_torchrun(script, module):
        _duration_s(every)  # checked here as well as in each rank, so that a bad value costs no job
        ran = _run_torchrun(_torchrun_job(args), out, _rank_options(ctx), selection)
    else:
        request = ProfileRequest(
            script=python_program(script) or script if script is not None else None,  # `accelerate launch ...`
            module=module, args=args, out=out,
            window=WindowConfig(wait=wait_steps, warmup=warmup_steps, active=active_steps, detail=detail_steps,
                                every_s=_duration_s(every)),
            max_steps=max_steps, timeout_s=timeout, exit_grace_s=exit_grace, with_stack=with_stack,
            remedy=_remedy(remedy),
        )
        ran = _run_script(ctx, request, selection, formats)
    raise typer.Exit(_reported(ran, formats, tries, fail_on))


class _Ran(NamedTuple):
    """A run (or torchrun's job) that ended, as its report is to be made."""

    run_dir: Path
    exit_status: int  # the script's own (torchrun's), a signal N as 128 + N
    prepared: PreparedRules | None  # None: no report here (a rank of `gpudoctor profile torchrun`, a run never started)
    unsaid: str | None = None  # how the script ended, when the report's summary was to say it first
    inner_rank: bool = False  # a rank of `torchrun ... -m gpudoctor profile`: its own report, then maybe the job's
    job: bool = False  # a job of ranks (torchrun's, or those the script started): its ranks' bundles, merged


def _run_torchrun(job: TorchrunJob, out: Path | None, rank_options: list[str], selection: _RuleArgs) -> _Ran:
    """torchrun with `gpudoctor profile` as each rank; the rules are loaded and checked before the job starts."""
    from gpudoctor.launch.torchrun import run_job

    prepared = _prepared(selection)
    outcome = run_job(job, out, rank_options)
    _say_each(outcome.message)
    if outcome.nodes > 1:  # the ranks merged the job's report, or this node's
        report = outcome.run_dir / "report.html"
        _say(f"report: {report} (one of the job's ranks wrote it when the ranks it holds had ended)" if report.is_file()
             else f"this node's ranks are in {outcome.run_dir}; `gpudoctor analyze` of every node's run directory "
                  "merges the job's report")
        return _Ran(outcome.run_dir, outcome.exit_status, None)
    return _Ran(outcome.run_dir, outcome.exit_status, prepared, job=True)


def _run_script(ctx: typer.Context, request: ProfileRequest, selection: _RuleArgs, formats: tuple[str, ...]) -> _Ran:
    """The script run and its bundle written; the rules loaded before it when the user's own may come in, else while
    it runs."""
    from gpudoctor.launch import inner_job
    from gpudoctor.launch.profile import profile as run_profile

    prepared: PreparedRules | BaseException | None
    if inner_job.merged_by_outer():  # `gpudoctor profile torchrun` checked the rules, and analyses every rank
        prepared, outcome = None, run_profile(request)
    elif _rules_beyond_the_builtins(selection):
        # Loaded and checked before the script runs, so that a bad rule file or setting costs no run.
        prepared = _prepared(selection)
        outcome = run_profile(request)
    else:  # the built-in rules alone: loaded while the script runs, which starts without waiting for them
        loaded: list[PreparedRules | BaseException] = []
        outcome = run_profile(request, meanwhile=lambda: loaded.append(_prepare_or_error(selection)))
        prepared = loaded[0]
    if not outcome.run_dir.is_dir():  # removed while the script ran: the note says so, the status is the script's
        _say_each(outcome.message, outcome.note)
        return _Ran(outcome.run_dir, outcome.exit_status, None)
    hint = misplaced_options(ctx, request, outcome)
    if hint is not None and _never_stepped(outcome.run_dir):  # the hint is all there is to say: no report
        _say_each(hint, outcome.note)
        return _Ran(outcome.run_dir, outcome.exit_status, None)
    ending = hint or outcome.message
    in_verdict = outcome.ending == "exception" and "text" in formats  # the summary's first sentence names it
    _say_each(None if in_verdict else ending, outcome.note)
    if isinstance(prepared, BaseException):
        _say(f"the bundle was written to {outcome.run_dir}, but the rules could not be loaded: {prepared}")
        if not isinstance(prepared, GpudoctorError):
            raise prepared
        raise typer.Exit(outcome.exit_status)
    _say_each(_stopped_ranks(outcome))
    return _Ran(outcome.run_dir, outcome.exit_status, prepared, ending if in_verdict else None,
                inner_job.merges_itself(), job=bool(outcome.ranks))


def _never_stepped(run_dir: Path) -> bool:
    """Whether the script ended before its first step, as its manifest says (a manifest that cannot be read says
    nothing: the report is made, and tells what it can)."""
    from gpudoctor.bundle.manifest import read_manifest
    from gpudoctor.errors import BundleError

    try:
        ended = read_manifest(run_dir).exit
    except (BundleError, OSError):
        return False
    return ended is not None and ended.steps == 0


def _reported(ran: _Ran, formats: tuple[str, ...], tries: TrySettings | None, fail_on: str | None) -> int:
    """The exit status, once the report is written (with the fixes tried, with `tries`): the script's own, or
    EXIT_FINDINGS when it succeeded and a finding meets --fail-on."""
    if ran.prepared is None:
        return ran.exit_status
    if ran.inner_rank and not ran.job:
        diagnosis = _inner_job_report(ran.run_dir, ran.prepared, formats, tries)
    else:
        diagnosis = _report(ran.run_dir, ran.prepared, formats, tries, job=ran.job)
    _say_each(ran.unsaid if diagnosis is None else None)
    if ran.exit_status == 0 and diagnosis is not None and _fails(diagnosis, fail_on):
        return EXIT_FINDINGS
    return ran.exit_status


def _report(run_dir: Path, prepared: PreparedRules, formats: tuple[str, ...], tries: TrySettings | None,
            job: bool = False) -> Diagnosis | None:
    """The run's report (a job's: merged), written into its directory; with `tries`, first without its summary, so
    that it is whole whatever the tries do, then again with what they measured."""
    if tries is None:
        return _diagnose_into(run_dir, prepared, formats, job)
    diagnosis = _diagnose_into(run_dir, prepared, _without_summary(formats), job)
    return None if diagnosis is None else tried_into(diagnosis, run_dir, tries, formats)


def _inner_job_report(rank_dir: Path, prepared: PreparedRules, formats: tuple[str, ...],
                      tries: TrySettings | None) -> Diagnosis | None:
    """A rank of `torchrun ... -m gpudoctor profile`: its own report (no summary of its own on the terminal), then
    the job's, merged by the last rank of the node to finish."""
    from gpudoctor.launch import inner_job

    with inner_job.reports_before_sigterm():  # the script has ended: its agent's SIGTERM waits for the reports
        with inner_job.heartbeat(rank_dir):  # the other nodes' ranks wait for one that is alive
            own = _diagnose_into(rank_dir, prepared, _without_summary(formats))
            inner_job.mark_done(rank_dir)
        if not inner_job.take_merge(rank_dir.parent):
            return own if tries is None or own is None else tried_into(own, rank_dir, tries, formats)
        if tries is None:
            try:
                return _report(rank_dir.parent, prepared, formats, None, job=True)
            finally:
                inner_job.merged(rank_dir.parent)
    try:  # the tries run the job again: no grace holds them
        return _report(rank_dir.parent, prepared, formats, tries, job=True)
    finally:
        inner_job.merged(rank_dir.parent)


def _without_summary(formats: tuple[str, ...]) -> tuple[str, ...]:
    """The formats but the text summary: a report written before another that the terminal shows."""
    return tuple(f for f in formats if f != "text")


class _RuleArgs(NamedTuple):
    """The rule options as given: --rules, --select, --ignore, --rule-option, --rule-timeout."""
    rules: list[str] | None
    select: list[str] | None
    ignore: list[str] | None
    rule_option: list[str] | None
    rule_timeout: float | None


def _prepared(selection: _RuleArgs) -> PreparedRules:
    return _prepare(_selection(*selection))


def _prepare_or_error(selection: _RuleArgs) -> PreparedRules | BaseException:
    """The rules, or what stopped them loading: it is said once the script has ended, never while it runs."""
    try:
        return _prepared(selection)
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


def _stopped_ranks(outcome: ProfileOutcome) -> str | None:
    from gpudoctor.launch import followed  # its samplers' imports are the profile's own, made on use

    count = len(outcome.stopped_ranks)
    if not count:
        return None
    which = "a rank" if count == 1 else f"{count} ranks"
    return (f"{which} of the job still ran {followed.RANKS_GRACE_S:g} s after the script's own process ended, "
            "so gpudoctor stopped them.")


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
