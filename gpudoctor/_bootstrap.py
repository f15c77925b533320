"""The script's process: install the instrumentation, then run the script as `python SCRIPT ARGS` would.

Started by the launcher as `python -c <stub> CONFIG_JSON (--script PATH | --module NAME) -- ARGS...`. The stub
puts gpudoctor on sys.path only for its own import; the script sees sys.argv, sys.path[0], `__main__` and
its environment as under plain `python`.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import traceback
from types import TracebackType
from typing import Any

from gpudoctor.collect.config import ChildConfig
from gpudoctor.collect.instrument import Instrumentation
from gpudoctor.collect.recorder import MaxStepsReached, Recorder, set_active


def _trim(tb: TracebackType | None) -> TracebackType | None:
    """Drop the bootstrap's and runpy's frames so the traceback starts in the user's code, as with python."""
    internal = {os.path.realpath(__file__), os.path.realpath(runpy.__file__)}
    while tb is not None and os.path.realpath(tb.tb_frame.f_code.co_filename) in internal:
        tb = tb.tb_next
    return tb


def _exception_event(exc: BaseException) -> dict[str, Any]:
    frames = traceback.extract_tb(exc.__traceback__)
    last = frames[-1] if frames else None
    return {
        "exception": type(exc).__qualname__, "message": str(exc)[:4000],
        "where": {"file": last.filename, "line": last.lineno, "function": last.name} if last else None,
    }


def _run(target_kind: str, target: str, args: list[str]) -> None:
    if target_kind == "module":
        sys.argv = [target, *args]  # runpy replaces argv[0] with the module's path, as `python -m` does
        sys.path[0] = os.getcwd()
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [target, *args]
        sys.path[0] = os.path.dirname(os.path.realpath(target))
        runpy.run_path(target, run_name="__main__")


def main(argv: list[str]) -> None:
    config = ChildConfig.from_json(argv[0])
    target_kind, target = argv[1].lstrip("-"), argv[2]
    args = argv[4:]  # argv[3] is the "--" separator
    recorder = Recorder(config)
    set_active(recorder)
    instrumentation = Instrumentation(recorder)
    instrumentation.install()
    recorder.emit(_process_facts())
    try:
        _run(target_kind, target, args)
    except MaxStepsReached:
        _finish(recorder, instrumentation, "max_steps")
        sys.exit(0)
    except SystemExit as exc:
        _finish(recorder, instrumentation, "exit", code=_exit_code(exc.code))
        raise
    except KeyboardInterrupt as exc:
        _finish(recorder, instrumentation, "interrupted")
        traceback.print_exception(type(exc), exc, _trim(exc.__traceback__))
        sys.stderr.flush()
        # Die of SIGINT, as python does, so the status seen from outside is the same.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException as exc:
        _finish(recorder, instrumentation, "exception", **_exception_event(exc))
        sys.excepthook(type(exc), exc, _trim(exc.__traceback__))
        sys.exit(1)
    else:
        _finish(recorder, instrumentation, "completed")


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def _finish(recorder: Recorder, instrumentation: Instrumentation, reason: str, **details: Any) -> None:
    try:
        instrumentation.uninstall()
        recorder.finish(reason, **details)
    except Exception as exc:  # gpudoctor must never change how the script ends
        print(f"gpudoctor: could not finish recording: {exc}", file=sys.stderr)


def _process_facts() -> dict[str, Any]:
    import multiprocessing
    import platform

    gil = getattr(sys, "_is_gil_enabled", None)
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {
        "kind": "process", "pid": os.getpid(), "python": platform.python_version(),
        "implementation": platform.python_implementation(), "executable": sys.executable,
        "gil_enabled": gil() if gil else True, "cpu_count": os.cpu_count(), "affinity": affinity,
        "start_method": multiprocessing.get_start_method(allow_none=True),
        "switch_interval_s": sys.getswitchinterval(),
    }
