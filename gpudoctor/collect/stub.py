"""The command line that starts the script's process."""

from __future__ import annotations

import os
import sys

import gpudoctor
from gpudoctor.collect.config import ChildConfig

# Runs under `python -c`: sys.path[0] is "" there; the bootstrap sets it as python would for the script.
_STUB = (
    "import sys; sys.path.insert(1, {root!r}); import gpudoctor.collect.bootstrap as b; "
    "sys.path.remove({root!r}); b.main(sys.argv[1:])"
)


def child_command(config: ChildConfig, script: str | None, module: str | None, args: list[str]) -> list[str]:
    root = os.path.dirname(os.path.dirname(os.path.realpath(gpudoctor.__file__)))
    target = ["--module", module] if module else ["--script", script or ""]
    return [sys.executable, "-c", _STUB.format(root=root), config.to_json(), *target, "--", *args]
