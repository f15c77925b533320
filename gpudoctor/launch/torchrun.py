"""`gpudoctor profile ... torchrun ...`: profile every rank of a torchrun job, never torchrun's agent itself.

gpudoctor rewrites the command into the form where gpudoctor runs inside torchrun,
`python -m torch.distributed.run OPTIONS -m gpudoctor profile --out RUN ... SCRIPT ARGS`, so that each rank is a
`gpudoctor profile` that writes its own bundle, RUN/rank-K/, and nothing else; when torchrun has ended, the command
line analyses every rank once and writes each rank's report with the job's.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NoReturn

from gpudoctor.bundle import Manifest, read_manifest, write_json_atomic
from gpudoctor.bundle.confined import bundle_file
from gpudoctor.bundle.layout import rank_dirs
from gpudoctor.errors import BundleError, GpudoctorError
from gpudoctor.launch.command_record import job_command, write_record
from gpudoctor.launch.inner_job import OUTER_ENV
from gpudoctor.launch.run_dir import check_script, prepare_run_dir, stamped_dir
from gpudoctor.launch.supervisor import Supervisor, exit_status_of, start, terminal_sent_to_group

TORCHRUN_MODULE = "torch.distributed.run"
RANK_FORMATS = "json,html"  # no summary in a rank: it says how its script ended in a line of its own
FINE_ENDINGS = ("completed", "max_steps")
JOB_COMMAND = "torchrun.json"  # in the job's run directory: torchrun's options, the script, its arguments


class TorchrunUsageError(GpudoctorError):
    """torchrun's arguments cannot be profiled as given (a usage error: exit status 2)."""

    exit_status = 2


@dataclass(frozen=True)
class TorchrunJob:
    """A torchrun command taken apart: torchrun's own options, and what each rank runs."""

    options: list[str]  # torchrun's options, its -m/--module left out (the ranks run `-m gpudoctor`)
    script: str | None
    module: str | None
    args: list[str]

    @property
    def name(self) -> str:
        return self.module or Path(self.script or "script").stem

    @property
    def nodes(self) -> int:
        """The most nodes the job may run on (--nnodes N, or MIN:MAX for an elastic job); 1 when not given."""
        value = None
        for i, option in enumerate(self.options):
            if option in ("--nnodes", "--nnodes_") and i + 1 < len(self.options):
                value = self.options[i + 1]
            elif option.startswith("--nnodes="):
                value = option.split("=", 1)[1]
        try:
            return max(1, int((value or "1").split(":")[-1]))
        except ValueError:
            return 1


@dataclass(frozen=True)
class JobOutcome:
    run_dir: Path
    exit_status: int  # torchrun's own, a signal N as 128 + N
    message: str | None  # one sentence when torchrun failed: which ranks, and how
    nodes: int = 1  # a job of several nodes: its ranks merge its report themselves, none is made here


def is_torchrun(script: str | None, module: str | None) -> bool:
    """Whether the target is torchrun (`-m torch.distributed.run`, or the `torchrun` console script)."""
    if module is not None:
        return module == TORCHRUN_MODULE
    if script is None or Path(script).name != "torchrun":
        return False
    # A bare `torchrun` is a file of the working directory if there is one, as `python torchrun` would run it.
    return script != "torchrun" or (not Path(script).exists() and shutil.which(script) is not None)


def parse_torchrun(args: list[str]) -> TorchrunJob:
    """torchrun's arguments split where its own parser finds the script (or module) to run."""
    from torch.distributed.run import get_args_parser  # torch only for this form: it takes a second to import

    parser = get_args_parser()
    parser.error = _refuse  # type: ignore[method-assign]  # a usage error in one sentence, instead of argparse's usage and exit
    parsed = parser.parse_args(args)
    if parsed.no_python:
        raise TorchrunUsageError("torchrun's --no-python runs the script as a program, but gpudoctor profiles each "
                                 "rank as a Python process: leave --no-python out.")
    if parsed.run_path:
        raise TorchrunUsageError("torchrun's --run-path runs the script through runpy.run_path, but gpudoctor runs "
                                 "each rank's script itself, as python would: leave --run-path out.")
    target, target_args = parsed.training_script, list(parsed.training_script_args)
    start = _target_index(args, target, target_args)
    options = [arg for arg in args[:start] if arg != "--" and not _is_module_flag(arg)]
    return TorchrunJob(options, None if parsed.module else target, target if parsed.module else None, target_args)


def _refuse(message: str) -> NoReturn:
    if "training_script" in message:
        raise TorchrunUsageError("give torchrun a script to run after its options, or -m MODULE.")
    raise TorchrunUsageError(f"torchrun cannot read its arguments: {message}.")


def _target_index(args: list[str], target: str, target_args: list[str]) -> int:
    """Where the script starts: the first place it stands followed by its arguments (argparse drops the first `--`)."""
    for i, arg in enumerate(args):
        rest = args[i + 1:]
        if arg == target and (rest == target_args or (rest[:1] == ["--"] and rest[1:] == target_args)):
            return i
    return args.index(target)  # not reached: the parser took the target from args


def _is_module_flag(arg: str) -> bool:
    """torchrun's -m, also as argparse takes it abbreviated (--mod, --modu, ...)."""
    return arg == "-m" or (arg.startswith("--mod") and "--module".startswith(arg))


def rank_command(job: TorchrunJob, run_dir: Path, rank_options: list[str]) -> list[str]:
    """torchrun with `gpudoctor profile` as each rank, all writing into run_dir."""
    target = ["-m", job.module] if job.module is not None else ["--", job.script or ""]
    return [sys.executable, "-m", TORCHRUN_MODULE, *job.options, "-m", "gpudoctor", "profile",
            "--out", str(run_dir), "--format", RANK_FORMATS, *rank_options, *target, *job.args]


def make_job_dir(out: Path | None, name: str) -> Path:
    """The job's run directory, as launcher.make_run_dir makes one: the default is stamped, and an --out used before
    loses an earlier run's files (its report, its rank bundles), which would mix with this job's."""

    run_dir = out if out is not None else stamped_dir(Path("gpudoctor-runs"), f"{name}-torchrun")
    return prepare_run_dir(run_dir, rank_dirs(run_dir, with_manifest=False).values())


class _AgentSupervisor(Supervisor):
    """Passes Ctrl-C and SIGTERM on to torchrun's agent, as the launcher does to a script, but never kills the agent:
    the ranks run in sessions of their own, and only the agent stops them."""

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if not terminal_sent_to_group():  # the terminal's Ctrl-C reached torchrun already
            self.child.send_signal(signal.SIGINT)


def run_job(job: TorchrunJob, out: Path | None, rank_options: list[str],
            output_log: Path | None = None) -> JobOutcome:
    """Run torchrun with gpudoctor inside it and wait for it; the ranks' output is the terminal's, or `output_log`'s.
    The command is kept in the run directory (JOB_COMMAND), for `gpudoctor try` to run the job again."""
    if job.script is not None:
        check_script(job.script)  # once here, rather than once per rank
    command = JobCommand(job, rank_options, os.getcwd())
    if job.nodes > 1:
        return _run_node(job, out, command, rank_options, output_log)
    run_dir = make_job_dir(out, job.name)
    write_json_atomic(run_dir / JOB_COMMAND, command.as_recorded())
    write_record(run_dir, job_command(command.as_recorded(), command.cwd))  # what `gpudoctor try` may run again
    agent = start(rank_command(job, run_dir, rank_options), {**os.environ, OUTER_ENV: "1"}, output_log)
    returncode = _AgentSupervisor(agent, None).wait()
    status = exit_status_of(returncode)
    return JobOutcome(run_dir, status, None if returncode == 0 else failure_sentence(run_dir, returncode))


def node_command_file() -> str:
    """Where one node of a job of several keeps its torchrun command: its own file, never another node's."""
    return f"torchrun-{socket.gethostname()}-{os.getpid()}.json"


def _run_node(job: TorchrunJob, out: Path | None, command: JobCommand, rank_options: list[str],
              output_log: Path | None) -> JobOutcome:
    """One node of a job of several (`--nnodes`): the run directory may be another node's too (a shared --out), so
    nothing in it is emptied here (each rank empties its own rank-K/), the command is kept in this node's own file,
    and the ranks merge the job's report themselves (gpudoctor.launch.inner_job): the last rank to end, once every
    rank has, or each node's own where the nodes write their own directories."""
    run_dir = out if out is not None else stamped_dir(Path("gpudoctor-runs"), f"{job.name}-torchrun")
    run_dir = prepare_run_dir(run_dir)
    write_json_atomic(run_dir / node_command_file(), command.as_recorded())
    agent = start(rank_command(job, run_dir, rank_options), dict(os.environ), output_log)
    returncode = _AgentSupervisor(agent, None).wait()
    status = exit_status_of(returncode)
    return JobOutcome(run_dir, status, None if returncode == 0 else failure_sentence(run_dir, returncode),
                      nodes=job.nodes)


@dataclass(frozen=True)
class JobCommand:
    """A torchrun job as gpudoctor ran it: what `gpudoctor try` runs again."""

    job: TorchrunJob
    rank_options: list[str]
    cwd: str

    def as_recorded(self) -> dict[str, object]:
        """As JOB_COMMAND holds it."""
        return {**asdict(self.job), "rank_options": self.rank_options, "cwd": self.cwd}


def read_job_command(run_dir: Path) -> JobCommand | None:
    """The job's command (JOB_COMMAND), or None for a job run directory without one (written before it was kept)."""
    path = bundle_file(run_dir, JOB_COMMAND)  # never a link out of the run directory
    if path is None:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        job = TorchrunJob(options=list(data["options"]), script=data["script"], module=data["module"],
                          args=list(data["args"]))
        return JobCommand(job, list(data["rank_options"]), str(data["cwd"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def failure_sentence(run_dir: Path, returncode: int) -> str:
    """How torchrun ended and which ranks failed, as their manifests record it: the failures before the ranks
    that were only stopped (torchrun stops the others when one fails)."""

    status = exit_status_of(returncode)
    head = (f"torchrun was killed by {signal.Signals(-returncode).name} (exit status {status})" if returncode < 0
            else f"torchrun exited with status {status}")
    ranks = [(rank, _rank_manifest(rank_dir)) for rank, rank_dir in rank_dirs(run_dir, with_manifest=False).items()]
    failed = [_rank_failure(rank, manifest) for rank, manifest in ranks]
    said = sorted((s for s in failed if s), key=lambda s: " was stopped " in s)
    return f"{head}; {', '.join(said)}." if said else f"{head}."


def _rank_manifest(rank_dir: Path) -> Manifest | None:
    try:
        return read_manifest(rank_dir)
    except (BundleError, OSError):
        return None


def _rank_failure(rank: int, manifest: Manifest | None) -> str | None:
    """How one rank ended, when not well ('rank 1 failed (status 1: ValueError: ...)'); None when it did."""
    end = manifest.exit if manifest is not None else None
    if end is None:
        return f"rank {rank} ended before its bundle was finished"
    if end.ending in FINE_ENDINGS:
        return None
    if end.ending in ("signal", "interrupted") and end.signal:
        return f"rank {rank} was stopped by {end.signal} (status {end.status})"
    if end.ending == "timeout":
        return f"rank {rank} was stopped by --timeout (status {end.status})"
    raised = end.exception if end.ending == "exception" else None
    if raised is not None and raised.exception:
        lines = (raised.message or "").strip().splitlines()
        message = lines[0][:120] if lines else ""
        return f"rank {rank} failed (status {end.status}: {raised.exception}{': ' + message if message else ''})"
    return f"rank {rank} failed (status {end.status})"

