"""How the script ended, in gpudoctor's words: the ending's name, the exit status to pass on, one sentence."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

from gpudoctor.bundle.events import EndEvent
from gpudoctor.bundle.records import first_line
from gpudoctor.errors import EXIT_TIMEOUT
from gpudoctor.launch.supervisor import Supervisor, exit_status_of

if TYPE_CHECKING:
    from gpudoctor.launch.request import ProfileRequest


def describe_ending(request: ProfileRequest, returncode: int, end: EndEvent | None,
                    supervisor: Supervisor) -> tuple[str, int, str | None]:
    name = request.module or request.script
    status = exit_status_of(returncode)
    if supervisor.timed_out:
        message = f"{name} was still running after --timeout {request.timeout_s:g} s, so gpudoctor stopped it."
        return "timeout", EXIT_TIMEOUT, message
    if supervisor.stuck_at_exit:
        return _stuck_at_exit(name, end, supervisor.exit_grace_s)
    if end is not None and end.reason == "max_steps":
        return "max_steps", 0, f"stopped {name} after --max-steps {request.max_steps}, as asked."
    if returncode < 0:
        sig = signal.Signals(-returncode)
        if sig == signal.SIGINT:
            return "interrupted", status, f"{name} was interrupted (Ctrl-C)."
        return "signal", status, f"{name} was killed by {sig.name} (exit status {status})."
    if end is not None and end.reason == "exception":
        line = first_line(end.message)
        return "exception", status, f"{name} raised {end.exception}" + (f": {line}" if line else ".")
    if status != 0:
        return "exit", status, f"{name} exited with status {status}."
    return "completed", 0, None


def _stuck_at_exit(name: str | None, end: EndEvent | None, grace_s: float) -> tuple[str, int, str | None]:
    """The script had finished and its process did not exit: the ending and status are the script's own."""
    message = (f"{name} had finished, but its process was still exiting {grace_s:g} s after its atexit handlers "
               "ran, so gpudoctor stopped it; the report covers the whole run.")
    if end is None or end.reason in ("completed", "exit"):
        status = (end.code or 0) if end is not None else 0
        return ("exit" if status else "completed"), status, message
    if end.reason == "max_steps":
        return "max_steps", 0, message
    if end.reason == "interrupted":
        return "interrupted", 128 + signal.SIGINT, message
    return "exception", 1, message
