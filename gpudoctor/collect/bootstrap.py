"""The script's process: install the instrumentation, then run the script as `python SCRIPT ARGS` would.

Started by the launcher as `python -c <stub> CONFIG_JSON (--script PATH | --module NAME) -- ARGS...`. The stub
puts gpudoctor on sys.path only for its own import; the script sees sys.argv, sys.path[0], `__main__` and
its environment as under plain `python`.
"""

from __future__ import annotations

import builtins
import importlib.machinery
import io
import json
import os
import runpy
import signal
import sys
import traceback
import types
from pathlib import Path
from types import TracebackType

from gpudoctor.bundle import STOPPING
from gpudoctor.collect import follow
from gpudoctor.collect.config import ChildConfig
from gpudoctor.collect.recorder import MaxStepsReached
from gpudoctor.collect.session import (
    Session,
    exception_details,
    hold_ctrl_c,
    let_native_threads_settle,
    mark_exiting_at_exit,
    stop_helpers,
)

_INTERNAL_FILES = {os.path.realpath(__file__), os.path.realpath(runpy.__file__)}
_GPUDOCTOR = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep


def _is_internal(filename: str) -> bool:
    # runpy is frozen since Python 3.11: its frames are named "<frozen runpy>", not its file.
    return filename == "<frozen runpy>" or os.path.realpath(filename) in _INTERNAL_FILES


def _trim(tb: TracebackType | None) -> TracebackType | None:
    """Drop the bootstrap's and runpy's frames so the traceback starts in the user's code, as with python."""
    while tb is not None and _is_internal(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return tb


def _without_gpudoctor(tb: TracebackType | None) -> TracebackType | None:
    """The traceback without any of gpudoctor's frames (its wrappers around the script's calls): what python
    would print for the same interrupt."""
    frames = []
    while tb is not None:
        if not os.path.realpath(tb.tb_frame.f_code.co_filename).startswith(_GPUDOCTOR):
            frames.append(tb)
        tb = tb.tb_next
    kept = None
    for frame in reversed(frames):
        kept = types.TracebackType(kept, frame.tb_frame, frame.tb_lasti, frame.tb_lineno)
    return kept


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
    mark_exiting_at_exit(Path(config.run_dir))  # first: atexit runs handlers last-registered first
    follow.end_stopped_group_at_exit()  # then, before the script's handlers, so that it runs after them
    session = Session(config)
    session.finish_on_sigterm()
    follow.in_root_process()
    try:
        _run(target_kind, target, args)
    except MaxStepsReached:
        session.finish("max_steps")
        stop_helpers()
        sys.exit(0)
    except SystemExit as exc:
        session.finish("exit", code=_exit_code(exc.code))
        let_native_threads_settle()
        raise
    except KeyboardInterrupt as exc:
        # A second Ctrl-C must not break into gpudoctor's frames as the process ends. One that arrived just
        # before is still pending in Python: it raises as hold_ctrl_c is entered, or as the handler changes
        # (which runs the old one first); it is let go and the handler set again. The loop is here, not in a
        # function of its own, because entering that function would raise it outside the try.
        while True:
            try:
                hold_ctrl_c()
                break
            except KeyboardInterrupt:
                continue
        session.finish("interrupted")
        if not (Path(config.run_dir) / STOPPING).is_file():  # Ctrl-C, not gpudoctor's own stop at --timeout
            traceback.print_exception(type(exc), exc, _without_gpudoctor(_trim(exc.__traceback__)))
        sys.stderr.flush()
        # Die of SIGINT, as python does, so the status seen from outside is the same.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException as exc:  # noqa: BLE001 - whatever the script raised is recorded, then reported as python would
        session.finish("exception", exception=exception_details(exc))
        exc.__traceback__ = _trim(exc.__traceback__)  # the default excepthook prints the exception's own
        sys.excepthook(type(exc), exc, exc.__traceback__)
        sys.exit(1)
    else:
        session.finish("completed")
        let_native_threads_settle()


def main_when_told(fd: int) -> None:
    """Started ahead of time (gpudoctor.launch.prestart): wait for what to run, then run it as main() does.

    The message is JSON: the arguments main() takes, and the environment the script's process is to have (what
    changed from the one this process was started with). Nothing comes when gpudoctor runs no script after all:
    then this process ends at once, quietly."""
    try:
        with os.fdopen(fd, "rb") as told:
            message = told.read()
    except KeyboardInterrupt:  # Ctrl-C while gpudoctor read its command line: nothing ran here
        os._exit(130)
    if not message:
        os._exit(0)
    order = json.loads(message)
    for name in order["unset"]:
        os.environ.pop(name, None)
    os.environ.update(order["env"])
    main(order["argv"])


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    return code if isinstance(code, int) else 1
