"""`gpudoctor try` runs what a run directory names only once its user has said yes.

A run directory is data that people hand around, and a try runs the command its manifest names again (the script or
module, its arguments and working directory; a torchrun job's torchrun.json). Before the first try, `gpudoctor try`
shows that command, the interpreter, the working directory, the changes to the environment and the fixes, says
whether the directory was recorded by this user on this host (gpudoctor.launch.command_record), and then:

    the run directory                                    on a terminal     --yes             neither
    recorded by you on this host, its command as it was  asks              runs              runs nothing
    made elsewhere (no record, another user's or host's) asks, saying so   asks on a         runs nothing
                                                                           terminal, else
                                                                           runs nothing
    recorded by you here, its command changed since      refused           refused           refused
    its script or module (a job's --rules) inside it     refused           refused           refused

`--yes` vouches only for a directory recorded by you here: anyone who can change a run directory can also delete its
record, so a directory made elsewhere needs a person's answer. Running nothing and refusing exit with
EXIT_NOT_CONFIRMED (77). Nothing is asked when no try would run (no fix that can be applied at run time). `gpudoctor
profile --try-fixes`, the user's own command just run, asks nothing.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from gpudoctor.bundle.confined import inside
from gpudoctor.bundle.findings import FindingRecord
from gpudoctor.collect.follow import FOLLOW_ENV, HOOK_DIR
from gpudoctor.errors import GpudoctorError, TryNotConfirmedError, TryRefusedError
from gpudoctor.launch.command_record import Provenance, check_record, job_command, script_command
from gpudoctor.launch.inner_job import OUTER_ENV
from gpudoctor.launch.torchrun import rank_command
from gpudoctor.remedy import Remedy
from gpudoctor.trying.settings import TrySettings
from gpudoctor.trying.tries import TRIES_DIR, Diagnosed, cannot_try, chosen, diagnosed_run
from gpudoctor.ui import terminal

YES = ("y", "yes")


@dataclass(frozen=True)
class TryCommand:
    """What each try runs, as its user is shown it before anything runs."""

    argv: list[str]
    cwd: str
    environment: list[str]  # each change, with why
    code: list[tuple[str, Path]]  # the code it runs from where the run directory says: (what, where)
    recorded: dict[str, object]  # the command as its record covers it


def confirm_tries(run_dir: Path, findings: list[FindingRecord], step_s: float | None, settings: TrySettings,
                  yes: bool, stdin: TextIO | None = None) -> Diagnosed | None:
    """The run as its user confirmed it, for its tries to run; None when no try would run (the tries say why).
    Raises TryRefusedError or TryNotConfirmedError, having shown the command, when nothing is to run."""
    diagnosed, fixes = _planned(run_dir, findings, step_s, settings)
    if diagnosed is None or not fixes:
        return None
    command = try_command(diagnosed, settings, fixes)
    provenance = check_record(run_dir, command.recorded)
    _show(run_dir, command, provenance, fixes)
    _refuse(run_dir, command, provenance)
    if not (yes and provenance.status == "recorded"):
        _ask(run_dir, provenance, yes, sys.stdin if stdin is None else stdin)
    return diagnosed


def _planned(run_dir: Path, findings: list[FindingRecord], step_s: float | None,
             settings: TrySettings) -> tuple[Diagnosed | None, dict[Remedy, str]]:
    """The run as its tries would repeat it (None when they cannot), and each fix to try with its finding's code."""
    fixes: dict[Remedy, str] = {}
    for finding in findings:
        if chosen(finding, settings) and finding.remedy is not None:
            fixes.setdefault(finding.remedy, finding.code)
    try:
        diagnosed = diagnosed_run(run_dir, step_s)
    except GpudoctorError:
        return None, fixes
    return (None if cannot_try(diagnosed) else diagnosed), fixes


# -- the command ---------------------------------------------------------------------------------------------------
def try_command(diagnosed: Diagnosed, settings: TrySettings, fixes: dict[Remedy, str]) -> TryCommand:
    """The command each try runs: the script's (or module's) own, or torchrun's for a torchrun job."""
    cwd = diagnosed.manifest.cwd or "."
    threads = [f"OMP_NUM_THREADS={fix.intra_op_threads} ({code}'s fix, in the training process)"
               for fix, code in fixes.items() if fix.intra_op_threads is not None]
    if diagnosed.torchrun is None:
        target = diagnosed.manifest.target
        program = ["-m", target.module] if target.module else [target.script or ""]
        return TryCommand([sys.executable, *program, *target.args], cwd, [*_profiled_environment(), *threads],
                          list(_script_code(target.script, target.module, Path(cwd))),
                          script_command(target.script, target.module, target.args, diagnosed.manifest.cwd))
    job = diagnosed.torchrun
    bounded = [*job.rank_options, "--max-steps", str(diagnosed.steps(settings)),
               "--timeout", f"{diagnosed.timeout_s(settings):g}", "--remedy", "<FIX>"]
    argv = rank_command(job.job, diagnosed.run_dir / TRIES_DIR / "<CODE>", bounded)
    environment = [f"{OUTER_ENV}=1 (for torchrun's agent: gpudoctor runs inside it)",
                   *(f"{change}, in each rank" for change in _profiled_environment()), *threads]
    code = [*_script_code(job.job.script, job.job.module, Path(cwd)), *_rules_code(job.rank_options, Path(cwd))]
    return TryCommand(argv, cwd, environment, code, job_command(job.as_recorded(), diagnosed.manifest.cwd))


def _profiled_environment() -> list[str]:
    """What `gpudoctor profile` adds to the environment of the script it runs (README, `gpudoctor profile`)."""
    path = os.pathsep.join(p for p in (str(HOOK_DIR), os.environ.get("PYTHONPATH")) if p)
    return [f"PYTHONPATH={path} (gpudoctor's start-up hook first, to follow the processes the script starts)",
            f"{FOLLOW_ENV}=<gpudoctor's settings for those processes, as JSON>",
            "TEARDOWN_CUPTI=1 when the profiling window opens in a torch built with CUDA 12.6 or later, unless set"]


def _script_code(script: str | None, module: str | None, cwd: Path) -> Iterator[tuple[str, Path]]:
    """The script; or the module's files where `python -m` in `cwd` may find them, and `cwd`, first on its path."""
    if script is not None:
        yield "the script", cwd / script
    if module is None:
        return
    yield "the working directory, from which `python -m` imports first,", cwd
    parts = module.split(".")
    roots = [cwd, *(cwd / p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    for root in roots:
        for depth in range(1, len(parts) + 1):
            base = root.joinpath(*parts[:depth])
            for candidate in (base, base.with_name(base.name + ".py")):
                if candidate.exists():
                    yield f"the module {module}", candidate


def _rules_code(rank_options: list[str], cwd: Path) -> Iterator[tuple[str, Path]]:
    """The rule files a torchrun job's ranks load (--rules PATH, --rules=PATH)."""
    for i, option in enumerate(rank_options):
        if option == "--rules" and i + 1 < len(rank_options):
            yield "the rule file", cwd / rank_options[i + 1]
        elif option.startswith("--rules="):
            yield "the rule file", cwd / option.split("=", 1)[1]


# -- showing, refusing, asking -------------------------------------------------------------------------------------
def _show(run_dir: Path, command: TryCommand, provenance: Provenance, fixes: dict[Remedy, str]) -> None:
    codes = ", ".join(dict.fromkeys(fixes.values()))
    interpreter = sys.executable
    if provenance.interpreter and provenance.interpreter != interpreter:
        interpreter += f" (recorded with {provenance.interpreter})"
    made = {"recorded": provenance.reason, "changed": f"changed since it was recorded: {provenance.reason}",
            "elsewhere": f"made elsewhere: {provenance.reason}"}[provenance.status]
    rows = [("command", [shlex.join(command.argv)]), ("interpreter", [interpreter]), ("directory", [command.cwd]),
            ("environment", command.environment),
            ("fixes", [f"{code}: {fix.describe()}" for fix, code in fixes.items()]),
            ("run directory", [f"{run_dir}, {made}"])]
    _say(f"each try runs this command again, with one fix applied ({codes}):")
    for name, lines in rows:
        for i, line in enumerate(lines):
            terminal.write(f"  {name + ':' if i == 0 else '':<15}{line}")


def _refuse(run_dir: Path, command: TryCommand, provenance: Provenance) -> None:
    for what, path in command.code:
        if inside(run_dir, path):
            raise TryRefusedError(f"refused: {what} {path} lies inside the run directory {run_dir}, and gpudoctor "
                                  "try never runs code that a run directory holds, not even with --yes.")
    if provenance.status == "changed":
        raise TryRefusedError(f"refused: {run_dir}'s command was changed since gpudoctor ran it and recorded it, as "
                              "you on this host, so gpudoctor try does not run it, not even with --yes; profile the "
                              "script again to try its fixes.")


def _ask(run_dir: Path, provenance: Provenance, yes: bool, stdin: TextIO) -> None:
    recorded = provenance.status == "recorded"
    if not stdin.isatty():
        if recorded:
            raise TryNotConfirmedError("nothing was run: there is no terminal to confirm the command above on; to "
                                       f"run it, add --yes: {_again(run_dir)}.")
        raise TryNotConfirmedError(f"nothing was run: {run_dir} was made elsewhere, so only your answer on a terminal "
                                   "confirms the command above (--yes confirms only a run directory recorded by you "
                                   f"on this host): run gpudoctor try {shlex.quote(str(run_dir))} on a terminal.")
    if yes:
        _say(f"--yes confirms only a run directory recorded by you on this host, and {run_dir} was made elsewhere.")
    print("gpudoctor: run it? [y/N] ", end="", file=sys.stderr, flush=True)
    try:
        answer = stdin.readline().strip().lower()
    except KeyboardInterrupt:
        answer = ""
    if answer not in YES:
        raise TryNotConfirmedError("nothing was run: you did not confirm the command above.")


def _again(run_dir: Path) -> str:
    """This command line with --yes: `gpudoctor try --yes ...`."""
    args = sys.argv[1:]
    if "try" not in args:
        return f"gpudoctor try --yes {shlex.quote(str(run_dir))}"
    at = args.index("try") + 1
    return shlex.join(["gpudoctor", *args[:at], "--yes", *args[at:]])


def _say(message: str) -> None:
    terminal.write(f"gpudoctor: {message}")
