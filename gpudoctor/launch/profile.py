"""`gpudoctor profile`: start the script in a child process, sample it from here, and write the bundle.

The parent outlives a child that crashes, is killed or hangs, so the bundle and report are written
whatever happens to the script. The ranks the script starts (a framework's launcher, mp.spawn) are followed
into (gpudoctor.collect.follow): each writes its bundle in the run directory, finished here with the script's
(gpudoctor.launch.followed).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gpudoctor.bundle import EVENTS, EXITING, MANIFEST, STOPPING, write_json_atomic
from gpudoctor.collect import follow
from gpudoctor.collect.config import ChildConfig
from gpudoctor.collect.stub import child_arguments, child_command
from gpudoctor.launch import followed, inner_job, prestart
from gpudoctor.launch.ending import describe_ending
from gpudoctor.launch.manifest import base_manifest, child_report, exit_info, final_manifest, finish_manifest
from gpudoctor.launch.ranks import torchrun_rank
from gpudoctor.launch.recording import claim, release
from gpudoctor.launch.request import ProfileRequest
from gpudoctor.launch.run_dir import check_script, make_run_dir
from gpudoctor.launch.supervisor import Supervisor, start

if TYPE_CHECKING:
    from gpudoctor.ui.status_line import Progress, ProgressLines


@dataclass
class ProfileOutcome:
    run_dir: Path
    exit_status: int
    ending: str  # completed | exit | exception | signal | timeout | interrupted | max_steps | no_start
    message: str | None  # one sentence for the user when the script did not simply complete
    note: str | None = None  # one sentence when the run directory refused the final manifest
    ranks: list[int] = field(default_factory=list)  # the job's ranks, when the script started ranks of its own
    stopped_ranks: list[int] = field(default_factory=list)  # pids of ranks still running after the script ended


def profile(request: ProfileRequest, meanwhile: Callable[[], None] | None = None) -> ProfileOutcome:
    """Run the script under the instrumentation and the samplers, and finish its bundle (and those of the ranks it
    started); `meanwhile`, which must not raise, runs in this process while the script does."""
    if request.script is not None:
        check_script(request.script)
    run_dir = make_run_dir(request.out, request.target_name)
    claim(run_dir)  # a second `gpudoctor profile` into it is refused while this one records (launch.recording)
    # A rank of a job whose ranks merge themselves says it is alive to the other nodes' ranks waiting for it
    alive = inner_job.heartbeat(run_dir) if inner_job.merges_itself() else contextlib.nullcontext()
    try:
        with alive:
            return _profile_into(run_dir, request, meanwhile)
    finally:
        release(run_dir)


def _profile_into(run_dir: Path, request: ProfileRequest, meanwhile: Callable[[], None] | None) -> ProfileOutcome:
    config = ChildConfig(run_dir=str(run_dir), window=request.window, max_steps=request.max_steps,
                         with_stack=request.with_stack,
                         remedy=request.remedy.to_json() if request.remedy is not None else None)
    # Under torchrun each rank is a `gpudoctor profile` of its own, in JOB/rank-K/: a process it starts with its
    # RANK (a compile worker) finds that rank's directory taken.
    job_dir = run_dir.parent if torchrun_rank() is not None else run_dir
    env = follow.environment(dict(os.environ), follow.FollowConfig(str(job_dir), config, os.getpid()))
    started = time.time()
    arguments = child_arguments(config, request.script, request.module, request.args)
    child = prestart.take(arguments, env) if request.output_log is None else None
    if child is None:
        child = start(child_command(arguments), env, request.output_log)
    # Set up while the script's interpreter starts: the samplers' imports, NVML's start and the GPUs'
    # description do not delay it.
    try:
        from gpudoctor.launch.command_record import script_command, write_record
        from gpudoctor.launch.samplers import Samplers

        # What `gpudoctor try` may run again, recorded as this user on this host (gpudoctor.launch.command_record);
        # a torchrun rank's is its job's, recorded with torchrun's command
        if job_dir == run_dir:
            write_record(run_dir, script_command(request.script, request.module, request.args, os.getcwd()))

        samplers = Samplers(run_dir, request.sample_interval_s)
        manifest = base_manifest(request, samplers)
        write_json_atomic(run_dir / MANIFEST, manifest)
    except BaseException:
        child.kill()
        child.wait()
        raise
    samplers.start(child.pid)
    progress = _progress(run_dir, request) if request.progress else None
    followed_ranks = (list) if job_dir != run_dir else (lambda: followed.followed_pids(run_dir))
    supervisor = Supervisor(child, request.timeout_s, followed_ranks, exiting=(run_dir / EXITING).is_file,
                            exit_grace_s=request.exit_grace_s, on_timeout=lambda: _mark(run_dir / STOPPING))
    try:
        returncode = supervisor.wait(meanwhile)
        for marker in (EXITING, STOPPING):
            (run_dir / marker).unlink(missing_ok=True)
        stopped = followed.end_ranks(run_dir) if job_dir == run_dir else []
    finally:
        if progress is not None:
            progress.stop()
        samplers.stop()
        followed.signal_all(followed.running(followed_ranks()), 9)  # none is left running, whatever happened
    report = child_report(run_dir)
    ending, status, message = describe_ending(request, returncode, report.end, supervisor)
    final = final_manifest(run_dir, manifest, samplers, report, exit_info(report.end, ending, status, returncode),
                           started)
    note = finish_manifest(run_dir, final)
    ranks = followed.finish_job(run_dir, final, samplers) if job_dir == run_dir else []
    return ProfileOutcome(run_dir, status, ending, message, note, ranks, stopped)


def _progress(run_dir: Path, request: ProfileRequest) -> Progress | ProgressLines | None:
    """The status line on a terminal; elsewhere progress lines, from one rank of a torchrun job only."""
    from gpudoctor.ui.status_line import Progress, ProgressLines

    drawn = Progress.start(run_dir / EVENTS, request.window, request.max_steps)
    if drawn is not None or torchrun_rank() not in (None, 0):
        return drawn
    return ProgressLines.start(run_dir / EVENTS, request.window, request.max_steps)


def _mark(path: Path) -> None:
    with contextlib.suppress(OSError):  # without the mark the script prints its traceback, and nothing else changes
        path.touch()
