"""The ranks gpudoctor followed into (gpudoctor.collect.follow), seen from gpudoctor's own process.

While the job runs they are the rank bundles appearing in the run directory, each naming its process; when the
script's own process has ended, the ranks still running get a moment to end too, then are stopped, so that no
process of the job outlives gpudoctor. Then each rank's bundle is finished here, as the launcher finishes the
script's: its manifest (how the rank ended, its facts), and its share of the samples taken once for the whole job
(its own processes; the host, with the job's other processes as the job's own demand; the GPUs). The script's own
bundle joins them as the rank it was (Lightning's launcher trains as rank 0), or, when it only started the ranks
(mp.spawn, accelerate launch), it moves to `launcher/`: the run directory then holds the job, and its findings.json
and report.html are the merged ones.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from gpudoctor.bundle import EVENTS, MANIFEST, SAMPLE_FILES, SAMPLES_DIR, JsonlWriter, read_jsonl, write_json_atomic
from gpudoctor.bundle.events import EVENT_DECODER, EndEvent, ProcessEvent, RankEvent, StepEvent, StepSpanEvent
from gpudoctor.bundle.layout import rank_dirs
from gpudoctor.bundle.manifest import ExceptionInfo, ExitInfo, Manifest
from gpudoctor.bundle.samples import GpuRow, HostRow, ProcsRow
from gpudoctor.errors import BundleError
from gpudoctor.launch.manifest import ChildReport, child_report, final_manifest

if TYPE_CHECKING:
    from gpudoctor.launch.samplers import Samplers

LAUNCHER_DIR = "launcher"  # the script's own bundle, when its process only started the ranks
RANKS_GRACE_S = 30.0  # after the script's own process ended, how long its ranks get to end by themselves
STOP_GRACE_S = 10.0  # after SIGTERM (which writes their bundles), how long before SIGKILL
POLL_S = 0.1
# A followed process's ending, as the manifest spells a script's (EndEvent.reason -> ExitInfo.ending)
ENDINGS = {"completed": "completed", "exit": "exit", "exception": "exception", "max_steps": "max_steps",
           "interrupted": "interrupted", "terminated": "signal"}
_ROWS = {"host": HostRow, "procs": ProcsRow, "gpu": GpuRow}


def first_pid(bundle: Path) -> int | None:
    """The process that records into `bundle`, from its first process event."""
    try:
        for event in read_jsonl(bundle / EVENTS, EVENT_DECODER):
            if isinstance(event, ProcessEvent):
                return event.pid
    except (OSError, BundleError):
        return None
    return None


def followed_pids(job_dir: Path) -> list[int]:
    """The processes of the ranks followed so far."""
    return [pid for pid in (first_pid(d) for d in rank_dirs(job_dir, with_manifest=False).values()) if pid is not None]


def running(pids: Iterable[int]) -> list[int]:
    import psutil

    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.Error:
            continue
    return alive


def signal_all(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            continue


def end_ranks(job_dir: Path, grace_s: float = RANKS_GRACE_S) -> list[int]:
    """Wait for the followed ranks to end, at most `grace_s`; then SIGTERM (their bundles are written), then
    SIGKILL. The ranks that had to be stopped."""
    deadline = time.monotonic() + grace_s
    while (alive := running(followed_pids(job_dir))) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    if not alive:
        return []
    signal_all(alive, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while running(alive) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    signal_all(running(alive), signal.SIGKILL)
    return alive


@dataclass(frozen=True)
class Followed:
    """A bundle of the job: its directory, its process, and what it reported."""

    path: Path
    pid: int | None
    report: ChildReport
    steps: int
    group_rank: int | None  # its rank once it joined a process group
    started: float | None  # its first event's time


    @classmethod
    def read(cls, path: Path) -> Followed:
        report, steps, group_rank, started = child_report(path), 0, None, None
        for event in read_jsonl(path / EVENTS, EVENT_DECODER) if (path / EVENTS).is_file() else ():
            started = event.t if started is None else started
            if isinstance(event, StepEvent):
                steps += 1
            elif isinstance(event, StepSpanEvent):
                steps += event.last_step - event.first_step + 1
            elif isinstance(event, RankEvent) and event.source == "init_process_group":
                group_rank = event.rank
        process = report.facts.process
        return cls(path, process.pid if process else None, report, steps, group_rank, started)

    @property
    def ended_badly(self) -> bool:
        return self.report.end is None or self.report.end.reason not in ("completed", "max_steps")

    @property
    def is_rank(self) -> bool:
        """A helper that inherited its rank's environment (a compile worker) claims a rank too; it never joins
        a process group nor takes a step, and ends well."""
        return self.group_rank is not None or self.steps > 0 or self.ended_badly


def finish_job(job_dir: Path, root: Manifest, samplers: Samplers, ranks_on_host: int | None = None) -> list[int]:
    """Finish every followed rank's bundle and place the script's own; the ranks of the job, or [] when the
    script followed none (a single process, whose bundle is the run directory itself)."""
    followed = {number: Followed.read(path) for number, path in rank_dirs(job_dir, with_manifest=False).items()}
    for number, one in list(followed.items()):
        if not one.is_rank:
            shutil.rmtree(one.path, ignore_errors=True)
            del followed[number]
    if not followed:
        return []
    own = Followed.read(job_dir)
    own_dir = _place_own_bundle(job_dir, own, followed)
    if own.group_rank is not None and own_dir.name != LAUNCHER_DIR:
        followed[own.group_rank] = Followed.read(own_dir)
    members = _members(own_dir, own.pid, followed)
    _split_samples(job_dir, own_dir, members)
    world = len(followed)
    for number, one in followed.items():
        if one.path != own_dir:
            _write_rank_manifest(one, number, root, samplers, ranks_on_host or world)
        else:
            _set_rank(own_dir, number, ranks_on_host or world)
    return sorted(followed)


def _place_own_bundle(job_dir: Path, own: Followed, followed: dict[int, Followed]) -> Path:
    """The script's own bundle moved into the job: as its rank when it joined the group, else as the launcher."""
    rank = own.group_rank
    target = job_dir / (f"rank-{rank}" if rank is not None and rank not in followed else LAUNCHER_DIR)
    target.mkdir(exist_ok=True)
    for entry in list(job_dir.iterdir()):
        if entry.is_file() and not entry.name.startswith("."):
            os.replace(entry, target / entry.name)
    return target


def _members(own_dir: Path, own_pid: int | None, followed: dict[int, Followed]) -> dict[Path, int]:
    """Each bundle's own process: the samples of its tree are its share."""
    found = {one.path: one.pid for one in followed.values() if one.pid is not None}
    if own_pid is not None:
        found[own_dir] = own_pid
    return found


def _split_samples(job_dir: Path, own_dir: Path, members: dict[Path, int]) -> None:
    """Each bundle's samples from the job's: its own process tree (with none of another bundle's processes),
    the host's with the job's other processes as its `job_cpu`, and every GPU's."""
    source = job_dir / SAMPLES_DIR
    rows = {kind: _read_rows(source / name, _ROWS[kind]) for kind, name in SAMPLE_FILES.items()}
    roots = set(members.values())
    for bundle, pid in members.items():
        own_procs = [_subtree(row, pid, roots) for row in rows["procs"]]
        trees = {round(row.t, 6): {p.pid for p in row.procs} for row in own_procs}
        everyone = {round(row.t, 6): row for row in rows["procs"]}
        host = [_with_job_cpu(row, everyone.get(round(row.t, 6)), trees.get(round(row.t, 6), set()))
                for row in rows["host"]]
        _write_rows(bundle / SAMPLES_DIR / SAMPLE_FILES["procs"], own_procs)
        _write_rows(bundle / SAMPLES_DIR / SAMPLE_FILES["host"], host)
        _write_rows(bundle / SAMPLES_DIR / SAMPLE_FILES["gpu"], rows["gpu"])
    if own_dir != job_dir:
        shutil.rmtree(source, ignore_errors=True)


def _read_rows(path: Path, row_type: type) -> list:
    if not path.is_file():
        return []
    try:
        return list(read_jsonl(path, msgspec.json.Decoder(row_type)))
    except (OSError, BundleError):
        return []


def _subtree(row: ProcsRow, pid: int, roots: set[int]) -> ProcsRow:
    """The processes of `row` under `pid` (it first), leaving out the trees of the other bundles' processes."""
    children: dict[int, list] = {}
    for proc in row.procs:
        if proc.ppid is not None:
            children.setdefault(proc.ppid, []).append(proc)
    own = [p for p in row.procs if p.pid == pid]
    queue = list(own)
    while queue:
        for child in children.get(queue.pop().pid, ()):
            if child.pid not in roots:
                own.append(child)
                queue.append(child)
    return msgspec.structs.replace(row, procs=own)


def _with_job_cpu(row: HostRow, everyone: ProcsRow | None, own: set[int]) -> HostRow:
    if everyone is None:
        return row
    others = {str(p.pid): round(p.cpu_s, 3) for p in everyone.procs if p.pid not in own}
    return msgspec.structs.replace(row, job_cpu={**(row.job_cpu or {}), **others})


def _write_rows(path: Path, rows: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    writer = JsonlWriter(path, keep_free=False)  # the job has ended: its samples, moved, take no more room
    for row in rows:
        writer.write(row)
    writer.close()


def _write_rank_manifest(one: Followed, rank: int, root: Manifest, samplers: Samplers, ranks_on_host: int) -> None:
    report = _with_rank(one.report, rank, ranks_on_host)
    end = report.end
    manifest = final_manifest(one.path, root, samplers, report, _exit_of(end), one.started or time.time())
    ended = end.t if end is not None and end.t is not None else None
    duration = ended - one.started if ended is not None and one.started is not None else None
    write_json_atomic(one.path / MANIFEST, msgspec.structs.replace(manifest, duration_s=duration))


def _set_rank(bundle: Path, rank: int, ranks_on_host: int) -> None:
    """The script's own bundle, now a rank: its manifest says which, and how many ranks share the host."""
    from gpudoctor.bundle.manifest import read_manifest

    try:
        manifest = read_manifest(bundle)
    except BundleError:
        return
    report = _with_rank(ChildReport(facts=manifest.child), rank, ranks_on_host)
    write_json_atomic(bundle / MANIFEST, msgspec.structs.replace(manifest, child=report.facts))


def _with_rank(report: ChildReport, rank: int, ranks_on_host: int) -> ChildReport:
    from gpudoctor.bundle.events import ProcessFacts

    process = report.facts.process or ProcessFacts()
    process = msgspec.structs.replace(process, rank=rank, world_size=process.world_size or ranks_on_host,
                                      local_world_size=ranks_on_host)
    return ChildReport(report.end, msgspec.structs.replace(report.facts, process=process), report.collectors,
                       report.windows)


def _exit_of(end: EndEvent | None) -> ExitInfo | None:
    """How a followed rank ended, from its end event; None when it ended without one (killed, crashed)."""
    if end is None:
        return None
    ending = ENDINGS.get(end.reason, end.reason)
    signal_name = "SIGTERM" if end.reason == "terminated" else "SIGINT" if end.reason == "interrupted" else None
    status = end.code if end.code is not None else (128 + signal.Signals[signal_name] if signal_name else None)
    return ExitInfo(ending=ending, status=status, signal=signal_name, steps=end.steps,
                    exception=ExceptionInfo(exception=end.exception, message=end.message, where=end.where),
                    ended=end.t)
