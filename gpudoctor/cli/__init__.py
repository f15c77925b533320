"""The command line: `gpudoctor profile`, `gpudoctor analyze`, `gpudoctor diff`, `gpudoctor rules`.

Each command is a few calls into the library. GpudoctorError is caught once, in `main`, and printed as
its one-sentence message with its exit status. `main` registers the commands its command line can reach;
another caller of `app` calls `register_commands()` first.
"""

from __future__ import annotations

from gpudoctor.cli.main import app, main, register_commands

__all__ = ["app", "main", "register_commands"]
