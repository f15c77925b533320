"""`gpudoctor profile`: start the script in a child process, sample it from here, and write the bundle.

The parent outlives a child that crashes, is killed or hangs, so the bundle and report are written
whatever happens to the script.
"""

from __future__ import annotations

import datetime as dt
import difflib
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from gpudoctor import __version__
from gpudoctor.bundle import (
    EVENTS,
    FINDINGS,
    MANIFEST,
    REPORT,
    SAMPLE_FILES,
    SAMPLES_DIR,
    SCHEMA_VERSION,
    TRACE,
    read_jsonl,
    trace_names,
    write_json_atomic,
)
from gpudoctor.bundle.events import (
    EVENT_DECODER,
    CollectorEvent,
    EndEvent,
    EnvWindowEvent,
    ProcessEvent,
    ProcessFacts,
    TorchEvent,
    TorchFacts,
    WindowEvent,
    WindowFacts,
)
from gpudoctor.bundle.manifest import (
    ChildFacts,
    CollectorStatus,
    ExceptionInfo,
    ExitInfo,
    HostInfo,
    Manifest,
    Target,
    WindowSettings,
)
from gpudoctor.collect.config import ChildConfig, WindowConfig
from gpudoctor.collect.stub import child_command
from gpudoctor.collect.window import LOG
from gpudoctor.errors import EXIT_TIMEOUT, OutputNotWritableError, ScriptNotFoundError, ScriptNotPythonError
from gpudoctor.ranks import torchrun_rank

if TYPE_CHECKING:
    from gpudoctor.collect.samplers import Samplers

STOP_GRACE_S = 10.0  # after SIGINT, how long the script gets to finish its own cleanup before SIGKILL


@dataclass
class ProfileRequest:
    script: str | None
    module: str | None
    args: list[str]
    out: Path | None = None
    window: WindowConfig = field(default_factory=WindowConfig)
    max_steps: int | None = None
    timeout_s: float | None = None
    sample_interval_s: float = 0.1
    with_stack: bool = False
    progress: bool = True  # a status line on stderr while the script runs, when stderr is a terminal

    @property
    def target_name(self) -> str:
        return self.module or Path(self.script or "script").stem


@dataclass
class ProfileOutcome:
    run_dir: Path
    exit_status: int
    ending: str  # completed | exit | exception | signal | timeout | interrupted | max_steps | no_start
    message: str | None  # one sentence for the user when the script did not simply complete
    note: str | None = None  # one sentence when the run directory refused the final manifest


def check_script(script: str) -> None:
    path = Path(script)
    if not path.exists():
        raise ScriptNotFoundError(f"{script} does not exist{_did_you_mean(path) or '.'}")
    if path.is_dir():
        raise ScriptNotFoundError(f"{script} is a directory, not a Python script.")
    try:
        source = path.read_bytes()
    except OSError as exc:
        raise ScriptNotFoundError(f"{script} cannot be read: {exc.strerror}.") from None
    if b"\0" in source:  # compile() reports these as a SyntaxError or a ValueError, depending on the Python
        raise ScriptNotPythonError(f"{script} is not a Python script: it is a binary file (it contains null bytes).")
    try:
        compile(source, script, "exec", dont_inherit=True)
    except SyntaxError as exc:
        where = f" (line {exc.lineno})" if exc.lineno else ""
        raise ScriptNotPythonError(f"{script} is not valid Python: {exc.msg}{where}.") from None


def _did_you_mean(path: Path) -> str:
    """'; did you mean train.py?' when a .py file beside the missing one has a close name, else ''."""
    try:
        neighbours = [p.name for p in path.parent.glob("*.py") if p.is_file()]
    except OSError:
        return ""
    # By stem: the shared ".py" would make any two names look alike.
    close = difflib.get_close_matches(path.stem, [name.removesuffix(".py") for name in neighbours], n=1)
    return f"; did you mean {path.with_name(close[0] + '.py')}?" if close else ""


def make_run_dir(request: ProfileRequest) -> Path:
    """The run directory, made and emptied of an earlier run's files. Under torchrun (`torchrun ... -m gpudoctor
    profile ...`) each rank writes its own bundle, `rank-K/`, in the run directory its ranks share."""
    rank = torchrun_rank()
    if request.out is not None:
        run_dir = request.out
    elif rank is not None:  # every rank's parent is torchrun's agent: one directory for them all
        run_dir = Path("gpudoctor-runs") / f"{request.target_name}-torchrun-{os.getppid()}"
    else:
        run_dir = stamped_dir(Path("gpudoctor-runs"), request.target_name)
    return prepare_run_dir(run_dir / f"rank-{rank}" if rank is not None else run_dir)


def stamped_dir(parent: Path, name: str) -> Path:
    """parent/name-YYYYmmdd-HHMMSS, with -2, -3, ... after it when that exists already."""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir, suffix = parent / f"{name}-{stamp}", 1
    while run_dir.exists():
        suffix += 1
        run_dir = parent / f"{name}-{stamp}-{suffix}"
    return run_dir


def prepare_run_dir(run_dir: Path, earlier: Iterable[Path] = ()) -> Path:
    """`run_dir` made, writable, and emptied of an earlier run's files (and of those of the `earlier` bundles in
    it); its absolute path. Raises OutputNotWritableError, naming --out, when it cannot be written."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        for directory in (run_dir, *earlier):
            _remove_previous_run(directory)
        probe = run_dir / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise OutputNotWritableError(
            f"cannot write to {run_dir} ({exc.strerror}); choose another directory with --out."
        ) from None
    return run_dir.resolve()


def _remove_previous_run(run_dir: Path) -> None:
    """An --out directory used before: its files would mix with this run's (events and samples are appended)."""
    for name in (MANIFEST, EVENTS, LOG, *trace_names(run_dir), FINDINGS, REPORT,
                 *(f"{SAMPLES_DIR}/{f}" for f in SAMPLE_FILES.values())):
        (run_dir / name).unlink(missing_ok=True)


def _base_manifest(request: ProfileRequest, samplers: Samplers) -> Manifest:
    window = request.window
    return Manifest(
        schema_version=SCHEMA_VERSION, gpudoctor_version=__version__,
        created=dt.datetime.now(dt.timezone.utc).isoformat(), status="running",
        target=Target(script=request.script, module=request.module, args=request.args), cwd=os.getcwd(),
        python=platform.python_version(),
        host=HostInfo(hostname=socket.gethostname(), platform=platform.platform(), cpu_count=os.cpu_count(),
                      affinity=sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
                      memory_total=_total_memory()),
        gpus=samplers.gpus, driver=samplers.driver,
        window=WindowSettings(wait=window.wait, warmup=window.warmup, active=window.active, detail=window.detail,
                              every_s=window.every_s),
        max_steps=request.max_steps, with_stack=request.with_stack, timeout_s=request.timeout_s,
        collectors=dict(samplers.collectors),
    )


def _total_memory() -> int | None:
    import psutil

    return psutil.virtual_memory().total


class _Supervisor:
    """Waits for the child, enforcing --timeout and passing Ctrl-C on, and says how it ended."""

    def __init__(self, child: subprocess.Popen, timeout_s: float | None) -> None:
        self.child = child
        self.timeout_s = timeout_s
        self.timed_out = False
        self.interrupted = 0

    def _on_sigint(self, signum: int, frame: Any) -> None:
        # The terminal already sent SIGINT to the script too (same process group); a second Ctrl-C kills it.
        self.interrupted += 1
        if self.interrupted == 1 and not _terminal_sent_to_group():
            self.child.send_signal(signal.SIGINT)
        elif self.interrupted > 1:
            self.child.kill()

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.child.send_signal(signal.SIGTERM)

    def wait(self, meanwhile: Callable[[], None] | None = None) -> int:
        """Run `meanwhile` (which must not raise), then wait; Ctrl-C and SIGTERM go to the child all along."""
        previous = signal.signal(signal.SIGINT, self._on_sigint), signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            deadline = time.monotonic() + self.timeout_s if self.timeout_s else None
            if meanwhile is not None:
                meanwhile()
            while True:
                try:
                    remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                    return self.child.wait(timeout=remaining)
                except subprocess.TimeoutExpired:
                    self.timed_out = True
                    return self._stop_child()
        finally:
            signal.signal(signal.SIGINT, previous[0])
            signal.signal(signal.SIGTERM, previous[1])

    def _stop_child(self) -> int:
        """Ask nicely (SIGINT, so the window's trace is written), then insist."""
        for sig, grace in ((signal.SIGINT, STOP_GRACE_S), (signal.SIGTERM, 3.0)):
            self.child.send_signal(sig)
            try:
                return self.child.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                continue
        self.child.kill()
        return self.child.wait()


def _terminal_sent_to_group() -> bool:
    """Whether a SIGINT came from the terminal's Ctrl-C, which the script's process received as well."""
    for stream in (sys.stdin, sys.stderr):
        try:
            if stream is not None and stream.isatty():
                return os.tcgetpgrp(stream.fileno()) == os.getpgrp()
        except (OSError, ValueError):
            continue
    return False


def exit_status_of(returncode: int) -> int:
    """A child killed by signal N reports -N; a shell, and gpudoctor, report 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass
class ChildReport:
    """What the script's process said about itself in its events."""

    end: EndEvent | None = None  # its last event; None when it died without one
    facts: ChildFacts = field(default_factory=ChildFacts)
    collectors: dict[str, CollectorStatus] = field(default_factory=dict)
    windows: list[WindowEvent] = field(default_factory=list)


def _child_report(run_dir: Path) -> ChildReport:
    report = ChildReport()
    path = run_dir / EVENTS
    if not path.is_file():
        return report
    for event in read_jsonl(path, EVENT_DECODER):
        if isinstance(event, EndEvent):
            report.end = event
        elif isinstance(event, CollectorEvent):
            report.collectors[event.name] = CollectorStatus(ok=event.ok, reason=event.reason)
        elif isinstance(event, WindowEvent):
            report.windows.append(event)
        elif isinstance(event, (ProcessEvent, TorchEvent, EnvWindowEvent)):
            report.facts = _with_facts(report.facts, event)
    return report


def _with_facts(facts: ChildFacts, event: ProcessEvent | TorchEvent | EnvWindowEvent) -> ChildFacts:
    """The child's facts with one more of its fact events (the last of each kind wins)."""
    if isinstance(event, ProcessEvent):
        return msgspec.structs.replace(facts, process=msgspec.convert(_facts_of(event), ProcessFacts))
    if isinstance(event, TorchEvent):
        return msgspec.structs.replace(facts, torch=msgspec.convert(_facts_of(event), TorchFacts))
    return msgspec.structs.replace(facts, env_window=msgspec.convert(_facts_of(event), WindowFacts))


def _facts_of(event: ProcessEvent | TorchEvent | EnvWindowEvent) -> dict[str, object]:
    facts = msgspec.structs.asdict(event)
    facts.pop("t", None)
    return facts


def describe_ending(request: ProfileRequest, returncode: int, end: EndEvent | None,
                    supervisor: _Supervisor) -> tuple[str, int, str | None]:
    name = request.module or request.script
    status = exit_status_of(returncode)
    if supervisor.timed_out:
        message = f"{name} was still running after --timeout {request.timeout_s:g} s, so gpudoctor stopped it."
        return "timeout", EXIT_TIMEOUT, message
    if end is not None and end.reason == "max_steps":
        return "max_steps", 0, f"stopped {name} after --max-steps {request.max_steps}, as asked."
    if returncode < 0:
        sig = signal.Signals(-returncode)
        if sig == signal.SIGINT:
            return "interrupted", status, f"{name} was interrupted (Ctrl-C)."
        return "signal", status, f"{name} was killed by {sig.name} (exit status {status})."
    if end is not None and end.reason == "exception":
        return "exception", status, f"{name} raised {end.exception}: {(end.message or '')[:200]}"
    if status != 0:
        return "exit", status, f"{name} exited with status {status}."
    return "completed", 0, None


def profile(request: ProfileRequest, meanwhile: Callable[[], None] | None = None) -> ProfileOutcome:
    """Run the script under the instrumentation and the samplers, and finish its bundle; `meanwhile`, which must not
    raise, runs in this process while the script does."""
    if request.script is not None:
        check_script(request.script)
    run_dir = make_run_dir(request)
    config = ChildConfig(run_dir=str(run_dir), window=request.window, max_steps=request.max_steps,
                         with_stack=request.with_stack)
    started = time.time()
    child = subprocess.Popen(child_command(config, request.script, request.module, request.args))
    # Set up while the script's interpreter starts: the samplers' imports, NVML's start and the GPUs'
    # description do not delay it.
    try:
        from gpudoctor.collect.samplers import Samplers
        from gpudoctor.ui.status_line import Progress

        samplers = Samplers(run_dir, request.sample_interval_s)
        manifest = _base_manifest(request, samplers)
        write_json_atomic(run_dir / MANIFEST, manifest)
    except BaseException:
        child.kill()
        child.wait()
        raise
    samplers.start(child.pid)
    progress = Progress.start(run_dir / EVENTS, request.window, request.max_steps) if request.progress else None
    supervisor = _Supervisor(child, request.timeout_s)
    try:
        returncode = supervisor.wait(meanwhile)
    finally:
        if progress is not None:
            progress.stop()
        samplers.stop()
    child_report = _child_report(run_dir)
    ending, status, message = describe_ending(request, returncode, child_report.end, supervisor)
    exit_info = _exit_info(child_report.end, ending, status, returncode)
    final = _final_manifest(run_dir, manifest, samplers, child_report, exit_info, started)
    return ProfileOutcome(run_dir, status, ending, message, _finish_manifest(run_dir, final))


def _finish_manifest(run_dir: Path, manifest: Manifest) -> str | None:
    """Write the final manifest; if the run directory refuses it (disk full), say so instead of failing the run."""
    try:
        write_json_atomic(run_dir / MANIFEST, manifest)
    except OSError as exc:
        return f"the run's manifest could not be finished in {run_dir} ({exc.strerror or exc})."
    return None


def _exit_info(end: EndEvent | None, ending: str, status: int, returncode: int) -> ExitInfo:
    return ExitInfo(
        ending=ending, status=status, returncode=returncode,
        signal=signal.Signals(-returncode).name if returncode < 0 else None,
        steps=end.steps if end else None,
        exception=ExceptionInfo(exception=end.exception, message=end.message, where=end.where) if end else None,
    )


def _final_manifest(run_dir: Path, manifest: Manifest, samplers: Samplers, child: ChildReport, exit_info: ExitInfo,
                    started: float) -> Manifest:
    collectors = {**samplers.collectors, **child.collectors}
    collectors.setdefault("profiler", _profiler_status(run_dir, child))
    collectors.setdefault("cuda_trace", _cuda_trace_status(child))
    files = [name for name in (EVENTS,) if (run_dir / name).is_file()] + trace_names(run_dir)
    files += [f"{SAMPLES_DIR}/{f}" for f in SAMPLE_FILES.values() if (run_dir / SAMPLES_DIR / f).is_file()]
    return msgspec.structs.replace(manifest, status="finished", duration_s=time.time() - started, exit=exit_info,
                                   child=child.facts, collectors=collectors, files=files)


def _cuda_trace_status(child: ChildReport) -> CollectorStatus:
    """Whether the window recorded GPU activity, and if not, why."""
    opened = [e for e in child.windows if e.state == "opened"]
    if opened and opened[-1].cuda:
        return CollectorStatus(ok=True)
    if child.facts.torch is not None and child.facts.torch.cuda_built is False:
        return CollectorStatus(ok=False, reason="this torch is built without CUDA")
    if not opened:
        return CollectorStatus(ok=False, reason="no profiling window was opened")
    return CollectorStatus(ok=False, reason="the script had not initialized CUDA when the profiling window opened")


def _profiler_status(run_dir: Path, child: ChildReport) -> CollectorStatus:
    if (run_dir / TRACE).is_file():
        return CollectorStatus(ok=True)
    if any(e.state == "opened" for e in child.windows):
        return CollectorStatus(ok=False, reason="the script ended before the profiling window could write its trace")
    if child.end is None:
        return CollectorStatus(ok=False, reason="the script's process ended without reporting (killed or crashed) "
                                                "before the window closed")
    if child.end.steps == 0:
        return CollectorStatus(ok=False, reason="no training step was detected (no gpudoctor.step(), optimizer.step(), "
                                                "backward(), DataLoader batch or model call)")
    return CollectorStatus(ok=False, reason=f"the script ran {child.end.steps} steps, fewer than the window's wait")
