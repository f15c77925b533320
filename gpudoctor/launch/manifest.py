"""The run's manifest: written when the script starts (status running), and finished from what its process
reported in its events once it has ended (how it ended, its facts, which collectors worked)."""

from __future__ import annotations

import datetime as dt
import os
import platform
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from gpudoctor._version import __version__
from gpudoctor.bundle import (
    EVENTS,
    MANIFEST,
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
    RankEvent,
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
    LaunchInfo,
    Manifest,
    Target,
    WindowSettings,
)
from gpudoctor.launch.ranks import launched_rank

if TYPE_CHECKING:
    from gpudoctor.launch.request import ProfileRequest
    from gpudoctor.launch.samplers import Samplers


def base_manifest(request: ProfileRequest, samplers: Samplers) -> Manifest:
    window = request.window
    return Manifest(
        schema_version=SCHEMA_VERSION, gpudoctor_version=__version__,
        created=dt.datetime.now(dt.timezone.utc).isoformat(), status="running",
        target=Target(script=request.script, module=request.module, args=request.args), cwd=os.getcwd(),
        python=platform.python_version(),
        host=HostInfo(hostname=socket.gethostname(), platform=platform.platform(), cpu_count=os.cpu_count(),
                      affinity=sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
                      memory_total=_total_memory()),
        launch=_launch_info(),
        gpus=samplers.gpus, driver=samplers.driver,
        window=WindowSettings(wait=window.wait, warmup=window.warmup, active=window.active, detail=window.detail,
                              every_s=window.every_s),
        max_steps=request.max_steps, with_stack=request.with_stack, timeout_s=request.timeout_s,
        collectors=dict(samplers.collectors),
    )


def _launch_info() -> LaunchInfo | None:
    found = launched_rank()
    if found is None:
        return None
    return LaunchInfo(launcher=found.launcher, rank=found.rank, world_size=found.world_size,
                      local_rank=found.local_rank, local_world_size=found.local_world_size,
                      node_rank=found.node_rank, job=found.job)


def _total_memory() -> int | None:
    import psutil

    return psutil.virtual_memory().total


@dataclass
class ChildReport:
    """What the script's process said about itself in its events."""

    end: EndEvent | None = None  # its last event; None when it died without one
    facts: ChildFacts = field(default_factory=ChildFacts)
    collectors: dict[str, CollectorStatus] = field(default_factory=dict)
    windows: list[WindowEvent] = field(default_factory=list)


def child_report(run_dir: Path) -> ChildReport:
    report = ChildReport()
    rank: RankEvent | None = None
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
        elif isinstance(event, RankEvent) and (rank is None or event.source == "init_process_group"):
            rank = event
    return report if rank is None else _with_rank(report, rank)


def _with_rank(report: ChildReport, rank: RankEvent) -> ChildReport:
    """The process's facts with its rank: as torch.distributed numbered it, or as gpudoctor followed it."""
    process = report.facts.process or ProcessFacts()
    process = msgspec.structs.replace(process, rank=rank.rank, world_size=rank.world_size or process.world_size)
    report.facts = msgspec.structs.replace(report.facts, process=process)
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


def finish_manifest(run_dir: Path, manifest: Manifest) -> str | None:
    """Write the final manifest; if the run directory refuses it (disk full), say so instead of failing the run."""
    if not run_dir.is_dir():
        return f"{run_dir} was removed while the script ran: there is no bundle to report on."
    try:
        write_json_atomic(run_dir / MANIFEST, manifest)
    except OSError as exc:
        return f"the run's manifest could not be finished in {run_dir} ({exc.strerror or exc})."
    return None


def exit_info(end: EndEvent | None, ending: str, status: int, returncode: int) -> ExitInfo:
    return ExitInfo(
        ending=ending, status=status, returncode=returncode,
        signal=signal.Signals(-returncode).name if returncode < 0 else None,
        steps=end.steps if end else None,
        exception=ExceptionInfo(exception=end.exception, message=end.message, where=end.where) if end else None,
        ended=end.t if end else None,
    )


def final_manifest(run_dir: Path, manifest: Manifest, samplers: Samplers, child: ChildReport,
                   exit_info: ExitInfo | None, started: float) -> Manifest:
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
