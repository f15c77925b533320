"""The script's process: install the instrumentation, then run the script as `python SCRIPT ARGS` would.

Started by the launcher as `python -c <stub> CONFIG_JSON (--script PATH | --module NAME) -- ARGS...`. The stub
puts gpudoctor on sys.path only for its own import; the script sees sys.argv, sys.path[0], `__main__` and
its environment as under plain `python`.
"""

from __future__ import annotations

import builtins
import importlib.machinery
import io
import os
import runpy
import signal
import sys
import threading
import time
import traceback
import types
from types import TracebackType

from gpudoctor.bundle.events import ProcessEvent
from gpudoctor.bundle.records import Site
from gpudoctor.collect.config import ChildConfig
from gpudoctor.collect.instrument import Instrumentation
from gpudoctor.collect.recorder import ExceptionDetails, MaxStepsReached, Recorder, set_active

# How long SIGTERM waits for the window's trace to be written before the script dies anyway; an export with
# stacks took 17.6 s in docs/performance.md, so this leaves room for one several times larger.
SIGTERM_FINISH_GRACE_S = 60.0
# After --max-steps, how long the script's helper processes get to end by themselves before they are terminated.
HELPER_GRACE_S = 2.0
# How long a torch.distributed program's native threads get to finish with Python objects before shutdown.
NATIVE_SETTLE_S = 0.1

_INTERNAL_FILES = {os.path.realpath(__file__), os.path.realpath(runpy.__file__)}


def _is_internal(filename: str) -> bool:
    # runpy is frozen since Python 3.11: its frames are named "<frozen runpy>", not its file.
    return filename == "<frozen runpy>" or os.path.realpath(filename) in _INTERNAL_FILES


def _trim(tb: TracebackType | None) -> TracebackType | None:
    """Drop the bootstrap's and runpy's frames so the traceback starts in the user's code, as with python."""
    while tb is not None and _is_internal(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return tb


def _exception_details(exc: BaseException) -> ExceptionDetails:
    frames = traceback.extract_tb(exc.__traceback__)
    last = frames[-1] if frames else None
    where = Site(file=last.filename, line=last.lineno or 0, function=last.name) if last else None
    return type(exc).__qualname__, str(exc)[:4000], where


def _run(target_kind: str, target: str, args: list[str]) -> None:
    if target_kind == "module":
        sys.argv = [target, *args]  # runpy replaces argv[0] with the module's path, as `python -m` does
        sys.path[0] = os.getcwd()
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [target, *args]
        sys.path[0] = os.path.dirname(os.path.realpath(target))
        _run_script(target)


def _run_script(target: str) -> None:
    """Run the file as `python SCRIPT` does, in a new `__main__` whose __file__ is the absolute path.

    Not runpy.run_path: it leaves __file__ (and so tracebacks) relative and sets argv[0] to the path it ran.
    """
    path = os.path.abspath(target)
    with io.open_code(path) as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    namespace = vars(main)  # __cached__ and __builtins__ are set through it: ModuleType does not declare them
    namespace.update(__file__=path, __cached__=None, __builtins__=builtins)
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    sys.modules["__main__"] = main
    exec(code, namespace)  # noqa: S102 - running the user's script is what gpudoctor profile is for


def main(argv: list[str]) -> None:
    config = ChildConfig.from_json(argv[0])
    target_kind, target = argv[1].lstrip("-"), argv[2]
    args = argv[4:]  # argv[3] is the "--" separator
    recorder = Recorder(config)
    set_active(recorder)
    instrumentation = Instrumentation(recorder)
    instrumentation.install()
    recorder.emit(_process_facts())
    _finish_on_sigterm(recorder, instrumentation)
    try:
        _run(target_kind, target, args)
    except MaxStepsReached:
        _finish(recorder, instrumentation, "max_steps")
        _stop_helpers()
        sys.exit(0)
    except SystemExit as exc:
        _finish(recorder, instrumentation, "exit", code=_exit_code(exc.code))
        _let_native_threads_settle()
        raise
    except KeyboardInterrupt as exc:
        _finish(recorder, instrumentation, "interrupted")
        traceback.print_exception(type(exc), exc, _trim(exc.__traceback__))
        sys.stderr.flush()
        # Die of SIGINT, as python does, so the status seen from outside is the same.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException as exc:  # noqa: BLE001 - whatever the script raised is recorded, then reported as python would
        _finish(recorder, instrumentation, "exception", exception=_exception_details(exc))
        exc.__traceback__ = _trim(exc.__traceback__)  # the default excepthook prints the exception's own
        sys.excepthook(type(exc), exc, exc.__traceback__)
        sys.exit(1)
    else:
        _finish(recorder, instrumentation, "completed")
        _let_native_threads_settle()


def _let_native_threads_settle(pause_s: float = NATIVE_SETTLE_S) -> None:
    """Before the interpreter shuts down, give torch.distributed's own threads the GIL for a moment.

    A gloo worker thread that frees a finished collective releases a Python object (the context that backward()
    stores for it); if that happens after shutdown has begun, the thread cannot take the GIL and the process
    aborts ("terminate called without an active exception"). Plain torchrun runs hit it too, rarely; the time
    gpudoctor spends writing at the end made it likelier, so it waits here while holding nothing. Only a
    process that may hold such threads waits: `import torch` imports torch.distributed in every script.
    """
    if _may_hold_process_groups():
        time.sleep(pause_s)


def _may_hold_process_groups() -> bool:
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


def _stop_helpers(grace_s: float = HELPER_GRACE_S) -> None:
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


def _finish_on_sigterm(recorder: Recorder, instrumentation: Instrumentation) -> None:
    """On SIGTERM, write what was recorded (the window's trace too), then die of SIGTERM as python would.

    Nothing is raised into the script: its `finally` blocks do not run, exactly as without gpudoctor.
    A handler the script installs itself replaces this one.
    """

    def on_sigterm(signum: int, frame: object) -> None:
        # From here a second SIGTERM ends the script at once, and so does the watchdog if finishing hangs.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _terminate_after(SIGTERM_FINISH_GRACE_S)
        _finish(recorder, instrumentation, "terminated")
        os.kill(os.getpid(), signal.SIGTERM)

    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, on_sigterm)


def _terminate_after(seconds: float) -> None:
    def watchdog() -> None:
        time.sleep(seconds)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watchdog, name="gpudoctor-sigterm-watchdog", daemon=True).start()


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def _finish(recorder: Recorder, instrumentation: Instrumentation, reason: str, code: int | None = None,
            exception: ExceptionDetails | None = None) -> None:
    try:
        instrumentation.uninstall()
        recorder.finish(reason, code, exception)
    except Exception as exc:  # noqa: BLE001 - gpudoctor must never change how the script ends
        print(f"gpudoctor: could not finish recording: {exc}", file=sys.stderr)


def _process_facts() -> ProcessEvent:
    import multiprocessing
    import platform

    gil = getattr(sys, "_is_gil_enabled", None)
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return ProcessEvent(
        pid=os.getpid(), python=platform.python_version(), implementation=platform.python_implementation(),
        executable=sys.executable, gil_enabled=gil() if gil else True, cpu_count=os.cpu_count(), affinity=affinity,
        start_method=multiprocessing.get_start_method(allow_none=True), switch_interval_s=sys.getswitchinterval(),
        main_native_id=threading.get_native_id(), rank=_env_int("RANK"), world_size=_env_int("WORLD_SIZE"),
        local_world_size=_env_int("LOCAL_WORLD_SIZE"),
    )


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None
