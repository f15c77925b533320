"""Recording in one process of the job: its recorder and instrumentation, installed once, finished once.

The script's own process (`gpudoctor.collect.bootstrap`) and every rank gpudoctor follows into (`collect.follow`) record
through a Session: it writes the process's facts, installs the instrumentation, writes the window's trace and the
end event however the process ends (its script returning or raising, SIGTERM, --max-steps), and never raises into
the script.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

from gpudoctor.bundle import EXITING
from gpudoctor.bundle.events import ProcessEvent, RankEvent
from gpudoctor.collect.callsite import user_site_in
from gpudoctor.collect.config import ChildConfig
from gpudoctor.collect.instrument import Instrumentation
from gpudoctor.collect.recorder import ExceptionDetails, Recorder, set_active

# How long SIGTERM waits for the window's trace to be written before the process dies anyway; an export with
# stacks took 17.6 s in docs/performance.md, so this leaves room for one several times larger.
SIGTERM_FINISH_GRACE_S = 60.0
# How long gpudoctor's own work at the end of a process (the window's trace, the last events) may take before the
# process exits without it: the same bound, for the same export.
FINISH_DEADLINE_S = SIGTERM_FINISH_GRACE_S
# The status a process exits with when its finishing runs past the deadline: the one its ending gives plainly.
ENDING_STATUS = {"completed": 0, "max_steps": 0, "exception": 1, "interrupted": 128 + signal.SIGINT,
                 "terminated": 128 + signal.SIGTERM}
# After --max-steps, how long the script's helper processes get to end by themselves before they are terminated.
HELPER_GRACE_S = 2.0
# How long a torch.distributed program's native threads get to finish with Python objects before shutdown.
NATIVE_SETTLE_S = 0.1
# How long ending the process group that --max-steps left may take before the process exits without it: a gloo
# group ends in milliseconds; an NCCL one waits for its communicators (a collective call in some NCCL versions).
GROUP_END_DEADLINE_S = 30.0

_current: Session | None = None


class Session:
    def __init__(self, config: ChildConfig, rank: RankEvent | None = None) -> None:
        global _current  # noqa: PLW0603 - the one session of this process, which a forked child leaves behind
        self.recorder = Recorder(config)
        set_active(self.recorder)
        self.instrumentation = Instrumentation(self.recorder)
        self.instrumentation.install()
        self.recorder.emit(process_facts())
        if rank is not None:
            self.recorder.emit(rank)
        self._finished = False
        self._abandoned = False
        self._pid = os.getpid()
        self._exit_status = 0  # the status the process exits with, as its ending says
        _current = self

    def finish(self, reason: str, code: int | None = None, exception: ExceptionDetails | None = None) -> None:
        """Take the instrumentation off, close the window (writing its trace) and say how the process ended."""
        if self._finished:
            return
        with ctrl_c_held():  # a Ctrl-C pending as it is entered raises here, before the session counts as finished
            self._finished = True
            self._exit_status = ENDING_STATUS.get(reason, 1 if code is None else code)
            deadline = exit_after(FINISH_DEADLINE_S, self._exit_status)
            try:
                self.instrumentation.uninstall()
                self.recorder.finish(reason, code, exception)
            except Exception as exc:  # noqa: BLE001 - gpudoctor must never change how the script ends
                print(f"gpudoctor: could not finish recording: {exc}", file=sys.stderr)
            finally:
                deadline.cancel()

    @property
    def stopped_by_max_steps(self) -> bool:
        return self.recorder.stopping

    def finish_on_sigterm(self) -> None:
        """On SIGTERM, write what was recorded (the window's trace too), then die of SIGTERM as python would.

        Nothing is raised into the script: its `finally` blocks do not run, exactly as without gpudoctor.
        A handler the script installs itself replaces this one. Only the main thread can set it.
        """

        def on_sigterm(signum: int, frame: object) -> None:
            # From here a second SIGTERM ends the process at once, and so does the watchdog if finishing hangs.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            terminate_after(SIGTERM_FINISH_GRACE_S)
            self.finish("terminated")
            os.kill(os.getpid(), signal.SIGTERM)

        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, on_sigterm)

    def abandon(self) -> None:
        """In a forked child that becomes a rank of its own: take the parent's instrumentation off, writing
        nothing (the recorder is already off in a forked child)."""
        self._finished = True
        self._abandoned = True
        self.recorder.disable_in_forked_child()
        self.instrumentation.abandon()

    def end_process_group_if_stopped(self) -> None:
        """At exit: end the process group that --max-steps kept the script from ending (not in a forked child,
        whose copy of the group has none of its threads)."""
        if self.stopped_by_max_steps and not self._abandoned and self._pid == os.getpid():
            end_process_group_left_by_stop(self._exit_status)


def current() -> Session | None:
    """This process's session: the one it started, or the one a forked child inherited from its parent."""
    return _current


def exit_after(seconds: float, status: int, message: str | None = None) -> threading.Timer:
    """Unless cancelled first, end the process with `status` in `seconds`, saying why in one sentence.

    The last resort against gpudoctor's own work holding a process that has finished: a native call that never
    returns (a profiler's stop, a write to a hung file system) cannot be interrupted from Python, only left."""
    if message is None:
        message = (f"gpudoctor: writing the recording took over {seconds:g} s, so the process exits without the "
                   "rest of it; the report has what was written before.\n")

    def give_up() -> None:
        with contextlib.suppress(OSError):
            os.write(2, message.encode())  # not print(): the stuck thread may hold sys.stderr's lock
        os._exit(status)

    timer = threading.Timer(seconds, give_up)
    timer.name, timer.daemon = "gpudoctor-finish-deadline", True
    timer.start()
    return timer


def mark_exiting_at_exit(run_dir: Path) -> None:
    """Once the process's atexit handlers have run (this one, registered before the script's, runs after them),
    make RUN/exiting: from then on only the interpreter's and native libraries' teardown is left, and the launcher
    can tell a process that does not exit from one still at work."""

    def mark() -> None:
        with contextlib.suppress(OSError):
            (run_dir / EXITING).write_text(str(os.getpid()), encoding="utf-8")

    atexit.register(mark)


def _ignore(signum: int, frame: object) -> None:
    return None


def hold_ctrl_c() -> None:
    """From here on, Ctrl-C does nothing in this process (it is ending already: bootstrap, as the script's own
    KeyboardInterrupt is caught)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _ignore)


@contextlib.contextmanager
def ctrl_c_held() -> Iterator[None]:
    """While the script's end is recorded (its window's trace written), a Ctrl-C (a second one, most often, after
    the one that stopped the script) does not break into gpudoctor's own frames: a plain run would have ended
    already, and the process ends as it was ending, bounded by FINISH_DEADLINE_S."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) in (
            signal.SIG_IGN, None):
        yield
        return
    previous = signal.signal(signal.SIGINT, _ignore)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def terminate_after(seconds: float) -> None:
    def watchdog() -> None:
        time.sleep(seconds)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watchdog, name="gpudoctor-sigterm-watchdog", daemon=True).start()


def process_facts() -> ProcessEvent:
    import multiprocessing
    import platform

    gil = getattr(sys, "_is_gil_enabled", None)
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return ProcessEvent(
        pid=os.getpid(), python=platform.python_version(), implementation=platform.python_implementation(),
        executable=sys.executable, gil_enabled=gil() if gil else True, cpu_count=os.cpu_count(), affinity=affinity,
        start_method=multiprocessing.get_start_method(allow_none=True), switch_interval_s=sys.getswitchinterval(),
        main_native_id=threading.get_native_id(), rank=env_int("RANK"), world_size=env_int("WORLD_SIZE"),
        local_world_size=env_int("LOCAL_WORLD_SIZE"),
    )


def env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def exception_details(exc: BaseException) -> ExceptionDetails:
    """The exception's name, its message, and the user's line it passed through last (not torch's, which raised
    it: the user changes their own line)."""
    try:
        where = user_site_in(traceback.extract_tb(exc.__traceback__))
    except Exception:  # noqa: BLE001 - the script's exception is still recorded and shown, without a line
        where = None
    return type(exc).__qualname__, str(exc)[:4000], where


def let_native_threads_settle(pause_s: float = NATIVE_SETTLE_S) -> None:
    """Before the interpreter shuts down, give torch.distributed's own threads the GIL for a moment.

    A gloo worker thread that frees a finished collective releases a Python object (the context that backward()
    stores for it); if that happens after shutdown has begun, the thread cannot take the GIL and the process
    aborts ("terminate called without an active exception"). Plain torchrun runs hit it too, rarely; the time
    gpudoctor spends writing at the end made it likelier, so it waits here while holding nothing. Only a
    process that may hold such threads waits: `import torch` imports torch.distributed in every script.
    """
    if may_hold_process_groups():
        time.sleep(pause_s)


def end_process_group_left_by_stop(status: int = 0) -> None:
    """End the torch.distributed process group of a rank that --max-steps stopped, as the script's teardown would.

    The stop raises from inside the script's step, so the script never reaches its own `destroy_process_group()`.
    Left to the interpreter's shutdown, the group's end can abort the process: a gloo worker thread that frees a
    finished collective's Python objects once shutdown has begun cannot take the GIL ("terminate called without an
    active exception", tests/scripts/spawn_ddp.py). This runs at exit after the script's own handlers
    (`collect.follow.end_stopped_group_at_exit`), when the script's frames are gone and with them a model that
    held the group in a function (DDP's, once its reference cycles are collected): gloo's threads are joined here.
    A model kept in the script's globals still holds the group, which is then only taken out of torch.distributed's
    registry, its threads left to the shutdown: exactly what the script's own call would have done. A forked rank
    exits without shutting the interpreter down and never gets here. Past the deadline, the process exits with
    `status`, the one its ending gives.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    message = (f"gpudoctor: ending the stopped rank's process group took over {GROUP_END_DEADLINE_S:g} s, so the "
               "process exits without it; its recording was written before.\n")
    deadline = exit_after(GROUP_END_DEADLINE_S, status, message)
    try:
        if dist.is_available() and dist.is_initialized():
            gc.collect()
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001, S110 - a Ctrl-C as well: the script has ended, and exits as it would
        pass
    finally:
        deadline.cancel()


def may_hold_process_groups() -> bool:
    """Whether the script runs as a rank of a job (torchrun's variables) or holds a torch.distributed process group."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return False
    if any(name in os.environ for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK")):
        return True
    try:
        return bool(dist.is_available() and dist.is_initialized())
    except Exception:  # noqa: BLE001 - a torch that cannot say: wait, as before
        return True


def stop_helpers(grace_s: float = HELPER_GRACE_S) -> None:
    """End the child processes the script left running when --max-steps stopped it.

    The script's own cleanup (setting the event its helper waits for, joining it) never ran, and at exit
    multiprocessing joins every non-daemon child: without this, the run would never end.
    """
    import multiprocessing

    helpers = multiprocessing.active_children()
    deadline = time.monotonic() + grace_s
    for helper in helpers:
        helper.join(max(0.0, deadline - time.monotonic()))
    left = [helper for helper in helpers if helper.is_alive()]
    for helper in left:
        helper.terminate()
    for helper in left:
        helper.join(HELPER_GRACE_S)
        if helper.is_alive():
            helper.kill()
    if left:
        plural = "es" if len(left) > 1 else ""
        print(f"gpudoctor: stopped {len(left)} helper process{plural} that the script left running when "
              "--max-steps ended it.", file=sys.stderr)
