"""Following a job into every process it starts: each rank records its own bundle, `JOB/rank-K/`.

As coverage.py measures subprocesses, the launcher puts a start-up hook first on the script's PYTHONPATH
(`collect/hook/sitecustomize.py`) and says in GPUDOCTOR_FOLLOW where the job's bundles go. Every Python
interpreter the job starts runs the hook, and this module decides what the process is:

- a rank started with RANK or LOCAL_RANK in its environment (torchrun's workers, Lightning's launcher, accelerate
  launch, a subprocess that runs a rank): recorded from its first line, and finished at its exit;
- a multiprocessing child whose target is torch.multiprocessing's (mp.spawn, start_processes, Lightning's
  ddp_spawn): recorded while it runs the function it was given, under the spawn, fork or forkserver method;
- anything else (DataLoader workers, compile workers, helpers, torchrun's agent, gpudoctor itself): left alone;
  the samplers still see it.

A rank claims its bundle by making the directory: a process that finds it made already (a helper that inherited
its rank's RANK) is not that rank. Every recording process also watches gpudoctor's own process, and ends itself
(SIGTERM, so that its bundle is still written) if gpudoctor is killed: no process of the job outlives it.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import sys
import threading
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudoctor.collect.config import ChildConfig, WindowConfig

if TYPE_CHECKING:  # imported on use: an interpreter that is no rank loads no more than this module
    from gpudoctor.collect.session import Session

FOLLOW_ENV = "GPUDOCTOR_FOLLOW"
HOOK_DIR = Path(__file__).resolve().parent / "hook"
GUARD_POLL_S = 1.0  # where the kernel cannot wait on a process (no pidfd), how often the guard looks

# Processes that start a job's ranks without being one: torchrun's agent (and accelerate's, which runs it),
# DeepSpeed's launcher, and gpudoctor's own (in `torchrun -m gpudoctor profile`, each rank's gpudoctor).
LAUNCHER_MODULES = ("gpudoctor", "torch.distributed.run", "torch.distributed.launch", "accelerate.commands.launch",
                    "deepspeed.launcher.runner")
LAUNCHER_PROGRAMS = ("gpudoctor", "torchrun", "accelerate", "deepspeed")


@dataclass(frozen=True)
class FollowConfig:
    """What every process of the job needs to record itself: where the bundles go, how (the window, --max-steps),
    and gpudoctor's own process, which the job must not outlive."""

    job_dir: str
    child: ChildConfig
    supervisor_pid: int

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> FollowConfig:
        data = json.loads(text)
        child = dict(data["child"], window=WindowConfig(**data["child"]["window"]))
        return cls(job_dir=data["job_dir"], child=ChildConfig(**child), supervisor_pid=int(data["supervisor_pid"]))


def environment(base: dict[str, str], config: FollowConfig) -> dict[str, str]:
    """`base` with what the job's processes need to be followed: the config, and the start-up hook on the path."""
    env = dict(base)
    env[FOLLOW_ENV] = config.to_json()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HOOK_DIR), base.get("PYTHONPATH")) if p)
    return env


def _config() -> FollowConfig | None:
    text = os.environ.get(FOLLOW_ENV)
    if not text:
        return None
    try:
        return FollowConfig.from_json(text)
    except (ValueError, KeyError, TypeError):
        return None


# -- in the script's own process ---------------------------------------------------------------------
def in_root_process() -> None:
    """The script's own process: it ends if gpudoctor is killed, and follows the ranks it forks."""
    config = _config()
    if config is not None:
        guard(config.supervisor_pid)
        watch_process_starts(config)


# -- in every other interpreter of the job (from the start-up hook) -------------------------------
def at_interpreter_start() -> None:
    config = _config()
    if config is None or _launcher(sys.orig_argv):
        return
    spawned = _multiprocessing_child()
    rank = None if spawned else rank_from_environment(os.environ)
    if spawned or rank is not None:  # a process that may become a rank (the script's own registers in bootstrap)
        end_stopped_group_at_exit()
    session = _become_rank(config, rank, "environment") if rank is not None else None
    if session is not None:
        _finish_at_exit(session)
    watch_process_starts(config)


_group_end_registered = False


def end_stopped_group_at_exit() -> None:
    """At exit, end the process group of a rank that --max-steps stopped (collect.session says why).

    Registered as the interpreter starts, before any of the script's code runs, so that it runs after every atexit
    handler the script registers: an mp.spawn child imports the script's module, whose handlers may use the group,
    before it becomes a rank. Once per process; a forked child inherits it, and its session says whether to act.
    """
    global _group_end_registered  # noqa: PLW0603 - one registration per process
    if _group_end_registered:
        return
    _group_end_registered = True

    def end_if_stopped() -> None:
        sessions = sys.modules.get("gpudoctor.collect.session")  # none where this process never recorded
        session = sessions.current() if sessions is not None else None
        if session is not None:
            session.end_process_group_if_stopped()

    atexit.register(end_if_stopped)


def _launcher(argv: list[str]) -> bool:
    """Whether this interpreter runs one of the launchers (`python -m torch.distributed.run`, `torchrun`, ...)."""
    for i, arg in enumerate(argv[1:-1], start=1):
        if arg == "-m" and argv[i + 1] in LAUNCHER_MODULES:
            return True
    script = next((a for a in argv[1:] if not a.startswith("-")), "")
    return Path(script).name in LAUNCHER_PROGRAMS


def _multiprocessing_child() -> bool:
    """A process multiprocessing started with spawn or forkserver: what it runs is known only at its _bootstrap."""
    argv = sys.orig_argv
    return "--multiprocessing-fork" in argv or any("multiprocessing.forkserver" in a for a in argv)


def rank_from_environment(env: dict[str, str] | os._Environ[str]) -> int | None:
    """The global rank a launcher gave this process: RANK (torchrun, accelerate), else LOCAL_RANK on node
    NODE_RANK (Lightning's launcher sets these two, and WORLD_SIZE)."""
    try:
        if "RANK" in env:
            return int(env["RANK"])
        local = int(env["LOCAL_RANK"])
    except (KeyError, ValueError):
        return None
    try:
        node, per_node = int(env.get("NODE_RANK", "0")), int(env.get("LOCAL_WORLD_SIZE", "0"))
    except ValueError:
        return local
    return node * per_node + local if per_node else local


def _finish_at_exit(session: Session) -> None:
    """A rank started as a program of its own ends with its interpreter: the end is written at exit, with the
    exception that ended it if one did (the interpreter keeps it in sys.last_value before exiting)."""
    from gpudoctor.collect.session import exception_details, let_native_threads_settle, stop_helpers

    def at_exit() -> None:
        exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
        if session.stopped_by_max_steps:
            session.finish("max_steps", code=0)
        elif isinstance(exc, BaseException):
            session.finish("exception", code=1, exception=exception_details(exc))
        else:
            session.finish("completed")  # or sys.exit(N): what status it exits with is its parent's to see
        let_native_threads_settle()

    def stop_helpers_at_exit() -> None:
        # Registered now, it runs before multiprocessing's own exit handler, which would wait for helpers forever.
        atexit.register(stop_helpers)

    atexit.register(at_exit)
    session.recorder.on_max_steps(stop_helpers_at_exit)


# -- multiprocessing children, whatever their start method ------------------------------------------
def watch_process_starts(config: FollowConfig) -> None:
    """A multiprocessing child that runs torch.multiprocessing's target is rank K (its process index): it
    records while it runs, then finishes before the process exits."""
    from multiprocessing import process

    from gpudoctor.collect.patches import Patches

    def make(original: Any) -> Any:
        def _bootstrap(self: Any, *args: Any, **kwargs: Any) -> Any:
            index = _spawned_index(self)
            session = _become_rank(config, index, "torch.multiprocessing") if index is not None else None
            if session is None:
                return original(self, *args, **kwargs)
            self._args = (_recorded(self._args[0], session), *self._args[1:])
            code = original(self, *args, **kwargs)
            session.finish("exit" if code else "completed", code=code)
            return code

        return _bootstrap

    Patches().wrap(process.BaseProcess, "_bootstrap", make)  # for the process's lifetime: never restored


def _spawned_index(process: Any) -> int | None:
    """The process index torch.multiprocessing gives the function it runs (`_wrap(fn, i, args, error_file)`)."""
    target = getattr(process, "_target", None)
    if (getattr(target, "__module__", None), getattr(target, "__name__", None)) != ("torch.multiprocessing.spawn",
                                                                                   "_wrap"):
        return None
    args: tuple[Any, ...] = getattr(process, "_args", ())
    return args[1] if len(args) > 1 and isinstance(args[1], int) else None


def _recorded(function: Any, session: Session) -> Any:
    """The rank's function, its ending recorded as the script's own is (torch.multiprocessing catches what it
    raises, so the exception's details are taken here)."""
    import functools

    from gpudoctor.collect.recorder import MaxStepsReached
    from gpudoctor.collect.session import exception_details, stop_helpers

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            result = function(*args, **kwargs)
        except MaxStepsReached:
            session.finish("max_steps", code=0)
            stop_helpers()
            raise
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            session.finish("completed" if code == 0 else "exit", code=code)
            raise
        except KeyboardInterrupt:
            # A second Ctrl-C may be pending (a job's process group interrupted, then the parent's death signal,
            # which torch.multiprocessing sets to SIGINT): it raises as finish is entered, before the ending is
            # written, and torch would swallow it and exit 0, the rank said to have completed. The ending is
            # written all the same; the loop is here because entering a function of its own would raise it outside.
            while True:
                try:
                    session.finish("interrupted")
                    break
                except KeyboardInterrupt:
                    continue
            raise
        except BaseException as exc:
            session.finish("exception", code=1, exception=exception_details(exc))
            raise
        session.finish("completed", code=0)
        return result

    return run


# -- becoming a rank ---------------------------------------------------------------------------------
def _become_rank(config: FollowConfig, rank: int, source: str) -> Session | None:
    """Record this process as rank `rank` of the job, into JOB/rank-K/; None when another process of the job is
    that rank already (or the directory cannot be made)."""
    rank_dir = Path(config.job_dir) / f"rank-{rank}"
    try:
        rank_dir.mkdir()
    except OSError:
        return None
    from gpudoctor.bundle.events import RankEvent
    from gpudoctor.collect import session as sessions

    inherited = sessions.current()
    if inherited is not None:  # a forked child: its parent's recording is not its own
        inherited.abandon()
    world = sessions.env_int("WORLD_SIZE")
    session = sessions.Session(replace(config.child, run_dir=str(rank_dir)),
                               RankEvent(rank=rank, source=source, world_size=world))
    session.finish_on_sigterm()
    guard(config.supervisor_pid)
    return session


# -- the guard: no process of the job outlives gpudoctor -----------------------------------------
def guard(supervisor_pid: int) -> None:
    """End this process (SIGTERM: its bundle is written first) when gpudoctor's own process ends."""
    try:
        os.kill(supervisor_pid, 0)
    except OSError:
        return  # gone already, or not ours to watch
    threading.Thread(target=_watch, args=(supervisor_pid,), name="gpudoctor-guard", daemon=True).start()


def _watch(pid: int) -> None:
    try:
        descriptor = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd (an old kernel, another system): look now and then
        while _alive(pid):
            threading.Event().wait(GUARD_POLL_S)
    else:
        select.select([descriptor], [], [])
        os.close(descriptor)
    _end_descendants()
    os.kill(os.getpid(), signal.SIGTERM)


def _end_descendants() -> None:
    """SIGTERM to the processes this one started that record nothing, and theirs (a Pool's worker, one stuck after
    a fork): none is left behind, orphaned, once gpudoctor is gone. A rank that records ends itself, by its own
    guard (a second SIGTERM would cut its bundle short), and its DataLoader workers are its own to end."""
    import psutil

    recording = _recording_pids()
    with contextlib.suppress(psutil.Error):
        pending = psutil.Process().children()
        while pending:
            child = pending.pop()
            if child.pid in recording:
                continue
            with contextlib.suppress(psutil.Error):
                pending.extend(child.children())
                child.send_signal(signal.SIGTERM)


def _recording_pids() -> set[int]:
    """The processes of the job's ranks, each from the first process event of its bundle."""
    from gpudoctor.bundle.layout import rank_dirs

    config = _config()
    if config is None:
        return set()
    pids = set()
    for bundle in rank_dirs(Path(config.job_dir), with_manifest=False).values():
        with contextlib.suppress(OSError, ValueError), open(bundle / "events.jsonl", "rb") as events:
            for _, line in zip(range(8), events, strict=False):
                record = json.loads(line)
                if record.get("kind") == "process" and isinstance(record.get("pid"), int):
                    pids.add(record["pid"])
                    break
    return pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, and another user's
        pass
    return True
