"""The one exception tree of gpudoctor, and the exit statuses it maps to.

Every error a user can cause is raised as a GpudoctorError subclass with a message that is one plain
sentence; the CLI catches them once and prints that sentence.
"""

from __future__ import annotations

# Exit statuses of gpudoctor itself. A profiled script's own status always passes through unchanged
# (a signal N as 128 + N); these are used only when gpudoctor is the one that stops.
EXIT_OK = 0
EXIT_SCRIPT_NOT_FOUND = 2  # what `python missing.py` exits with
EXIT_FINDINGS = 10  # --fail-on threshold met by a finding
EXIT_BAD_BUNDLE = 65  # sysexits EX_DATAERR: a bundle or trace that cannot be read
EXIT_NO_INPUT = 66  # sysexits EX_NOINPUT: analyze was given a path that does not exist
EXIT_INTERNAL = 70  # sysexits EX_SOFTWARE: a bug in gpudoctor
EXIT_CANT_CREATE = 73  # sysexits EX_CANTCREAT: the output directory cannot be written
EXIT_NOT_CONFIRMED = 77  # sysexits EX_NOPERM: `gpudoctor try` ran nothing: not confirmed, or refused
EXIT_TIMEOUT = 124  # as timeout(1): the script ran past --timeout and was stopped


class GpudoctorError(Exception):
    """An error with a message meant for the user and the exit status it implies."""

    exit_status = EXIT_INTERNAL


class ScriptNotFoundError(GpudoctorError):
    exit_status = EXIT_SCRIPT_NOT_FOUND


class ScriptNotPythonError(GpudoctorError):
    exit_status = 1  # what `python broken.py` exits with on a SyntaxError


class OutputNotWritableError(GpudoctorError):
    exit_status = EXIT_CANT_CREATE


class OutputInUseError(OutputNotWritableError):
    """--out is the run directory another `gpudoctor profile` records into now."""


class InputNotFoundError(GpudoctorError):
    exit_status = EXIT_NO_INPUT


class BundleError(GpudoctorError):
    """A run bundle or trace that is missing a part, has a schema we do not know, or is truncated."""

    exit_status = EXIT_BAD_BUNDLE


class TraceNotJsonError(BundleError):
    """A profiler trace that is not JSON, even repaired (cut short, not gzip, written badly): a run bundle's
    report is made without it, from its events and samples; a trace analysed alone cannot be."""


class TryNotConfirmedError(GpudoctorError):
    """`gpudoctor try` ran nothing: its user did not confirm the command (no terminal and no --yes, an answer other
    than yes, or --yes for a run directory made elsewhere)."""

    exit_status = EXIT_NOT_CONFIRMED


class TryRefusedError(TryNotConfirmedError):
    """`gpudoctor try` refuses a run directory's command whatever the user says: its code lies inside the run
    directory, or its command was changed since gpudoctor recorded it."""


class RuleLoadError(GpudoctorError):
    """A rule file or rule definition that cannot be used; the message names file, rule and fix."""

    exit_status = 2
