"""What `gpudoctor profile` is asked to run, and how: the script or module, its arguments and the window."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpudoctor.collect.config import WindowConfig
from gpudoctor.launch.supervisor import EXIT_GRACE_S
from gpudoctor.remedy import Remedy


@dataclass
class ProfileRequest:
    script: str | None
    module: str | None
    args: list[str]
    out: Path | None = None
    window: WindowConfig = field(default_factory=WindowConfig)
    max_steps: int | None = None
    timeout_s: float | None = None
    exit_grace_s: float = EXIT_GRACE_S  # how long a process that is only exiting may take before it is stopped
    sample_interval_s: float = 0.1
    with_stack: bool = False
    progress: bool = True  # a status line on stderr while the script runs, when stderr is a terminal
    remedy: Remedy | None = None  # a try's fix, applied in the script's process (gpudoctor.collect.remedies)
    output_log: Path | None = None  # where the script's stdout and stderr go (None: gpudoctor's own)

    @property
    def target_name(self) -> str:
        return self.module or Path(self.script or "script").stem
