"""The command lines that start the script's process: at once, or ahead of time, waiting to be told what to run."""

from __future__ import annotations

import os
import sys

from gpudoctor.collect.config import ChildConfig

# The folder that holds the gpudoctor package (this file is gpudoctor/collect/stub.py).
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
# Runs under `python -c`: sys.path[0] is "" there; the bootstrap sets it as python would for the script.
_STUB = (
    "import sys; sys.path.insert(1, {root!r}); import gpudoctor.collect.bootstrap as b; "
    "sys.path.remove({root!r}); b.main(sys.argv[1:])"
)
# The same interpreter started ahead of time: it imports the bootstrap, then reads what to run from `fd`.
_WAITING_STUB = (
    "import sys; sys.path.insert(1, {root!r}); import gpudoctor.collect.bootstrap as b; "
    "sys.path.remove({root!r}); b.main_when_told({fd})"
)


def child_arguments(config: ChildConfig, script: str | None, module: str | None, args: list[str]) -> list[str]:
    """What the bootstrap's main() takes: the config, the target and the script's own arguments."""
    target = ["--module", module] if module else ["--script", script or ""]
    return [config.to_json(), *target, "--", *args]


def child_command(arguments: list[str]) -> list[str]:
    return [sys.executable, "-c", _STUB.format(root=_ROOT), *arguments]


def waiting_command(fd: int) -> list[str]:
    return [sys.executable, "-c", _WAITING_STUB.format(root=_ROOT, fd=fd)]
