"""A launcher around gpudoctor (`torchrun ... -m gpudoctor profile --out RUN train.py`, `srun gpudoctor profile ...`,
`mpirun ...`): each rank is a `gpudoctor profile` of its own, writing RUN/rank-K/ (K its global rank), and one rank
merges the job's report into RUN's findings.json and report.html, as `gpudoctor profile torchrun ...` does once
torchrun has ended.

A rank says it is done (its bundle finished and analysed) with a marker in its bundle naming its job (what every rank
of it shares, gpudoctor.launch.ranks) and its host. Then:
- where every rank of the job has its marker in RUN (one node, or several writing one shared RUN), the rank that
  sees them all takes the job's merge, once (an exclusive lock file): the job-wide report;
- where RUN holds only this node's ranks of the job (each node writes its own directory), the node's last rank
  merges them: the report names the ranks that are elsewhere, and `gpudoctor analyze RUN_NODE0 RUN_NODE1 ...`
  merges the nodes' directories into the job's report;
- where another node's ranks of the job are in RUN and still running, the node's last rank waits for them, at most
  JOB_WAIT_S, then merges what is there, naming the ranks missing.
A rank directory is never removed while it may be this job's: only one whose manifest names another job (an earlier
run into the same RUN) goes, when the merge is taken. Once written, `.merged-JOB` in RUN tells a rank of another
node still waiting that the job's report is there.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from gpudoctor.bundle.layout import rank_dirs
from gpudoctor.bundle.manifest import read_manifest
from gpudoctor.errors import GpudoctorError
from gpudoctor.launch.ranks import LaunchedRank, launched_rank

# Set by `gpudoctor profile torchrun ...` for the ranks it starts: it merges them itself when torchrun ends.
OUTER_ENV = "GPUDOCTOR_OUTER_JOB"
DONE = ".analysed"
# The most a node's last rank waits for another node's ranks of the job writing the same RUN: ranks that meet in
# collectives end within seconds of each other; one that does not (a crashed node) is named as missing.
JOB_WAIT_S = 60.0
POLL_S = 0.5
# How long a rank's report and the job's merge go on after its agent's SIGTERM, once the script has ended: torchrun's
# agent sends SIGTERM to its workers when the job fails (another node gone), and SIGKILL 30 s later.
TERMINATED_GRACE_S = 25.0


def merges_itself() -> bool:
    """Whether this `gpudoctor profile` is a rank of a job whose report nobody else merges."""
    return launched_rank() is not None and OUTER_ENV not in os.environ


def merged_by_outer() -> bool:
    """Whether this `gpudoctor profile` is a rank of a job that `gpudoctor profile torchrun ...` runs: that command
    analyses every rank, once, when torchrun has ended, and writes each rank's report with the job's."""
    return launched_rank() is not None and OUTER_ENV in os.environ


@contextlib.contextmanager
def reports_before_sigterm(grace_s: float = TERMINATED_GRACE_S) -> Iterator[None]:
    """While the rank's report and the job's merge are written (the script has ended), a SIGTERM (the agent shutting
    the node's workers down, as when another node is gone) lets them finish, at most `grace_s`, instead of losing
    the job's report half-written; the rank then ends with its script's status, as it would have without it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = threading.Event()

    def on_sigterm(signum: int, frame: object) -> None:
        if received.is_set():
            return
        received.set()
        print(f"gpudoctor: terminated while writing the job's report; finishing it first (at most {grace_s:.0f} s).",
              file=sys.stderr, flush=True)
        threading.Thread(target=_die_after, args=(grace_s,), name="gpudoctor-report-grace", daemon=True).start()

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _die_after(seconds: float) -> None:
    time.sleep(seconds)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def mark_done(rank_dir: Path) -> None:
    me = launched_rank()
    marker = {"job": me.job if me else None, "host": socket.gethostname(), "node": me.node_rank if me else None,
              "agent": os.getppid()}
    try:
        (rank_dir / DONE).write_text(json.dumps(marker), encoding="utf-8")
    except OSError:
        return


def take_merge(job_dir: Path, wait_s: float = JOB_WAIT_S) -> bool:
    """Whether this rank merges the report in `job_dir` (see the module's docstring); when it does, the rank
    directories of another job are gone from `job_dir`."""
    me = launched_rank()
    if me is None:
        return False
    if not _node_done(job_dir, me):
        return False
    lock, done = job_dir / f".merging-{_lock_name(me)}", job_dir / f".merged-{_lock_name(me)}"
    deadline = time.monotonic() + wait_s
    while (not _job_done(job_dir, me) and _others_running(job_dir, me) and not lock.exists() and not done.exists()
           and time.monotonic() < deadline):
        time.sleep(POLL_S)
    if done.exists():
        return False  # another node's rank merged the job
    try:
        os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except OSError:
        return False  # another rank took it
    if done.exists():
        lock.unlink(missing_ok=True)
        return False
    for rank, path in rank_dirs(job_dir, with_manifest=False).items():
        if rank >= me.world_size or _job_of(path) not in (me.job, None):
            shutil.rmtree(path, ignore_errors=True)  # an earlier job's rank, never one of this job's
    for earlier in job_dir.glob(".merged-*"):
        earlier.unlink(missing_ok=True)  # an earlier job's
    return True


def merged(job_dir: Path) -> None:
    """The merge is written: the markers and the lock go, leaving the run directory as the outer form leaves it."""
    me = launched_rank()
    if me is not None:  # what tells a rank still waiting, on another node, that the job's report is written
        (job_dir / f".merged-{_lock_name(me)}").touch()
    for path in rank_dirs(job_dir, with_manifest=False).values():
        if me is None or _job_of(path) == me.job:
            (path / DONE).unlink(missing_ok=True)
    if me is not None:
        (job_dir / f".merging-{_lock_name(me)}").unlink(missing_ok=True)


def _lock_name(me: LaunchedRank) -> str:
    return "".join(c if c.isalnum() else "-" for c in me.job)[-80:]


def _markers(job_dir: Path, me: LaunchedRank) -> dict[int, dict[str, object]]:
    found = {}
    for rank, path in _ranks_of_the_size(job_dir, me).items():
        marker = _marker(path)
        if marker is not None and marker.get("job") == me.job:
            found[rank] = marker
    return found


def _node_done(job_dir: Path, me: LaunchedRank) -> bool:
    """Whether every rank of this node has its marker: the node told by its host and, where the launcher numbers
    the nodes, its number (two nodes of one job may share a host)."""
    host = socket.gethostname()
    ours = [m for m in _markers(job_dir, me).values() if m.get("host") == host and m.get("node") == me.node_rank]
    return len(ours) >= me.ranks_on_node


def _job_done(job_dir: Path, me: LaunchedRank) -> bool:
    return len(_markers(job_dir, me)) >= me.world_size


def _others_running(job_dir: Path, me: LaunchedRank) -> bool:
    """Whether a rank of this job that has not finished writes into `job_dir` too (a directory the nodes share),
    and still does: one whose files have not changed for STALE_S was killed with its node, and is not waited for."""
    done = _markers(job_dir, me)
    now = _filesystem_now(job_dir)
    return any(rank not in done and _job_of(path) == me.job and _still_writing(path, now)
               for rank, path in _ranks_of_the_size(job_dir, me).items())


# A running rank's gpudoctor touches its heartbeat every HEARTBEAT_S, from its start to its report's end (its
# samplers write besides): one silent this long is not running (its process, or its node, was killed). Times are
# the filesystem's (a shared one stamps every host's files by one clock), never this host's own.
STALE_S = 10.0


ALIVE = ".alive"  # touched every HEARTBEAT_S while a rank analyses, after its script and samplers have ended
HEARTBEAT_S = 2.0


@contextlib.contextmanager
def heartbeat(rank_dir: Path) -> Iterator[None]:
    """While the rank runs and analyses its bundle, it says it is alive (its samplers may be silent: a disk under
    the margin, bundle.free_space; nothing else writes while it analyses)."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                (rank_dir / ALIVE).touch()
            stop.wait(HEARTBEAT_S)

    thread = threading.Thread(target=beat, name="gpudoctor-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=1.0)
        (rank_dir / ALIVE).unlink(missing_ok=True)


def _filesystem_now(job_dir: Path) -> float:
    """The time the filesystem of `job_dir` stamps a file with now; this host's clock where nothing can be written."""
    probe = job_dir / f".clock-{socket.gethostname()}-{os.getpid()}"
    try:
        probe.touch()
        stamped = probe.stat().st_mtime
        probe.unlink()
    except OSError:
        return time.time()
    return stamped


def _still_writing(rank_dir: Path, now: float) -> bool:
    newest = 0.0
    for path in (rank_dir / ALIVE, rank_dir / "samples", *rank_dir.glob("*.jsonl"), *rank_dir.glob("samples/*.jsonl")):
        try:
            newest = max(newest, path.stat().st_mtime)
        except OSError:
            continue
    return now - newest < STALE_S


def _ranks_of_the_size(job_dir: Path, me: LaunchedRank) -> dict[int, Path]:
    """The rank directories this job's ranks may have written: an earlier, larger job's last ones are not."""
    return {rank: path for rank, path in rank_dirs(job_dir, with_manifest=False).items() if rank < me.world_size}


def _job_of(rank_dir: Path) -> str | None:
    """The job the rank's manifest names; None where it has none (yet, or unreadable)."""
    try:
        launch = read_manifest(rank_dir).launch
    except (GpudoctorError, OSError):
        return None
    return launch.job if launch is not None else ""


def _marker(rank_dir: Path) -> dict[str, object] | None:
    try:
        found = json.loads((rank_dir / DONE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None
